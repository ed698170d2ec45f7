"""compose.yaml and what deploy/compose gives it: the runtime example, the init script,
pg_hba.conf, prometheus.yml and the README's recipe for the secrets.

No container engine runs here. So the file is validated against the Compose specification's
own schema (vendored in deploy/compose/compose-spec.json), every value that two files must
agree on is compared, and what can run outside a container runs: ``coordinatorctl check``
on the runtime example, the README's commands that make the secrets, a TLS handshake with
the certificates they make, and the ``prepare`` service's script (as root, confined to the
capabilities compose.yaml grants it).
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator  # type: ignore[import-untyped]

from core.db.connect import client_ssl_context, parse_database_url
from core.secrets import SecretResolver
from core.workflow.package import build_package
from tests.deploy.test_install import read_dockerfile
from tests.unit.test_docs import broken_links

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
HERE = ROOT / "deploy" / "compose"
RUNTIME_FILE = HERE / "runtime.yaml"
README = HERE / "README.md"
INIT_SCRIPT = HERE / "initdb" / "10-coordinator.sh"
PG_HBA = HERE / "pg_hba.conf"
PROMETHEUS = HERE / "prometheus.yml"
SCHEMA = HERE / "compose-spec.json"
# The coordinatorctl of the environment running the tests (.venv/bin/coordinatorctl).
CTL = Path(sys.executable).with_name("coordinatorctl")

COMPONENTS = ("auditd", "recovery", "admission", "dispatcher", "gateway")
WITH_GRPC = ("admission", "recovery", "auditd")
COORDINATOR_SERVICES = (*COMPONENTS, "apply")
RUNTIME_IN_CONTAINER = "/etc/registry-coordinator/runtime.yaml"
# How the README runs the image's Python for the connection keys; the test runs the same
# commands with this environment's Python, which has the same packages.
IMAGE_PYTHON = (
    "docker compose run --rm -T --no-deps --entrypoint /opt/registry-coordinator/bin/python apply"
)


def load_yaml(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text("utf-8"))
    return document


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE_FILE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"]
    return found


@pytest.fixture(scope="module")
def runtime() -> dict[str, Any]:
    return load_yaml(RUNTIME_FILE)


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text("utf-8")


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def fixed_address(service: dict[str, Any]) -> str | None:
    networks = service.get("networks", [])
    if isinstance(networks, list):
        return None
    address: str | None = (networks.get("coordinator") or {}).get("ipv4_address")
    return address


def outbound_address(service: dict[str, Any]) -> str | None:
    networks = service.get("networks", [])
    if isinstance(networks, list):
        return None
    address: str | None = (networks.get("outbound") or {}).get("ipv4_address")
    return address


def subnet_and_range(compose: dict[str, Any], network: str = "coordinator") -> tuple[Any, Any]:
    (config,) = compose["networks"][network]["ipam"]["config"]
    return ipaddress.ip_network(config["subnet"]), ipaddress.ip_network(config["ip_range"])


def postgres_probe(service: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The mark file and the pg_isready options of postgres's health check."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and len(test) == 2, test
    mark = re.search(r"^test -f (\S+)\s", test[1])
    probe = re.search(r"pg_isready((?: --[a-z]+=\S+)+)\s*$", test[1])
    assert mark is not None and probe is not None, test[1]
    options = dict(word.removeprefix("--").split("=") for word in probe[1].split())
    return mark[1], options


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only) for a service's short-syntax volumes."""
    found: dict[str, tuple[str, bool]] = {}
    for entry in service.get("volumes", []):
        source, target, *options = entry.split(":")
        found[target] = (source, "ro" in options)
    return found


def prepare_script(services: dict[str, Any]) -> str:
    """The shell script of the prepare service, as the container's shell receives it
    (Compose turns each ``$$`` into ``$``)."""
    entrypoint = services["prepare"]["entrypoint"]
    assert entrypoint[:2] == ["/bin/sh", "-c"] and len(entrypoint) == 3
    script: str = entrypoint[2]
    return script.replace("$$", "$")


def secret_references(document: Any, path: str = "") -> dict[str, str]:
    """Key path -> file name of every ``secret:file/`` reference in a runtime document."""
    found: dict[str, str] = {}
    if isinstance(document, dict):
        for key, value in document.items():
            found.update(secret_references(value, f"{path}.{key}" if path else key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found.update(secret_references(value, f"{path}[{index}]"))
    elif isinstance(document, str) and document.startswith("secret:file/"):
        found[path] = document.removeprefix("secret:file/")
    return found


def readme_section(text: str, heading: str) -> str:
    """From ``heading`` to the next chapter's heading."""
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def health_url(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "/opt/registry-coordinator/bin/python", "-c"], test
    found = re.findall(r"'(http://[^']+)'", test[3])
    assert len(found) == 1, test[3]
    url: str = found[0]
    return url


# -- 1. the Compose specification --------------------------------------------------------


@pytest.fixture(scope="module")
def validator() -> Draft7Validator:
    schema = json.loads(SCHEMA.read_text("utf-8"))
    # The schema names its draft without the trailing '#', which jsonschema's lookup by
    # $schema does not recognise; the draft is chosen here from what it declares.
    assert re.fullmatch(r"https?://json-schema\.org/draft-07/schema#?", schema["$schema"])
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def test_the_vendored_schema_is_the_file_schema_md_names() -> None:
    data = SCHEMA.read_bytes()
    # Git's blob name for the content: what SCHEMA.md records and `git hash-object` prints.
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    notes = (HERE / "SCHEMA.md").read_text("utf-8")
    assert f"`{blob}`" in notes, "compose-spec.json differs from the copy SCHEMA.md records"
    assert "Apache License 2.0" in notes


def test_compose_yaml_is_valid_under_the_compose_schema(
    validator: Draft7Validator, compose: dict[str, Any]
) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


def _ports_as_a_number(document: dict[str, Any]) -> None:
    document["services"]["gateway"]["ports"] = 8108


def _unknown_top_level_key(document: dict[str, Any]) -> None:
    document["service"] = {}


def _condition_misspelt(document: dict[str, Any]) -> None:
    document["services"]["apply"]["depends_on"]["postgres"]["condition"] = "service_healthly"


def _healthcheck_key_misspelt(document: dict[str, Any]) -> None:
    document["services"]["gateway"]["healthcheck"]["intervall"] = "5s"


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (_ports_as_a_number, ["services", "gateway", "ports"]),
        (_unknown_top_level_key, []),
        (_condition_misspelt, ["services", "apply", "depends_on"]),
        (_healthcheck_key_misspelt, ["services", "gateway", "healthcheck"]),
    ],
    ids=["ports-number", "unknown-top-level-key", "condition-misspelt", "healthcheck-key"],
)
def test_the_schema_refuses_a_broken_copy(
    validator: Draft7Validator, compose: dict[str, Any], edit: Any, where: list[str]
) -> None:
    broken = copy.deepcopy(compose)
    edit(broken)
    paths = [list(error.absolute_path) for error in validator.iter_errors(broken)]
    assert paths, "the broken copy passed"
    assert any(path[: len(where)] == where for path in paths), paths


def _from_top(service: dict[str, Any]) -> dict[str, Any]:
    """A service of recovery-only.yaml with its paths as compose.yaml (one folder up) names
    them."""
    moved = dict(service)
    moved["volumes"] = [
        "./deploy/compose/" + v.removeprefix("./") if v.startswith("./") else v
        for v in service.get("volumes", [])
    ]
    return moved


def test_the_recovery_only_file_holds_nothing_that_admits_or_dispatches(
    validator: Draft7Validator, compose: dict[str, Any], services: dict[str, Any], readme: str
) -> None:
    maintenance = load_yaml(HERE / "recovery-only.yaml")
    assert [
        f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(maintenance)
    ] == []
    assert maintenance["name"] == compose["name"]
    found = maintenance["services"]
    # CONTRACT §2.1: --recovery-only serves gateway, recovery and auditd.
    assert set(found) == {
        "postgres",
        *(f"maintenance-{n}" for n in ("auditd", "recovery", "gateway")),
    }
    for name in ("auditd", "recovery", "gateway"):
        mine, theirs = _from_top(found[f"maintenance-{name}"]), services[name]
        assert mine["command"] == [*theirs["command"], "--recovery-only"], name
        same = {
            "image",
            "user",
            "read_only",
            "tmpfs",
            "cap_drop",
            "security_opt",
            "volumes",
            "networks",
            "healthcheck",
            "stop_grace_period",
            "restart",
            "ports",
        }
        for key in same:
            assert mine.get(key) == theirs.get(key), (name, key)
        for dependency in mine["depends_on"]:
            assert dependency == "postgres" or dependency.startswith("maintenance-"), dependency
    postgres = _from_top(found["postgres"])
    for key in set(postgres) | set(services["postgres"]):
        if key != "depends_on":
            # The image is the operator's choice in each file, but the same one.
            assert postgres.get(key) == services["postgres"].get(key), key
    assert "depends_on" not in postgres
    for network, definition in maintenance["networks"].items():
        assert definition == compose["networks"][network], network
    assert set(maintenance["volumes"]) < set(compose["volumes"])
    assert "apply-secrets" not in maintenance["volumes"]
    assert "docker compose -f deploy/compose/recovery-only.yaml up -d\n" in readme


def test_compose_interpolates_nothing() -> None:
    # Compose replaces $NAME and ${NAME} from the environment, silently empty when unset:
    # every dollar sign in the file is meant for a shell, so each must be written $$.
    for run in re.findall(r"\$+", COMPOSE_FILE.read_text("utf-8")):
        assert len(run) % 2 == 0, f"a single $ in compose.yaml: {run}"


# -- 2. consistency -------------------------------------------------------------------------


def test_fixed_addresses_are_unique_in_the_subnet_and_outside_the_dynamic_range(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    subnet, dynamic = subnet_and_range(compose)
    assert subnet.is_private and dynamic.subnet_of(subnet)
    fixed = {name: a for name, s in services.items() if (a := fixed_address(s)) is not None}
    assert set(fixed) >= {"postgres", "auditd", "recovery", "admission", "gateway"}
    addresses = [ipaddress.ip_address(address) for address in fixed.values()]
    assert len(set(addresses)) == len(addresses)
    for address in addresses:
        assert address in subnet and address not in dynamic, address
        assert address not in (subnet.network_address, subnet.broadcast_address)
        assert address != next(subnet.hosts()), "the network's gateway takes the first host"


def test_the_dispatcher_is_free_to_scale(services: dict[str, Any], runtime: dict[str, Any]) -> None:
    dispatcher = services["dispatcher"]
    assert fixed_address(dispatcher) is None
    assert not {"container_name", "ports", "hostname"} & set(dispatcher)
    assert "dispatcher" not in runtime["deployment"]["internal"]["addresses"]


def test_the_runtime_names_the_services_fixed_addresses(
    services: dict[str, Any], runtime: dict[str, Any]
) -> None:
    deployment = runtime["deployment"]
    internal = deployment["internal"]
    assert set(internal["addresses"]) == set(WITH_GRPC)
    for component, address in internal["addresses"].items():
        assert host_port(address)[0] == fixed_address(services[component]), component
    # The API on the gateway's outbound address (where the published port arrives), its
    # metrics on the internal network.
    assert host_port(deployment["listener"]["bind"])[0] == outbound_address(services["gateway"])
    assert host_port(deployment["metricsListener"]["bind"])[0] == fixed_address(services["gateway"])


def test_the_readmes_table_of_what_runs_matches_compose_and_the_runtime_file(
    compose: dict[str, Any], services: dict[str, Any], runtime: dict[str, Any], readme: str
) -> None:
    rows = dict(
        re.findall(r"^\| `([a-z]+)` \| ([^|]+) \|", readme_section(readme, "## What runs"), re.M)
    )
    assert set(rows) == set(services)
    for name, service in services.items():
        address = fixed_address(service)
        if address is None:
            assert not rows[name][0].isdigit(), name
        else:
            assert rows[name].strip().split(",")[0] == address, name
    internal = runtime["deployment"]["internal"]
    for component, address in internal["addresses"].items():
        row = re.search(rf"^\| `{component}` \|.*\| gRPC (\d+), metrics (\d+) \|$", readme, re.M)
        assert row is not None, component
        assert (int(row[1]), int(row[2])) == (host_port(address)[1], internal["metricsPort"])
    for network in ("coordinator", "outbound"):
        subnet, dynamic = subnet_and_range(compose, network)
        assert f"`{network}` ({subnet})" in readme and str(dynamic) in readme


def test_ports_agree_with_health_checks_prometheus_and_publishing(
    services: dict[str, Any], runtime: dict[str, Any]
) -> None:
    deployment = runtime["deployment"]
    metrics_port = deployment["internal"]["metricsPort"]
    listener = deployment["listener"]["bind"]
    assert services["gateway"]["ports"] == [
        f"127.0.0.1:{host_port(listener)[1]}:{host_port(listener)[1]}"
    ]
    assert health_url(services["gateway"]) == f"http://{listener}/ready"
    for component in WITH_GRPC:
        host = fixed_address(services[component])
        assert health_url(services[component]) == f"http://{host}:{metrics_port}/metrics"
    # The dispatcher asks its own container address (it has no fixed one).
    assert health_url(services["dispatcher"]) == f"http://{{host}}:{metrics_port}/metrics"
    assert (
        "socket.gethostbyname(socket.gethostname())"
        in services["dispatcher"]["healthcheck"]["test"][3]
    )

    scrape = {job["job_name"]: job for job in load_yaml(PROMETHEUS)["scrape_configs"]}
    assert set(scrape) == {"coordinator", "coordinator-dispatcher"}
    assert scrape["coordinator"]["static_configs"] == [
        {"targets": [deployment["metricsListener"]["bind"]]}
    ]
    (dns,) = scrape["coordinator-dispatcher"]["dns_sd_configs"]
    assert (dns["names"], dns["type"], dns["port"]) == (["dispatcher"], "A", metrics_port)
    prometheus = mounts(services["prometheus"])
    assert prometheus["/etc/prometheus/prometheus.yml"] == ("./deploy/compose/prometheus.yml", True)
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]


def test_every_path_of_the_runtime_file_is_mounted_where_it_is_needed(
    services: dict[str, Any], runtime: dict[str, Any]
) -> None:
    secret_root = runtime["secretProviders"]["file"]["root"]
    audit_folder = str(Path(runtime["deployment"]["auditFile"]).parent)
    package_roots = [Path(p["root"]) for p in runtime["deployment"]["packages"]]
    for name in COORDINATOR_SERVICES:
        mounted = mounts(services[name])
        assert mounted[RUNTIME_IN_CONTAINER] == ("./deploy/compose/runtime.yaml", True), name
        secrets_volume = "apply-secrets" if name == "apply" else "coordinator-secrets"
        assert mounted[secret_root] == (secrets_volume, True), name
        for root in package_roots:
            holders = [t for t in mounted if root.is_relative_to(t) and Path(t) != Path("/")]
            assert holders, f"{name} does not mount {root}"
            assert all(mounted[t] == ("./deploy/compose/packages", True) for t in holders)
        if name == "apply":
            assert services[name]["command"] == ["--runtime-config", RUNTIME_IN_CONTAINER, "apply"]
        else:
            assert services[name]["command"] == [
                "--runtime-config",
                RUNTIME_IN_CONTAINER,
                "--component",
                name,
            ]
    # The audit journal's volume: auditd's alone, writable, at the audit file's folder.
    with_audit = [n for n, s in services.items() for m in mounts(s).values() if m[0] == "audit"]
    assert with_audit == ["auditd"]
    assert mounts(services["auditd"])[audit_folder] == ("audit", False)


def test_the_coordinator_containers_run_as_the_images_account_confined(
    services: dict[str, Any],
) -> None:
    stages = read_dockerfile((ROOT / "Dockerfile").read_text("utf-8"))
    defaults = dict(arguments.partition("=")[::2] for arguments in stages[-1].all("ARG"))
    owner = f"{defaults['COORDINATOR_UID']}:{defaults['COORDINATOR_GID']}"
    (entrypoint,) = stages[-1].all("ENTRYPOINT")
    bin_folder = Path(json.loads(entrypoint)[0]).parent
    for name in COORDINATOR_SERVICES:
        service = services[name]
        assert service["user"] == owner, name
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert service["image"] == services["prepare"]["image"], name
    for name in COMPONENTS:
        assert services[name]["restart"] == "unless-stopped"
        assert services[name]["stop_grace_period"] == "15s"
        assert services[name]["healthcheck"]["test"][1] == str(bin_folder / "python")
    assert services["apply"]["entrypoint"] == [str(bin_folder / "coordinatorctl")]
    assert services["apply"]["restart"] == "no"

    script = prepare_script(services)
    copies = re.findall(r"^copy (\S+) (\S+) (\S+)(?: (\S+))?$", script, re.MULTILINE)
    assert {target: who for _, target, who, _ in copies} == {
        "/prepare/out/secrets": owner,
        "/prepare/out/apply-secrets": owner,
        "/prepare/out/postgres": "999:999",
    }


def test_start_order_prepare_then_postgres_then_apply_then_the_components(
    services: dict[str, Any],
) -> None:
    for name, service in services.items():
        if name not in ("prepare", "apply"):
            condition = service["depends_on"]["prepare"]["condition"]
            assert condition == "service_completed_successfully", name
    assert services["prepare"]["restart"] == "no" and "depends_on" not in services["prepare"]
    # apply waits for prepare through postgres, so a one-off `run` of apply needs no copy.
    assert services["apply"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in COMPONENTS:
        assert services[name]["depends_on"]["apply"] == {
            "condition": "service_completed_successfully"
        }
    for name in WITH_GRPC:
        assert services["gateway"]["depends_on"][name] == {"condition": "service_healthy"}
    # Healthy only once the init script finished (its last line writes the mark) and the
    # real server answers on TCP.
    mark, probe = postgres_probe(services["postgres"])
    assert (probe["host"], probe["port"]) == ("127.0.0.1", "5432")
    text = INIT_SCRIPT.read_text("utf-8")
    last = [line for line in text.splitlines() if line.strip() and not line.startswith("#")][-1]
    assert last == f'touch "$PGDATA/{Path(mark).name}" || exit 1'
    assert services["postgres"]["environment"].get("PGDATA", "/var/lib/postgresql/data") == str(
        Path(mark).parent
    )


def test_every_secret_is_made_by_the_readme_and_copied_by_prepare(
    services: dict[str, Any], runtime: dict[str, Any], readme: str
) -> None:
    names = set(secret_references(runtime).values())
    assert len(names) >= 10
    for name in sorted(names):
        assert f"`secrets/{name}`" in readme, f"the README's list of files lacks {name}"
    mounted = mounts(services["prepare"])
    assert mounted["/prepare/in/secrets"] == ("./deploy/compose/secrets", True)
    assert mounted["/prepare/in/postgres"] == ("./deploy/compose/postgres", True)
    # Only apply's copy holds the migration URL.
    script = prepare_script(services)
    kept_back = re.findall(
        r"^copy /prepare/in/secrets /prepare/out/secrets \S+ (\S+)$", script, re.M
    )
    assert kept_back == [runtime["database"]["migrationUrlRef"].removeprefix("secret:file/")]
    assert mounted["/prepare/out/secrets"][0] == "coordinator-secrets"
    assert mounted["/prepare/out/apply-secrets"][0] == "apply-secrets"
    assert mounted["/prepare/out/postgres"][0] == "postgres-private"


def test_postgres_reads_exactly_what_prepare_insists_on(services: dict[str, Any]) -> None:
    postgres = services["postgres"]
    assert re.fullmatch(r"postgres:17\.\d+(-[a-z0-9.]+)?", postgres["image"])
    private = next(t for t, (source, _) in mounts(postgres).items() if source == "postgres-private")
    settings = dict(
        word.partition("=")[::2] for word in postgres["command"] if "=" in word and word[0] != "-"
    )
    assert settings["ssl"] == "on"
    assert "port" not in settings
    used = {
        Path(settings["ssl_cert_file"]),
        Path(settings["ssl_key_file"]),
        Path(postgres["environment"]["POSTGRES_PASSWORD_FILE"]),
        *(Path(p) for p in re.findall(r"cat (\S+)`", INIT_SCRIPT.read_text("utf-8"))),
    }
    assert {path.parent for path in used} == {Path(private)}
    required = re.search(r"^for name in (.+); do$", prepare_script(services), re.M)
    assert required is not None
    assert set(required[1].split()) == {path.name for path in used}
    assert mounts(postgres)[settings["hba_file"]] == ("./deploy/compose/pg_hba.conf", True)
    assert mounts(postgres)["/docker-entrypoint-initdb.d"] == ("./deploy/compose/initdb", True)
    assert INIT_SCRIPT.stat().st_mode & 0o555 == 0o555, "the image sources it unless executable"


def _roles() -> dict[str, set[str]]:
    text = INIT_SCRIPT.read_text("utf-8")
    return {
        name: set(attributes.split())
        for name, attributes in re.findall(r"CREATE ROLE (\w+) ([A-Z\s]+?)\s+PASSWORD", text)
    }


def test_the_init_script_creates_the_roles_the_contract_asks_for(
    compose: dict[str, Any], runtime: dict[str, Any]
) -> None:
    text = INIT_SCRIPT.read_text("utf-8")
    roles = _roles()
    runtime_role = runtime["deployment"]["runtimeRole"]
    (migrator,) = set(roles) - {runtime_role}
    assert roles[runtime_role] == {
        "LOGIN",
        "NOSUPERUSER",
        "NOBYPASSRLS",
        "NOCREATEDB",
        "NOCREATEROLE",
        "NOREPLICATION",
        "NOINHERIT",
    }
    assert roles[migrator] == {
        "LOGIN",
        "NOSUPERUSER",
        "NOBYPASSRLS",
        "NOCREATEDB",
        "CREATEROLE",
        "NOREPLICATION",
    }
    (database,) = re.findall(rf"CREATE DATABASE (\w+) OWNER {migrator};", text)
    assert f"REVOKE ALL ON DATABASE {database} FROM PUBLIC;" in text
    assert f"GRANT CONNECT ON DATABASE {database} TO {runtime_role};" in text

    # pg_hba.conf: the two roles to that database over TLS from the subnet; the superuser
    # on the socket; the health check's probe, by a role that does not exist.
    subnet, _ = subnet_and_range(compose)
    rules = [
        line.split()
        for line in PG_HBA.read_text("utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    _, probe = postgres_probe(compose["services"]["postgres"])
    assert sorted(rules) == sorted(
        [
            ["local", "all", "postgres", "peer"],
            *(["hostssl", database, role, str(subnet), "scram-sha-256"] for role in roles),
            ["hostssl", probe["dbname"], probe["username"], f"{probe['host']}/32", "scram-sha-256"],
        ]
    )
    assert probe["username"] not in roles and probe["username"] != "postgres"


def test_the_readme_urls_name_the_postgres_service_and_the_init_scripts_roles(
    services: dict[str, Any], runtime: dict[str, Any], readme: str
) -> None:
    found = re.findall(
        r"postgresql://(\w+):[^@\s]*@([\w.-]+):(\d+)/(\w+)\?sslmode=([\w-]+)", readme
    )
    assert len(found) == 2
    database = re.findall(r"CREATE DATABASE (\w+)", INIT_SCRIPT.read_text("utf-8"))
    assert {user for user, *_ in found} == set(_roles())
    for _, host, port, name, sslmode in found:
        assert host in services and host == "postgres"
        assert int(port) == 5432 and [name] == database
        assert sslmode in ("verify-full", "require")
    assert "trustedRootCertificateRef" in runtime["database"]


def test_the_readme_certificate_names_the_internal_addresses(
    runtime: dict[str, Any], readme: str
) -> None:
    addresses = runtime["deployment"]["internal"]["addresses"].values()
    (names,) = re.findall(r"subjectAltName = (IP:[^']+)'", readme)
    assert sorted(names.split(", ")) == sorted(f"IP:{host_port(a)[0]}" for a in addresses)
    assert "subjectAltName = DNS:postgres" in readme


def test_only_loopback_ports_are_published(services: dict[str, Any]) -> None:
    published = {name: s["ports"] for name, s in services.items() if "ports" in s}
    assert published == {
        "gateway": ["127.0.0.1:8108:8108"],
        "prometheus": ["127.0.0.1:9090:9090"],
    }
    for name, service in services.items():
        assert service.get("network_mode") in (None, "none"), name
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", services["prometheus"]["image"])


def test_the_readme_links_resolve() -> None:
    assert broken_links(README) == []


# -- 3. coordinatorctl check on the runtime example ------------------------------------------


def test_the_example_pins_the_package_examples_approval_notice_builds(
    runtime: dict[str, Any], tmp_path: Path
) -> None:
    built = build_package(ROOT / "examples" / "approval-notice", tmp_path)
    (entry,) = runtime["deployment"]["packages"]
    assert entry["expectedDigest"] == built.digest
    assert Path(entry["root"]).name == built.path.name


def test_coordinatorctl_check_passes_on_the_runtime_example(
    runtime: dict[str, Any], tmp_path: Path
) -> None:
    # Only the package list changes: the packages live here, not under /srv.
    built = build_package(ROOT / "examples" / "approval-notice", tmp_path / "packages")
    document = copy.deepcopy(runtime)
    document["deployment"]["packages"] = [{"root": str(built.path), "expectedDigest": built.digest}]
    copied = tmp_path / "runtime.yaml"
    copied.write_text(yaml.safe_dump(document, sort_keys=False), "utf-8")
    result = subprocess.run(
        [
            str(CTL),
            *("--runtime-config", str(copied), "--output", "json", "check"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    checked = json.loads(result.stdout)
    assert checked["status"] == "valid" and checked["namespace"] == runtime["namespace"]


# -- the README's secrets, made for real --------------------------------------------------


def readme_secret_commands(text: str) -> str:
    """The shell blocks of the README's chapter on secrets, as one script."""
    blocks = re.findall(
        r"^```sh\n(.*?)^```$", readme_section(text, "## 3. Make the secrets"), re.S | re.M
    )
    script = "\n".join(blocks).replace(IMAGE_PYTHON, shlex.quote(sys.executable))
    assert "docker" not in script, "a docker command the test cannot run"
    return script


@pytest.fixture(scope="module")
def made(readme: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """deploy/compose of a checkout after the README's chapter 3: its secrets and postgres."""
    top = tmp_path_factory.mktemp("checkout")
    (top / "deploy" / "compose").mkdir(parents=True)
    assert shutil.which("openssl"), "openssl makes the README's keys and certificates"
    result = subprocess.run(
        ["/bin/sh", "-eu", "-c", readme_secret_commands(readme)],
        cwd="/",  # the commands find their folder by $CHECKOUT, from anywhere
        env={"PATH": os.environ["PATH"], "HOME": str(top), "LANG": "C.UTF-8", "CHECKOUT": str(top)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    yield top / "deploy" / "compose"
    shutil.rmtree(top, ignore_errors=True)


_KEYS = ("deployment.auditKeyRef", "deployment.admissionKeyRef")


def read_every_secret(runtime: dict[str, Any], resolver: SecretResolver, skip: str = "") -> None:
    """Read each reference of the runtime file as the coordinator reads it."""
    for path, name in secret_references(runtime).items():
        if name == skip:
            continue
        reference = f"secret:file/{name}"
        if path in _KEYS or re.fullmatch(r"deployment\.stateKeys\[\d+\]\.ref", path):
            resolver.read_key(reference)
        elif path.endswith("authorization.signingKeyRef"):
            resolver.read_jwk(reference)
        else:
            resolver.read_text(reference)


def test_the_readme_makes_every_secret_the_runtime_file_names(
    made: Path, runtime: dict[str, Any]
) -> None:
    for folder in (made / "secrets", made / "postgres"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for file in folder.iterdir():
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    resolver = SecretResolver(file_root=made / "secrets", environment=False)
    read_every_secret(runtime, resolver)
    # The URL of each role carries the password PostgreSQL's file gives that role.
    for url_file, password_file in (
        ("runtime-db-url", "runtime"),
        ("migration-db-url", "migration"),
    ):
        parsed = parse_database_url(resolver.read_text(f"secret:file/{url_file}"), label=url_file)
        assert parsed.host == "postgres" and parsed.port == 5432
        assert parsed.password == (made / "postgres" / f"{password_file}-password").read_text()
    assert (
        parse_database_url(resolver.read_text("secret:file/runtime-db-url"), label="runtime").user
        == runtime["deployment"]["runtimeRole"]
    )


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A whole TLS handshake between two contexts in memory; verification errors raise."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(to_client, to_server, server_hostname=name)
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    pending = [client_side, server_side]
    for _ in range(10):
        for side in list(pending):
            try:
                side.do_handshake()
                pending.remove(side)
            except ssl.SSLWantReadError:
                pass
        if not pending:
            return
    raise AssertionError("the handshake did not finish")


def test_postgres_certificate_passes_the_coordinators_own_verification(made: Path) -> None:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(made / "postgres" / "server.crt", made / "postgres" / "server.key")
    client = client_ssl_context((made / "secrets" / "db-root.pem").read_bytes())
    _handshake(server, client, "postgres")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(
            server, client_ssl_context((made / "secrets" / "db-root.pem").read_bytes()), "db"
        )


def test_the_internal_certificate_serves_each_grpc_address_both_ways(
    made: Path, runtime: dict[str, Any]
) -> None:
    secrets = made / "secrets"
    authority = (secrets / "internal-ca.pem").read_text()

    def context(purpose: ssl.Purpose) -> ssl.SSLContext:
        made_context = ssl.create_default_context(purpose, cadata=authority)
        made_context.load_cert_chain(secrets / "internal.crt", secrets / "internal.key")
        made_context.verify_mode = ssl.CERT_REQUIRED
        return made_context

    server, client = context(ssl.Purpose.CLIENT_AUTH), context(ssl.Purpose.SERVER_AUTH)
    for address in runtime["deployment"]["internal"]["addresses"].values():
        _handshake(server, client, host_port(address)[0])
    # An address the certificate does not name is refused, so the check above is real.
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, client, host_port(runtime["deployment"]["listener"]["bind"])[0])


# -- the prepare service's script --------------------------------------------------------


def run_prepare(
    services: dict[str, Any], source: Path, volumes: Path, capabilities: list[str]
) -> subprocess.CompletedProcess[str]:
    script = prepare_script(services)
    script = script.replace("/prepare/in/", f"{source}/").replace("/prepare/out/", f"{volumes}/")
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in capabilities)])
    return subprocess.run(
        ["setpriv", f"--bounding-set={bounding}", "--", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def prepare_input(made: Path, tmp_path: Path) -> tuple[Path, Path]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("runs prepare's script as root under setpriv, as its container does")
    source, volumes = tmp_path / "in", tmp_path / "out"
    for folder in ("secrets", "postgres"):
        shutil.copytree(made / folder, source / folder)
        # The operator's own files: the script needs DAC_OVERRIDE to read them.
        for path in (source / folder, *(source / folder).iterdir()):
            os.chown(path, 4242, 4242)
    for volume in ("secrets", "apply-secrets", "postgres"):
        (volumes / volume).mkdir(parents=True)  # a fresh volume: root's, 0755
    (volumes / "secrets" / "left-over").write_text("from a file since removed")
    return source, volumes


def test_prepare_hands_each_volume_to_its_reader(
    services: dict[str, Any], runtime: dict[str, Any], prepare_input: tuple[Path, Path]
) -> None:
    source, volumes = prepare_input
    result = run_prepare(services, source, volumes, services["prepare"]["cap_add"])
    assert result.returncode == 0, result.stderr
    owners = {"secrets": 10001, "apply-secrets": 10001, "postgres": 999}
    for volume, uid in owners.items():
        folder = volumes / volume
        assert (folder.stat().st_uid, folder.stat().st_gid) == (uid, uid)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for file in folder.iterdir():
            assert (file.stat().st_uid, file.stat().st_gid) == (uid, uid), file
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    migration = runtime["database"]["migrationUrlRef"].removeprefix("secret:file/")
    every = {path.name for path in (source / "secrets").iterdir()}
    assert {p.name for p in (volumes / "apply-secrets").iterdir()} == every
    assert {p.name for p in (volumes / "secrets").iterdir()} == every - {migration}
    assert {p.name for p in (volumes / "postgres").iterdir()} == {
        p.name for p in (source / "postgres").iterdir()
    }
    # What the coordinator, running as 10001, accepts.
    read_every_secret(
        runtime,
        SecretResolver(file_root=volumes / "apply-secrets", environment=False, expected_uid=10001),
    )
    read_every_secret(
        runtime,
        SecretResolver(file_root=volumes / "secrets", environment=False, expected_uid=10001),
        skip=migration,
    )


def test_prepare_stops_on_a_missing_postgres_file(
    services: dict[str, Any], prepare_input: tuple[Path, Path]
) -> None:
    source, volumes = prepare_input
    (source / "postgres" / "runtime-password").unlink()
    result = run_prepare(services, source, volumes, services["prepare"]["cap_add"])
    assert result.returncode == 1
    assert "deploy/compose/postgres/runtime-password is missing" in result.stderr
    assert (volumes / "secrets" / "left-over").exists(), "nothing was touched"


def test_prepare_needs_the_capabilities_it_is_given(
    services: dict[str, Any], prepare_input: tuple[Path, Path]
) -> None:
    # The confinement is real: without CHOWN the same script fails.
    source, volumes = prepare_input
    fewer = [c for c in services["prepare"]["cap_add"] if c != "CHOWN"]
    assert run_prepare(services, source, volumes, fewer).returncode != 0


def test_one_service_builds_the_image_every_coordinator_service_runs(
    services: dict[str, Any],
) -> None:
    builders = [name for name, service in services.items() if "build" in service]
    assert builders == ["prepare"]
    image = services["prepare"]["image"]
    for name in COORDINATOR_SERVICES:
        assert services[name]["image"] == image, name
