"""The fault stack spread over hosts of the failover tier (issue 40).

:func:`spread_stack` takes the fault tests' deployment (:func:`tests.helpers.faults.
fault_stack`) and moves its parts onto hosts of the cluster's bridge, as a registry team
would place them:

- ``core`` (10.77.0.21): the gateway, admission, recovery and auditd, or the all-in-one
  coordinator; its listener on the host's own address;
- ``products`` (10.77.0.31): the development issuer and the Messaging stand-in, both over
  HTTPS with a certificate from a private root made for the run;
- dispatcher hosts, added by a test (:func:`dispatcher_host`), each running
  ``coordinator --component dispatcher`` alone.

What the move rewrites in the deployment: the listener binds the core host's address; the
internal channel is TCP with mutual TLS at the core host's address (dispatchers get no
address, as several dispatchers run); the issuer and the product's base URL are ``https://``
on the products host, the connection trusts the private root, and the signing keys are a
file (``jwksRef``), so the gateway needs no route to the issuer. The coordinator's processes
and the stand-in trust the root for the issuer's token endpoint through ``SSL_CERT_FILE``,
as the compose trial's do; the test process does the same for its own requests to the
stand-in (the caller sets it: :data:`TRUST_ENV`).

The clock file, the runtime file and the audit journal stay on the one file system the
namespaces share; only the network is split.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from devstack.issuer import IssuerState
from devstack.postgres import DatabaseHandle, ExternalPostgres
from devstack.postgres_tls import CertificateAuthority
from devstack.stack import CONNECTION_MODULES, LocalStack, wait_until
from tests.helpers.deployment import write_secret
from tests.helpers.faults import FaultStack, fault_stack
from tests.helpers.ha_cluster import HaCluster, Host
from tests.helpers.internal_tls import use_internal_tls

CORE_OCTET: Final = 21
PRODUCTS_OCTET: Final = 31
INTERNAL_PORTS: Final = {"admission": 7101, "recovery": 7102, "auditd": 7103}
PRODUCTS_ROOT: Final = "products-root.pem"
ISSUER_KEYS: Final = "issuer-jwks.json"
TRUST_ENV: Final = "SSL_CERT_FILE"
"""The variable that makes a process (and httpx in the test) trust the products' root."""


@dataclasses.dataclass(frozen=True)
class Spread:
    """The stack and the hosts it runs on."""

    stack: FaultStack
    core: Host
    products: Host
    trust_file: Path
    """The products' root, for :data:`TRUST_ENV`."""


def database_on(cluster: HaCluster) -> DatabaseHandle:
    """A database for the deployment on the pair, its URLs naming the leader first and then
    the other server (CONTRACT §6.5)."""
    leader = cluster.leader()
    assert leader is not None
    server = ExternalPostgres.open(cluster.url(), cluster.ca.pem)
    handle = server.create_database("registry")
    others = tuple((node.host.address, 5432) for node in cluster.nodes if node is not leader)
    return dataclasses.replace(handle, host=leader.host.address, port=5432, more_hosts=others)


def dispatcher_host(cluster: HaCluster, number: int) -> Host:
    """Dispatcher host ``number`` (1, 2, …) at 10.77.0.2<number+1>."""
    return cluster.add_host(f"disp{number}", CORE_OCTET + number)


class _Mover:
    """Rewrites a prepared local stack for the hosts and starts its products there."""

    def __init__(self, core: Host, products: Host, folder: Path) -> None:
        self.core = core
        self.products = products
        self.folder = folder
        self.authority = CertificateAuthority.create("rcha products root")
        self.trust_file = folder / "products-root.pem"

    def __call__(self, local: LocalStack) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trust_file.write_bytes(self.authority.pem)
        certificate, key = self.authority.issue_server((self.products.address,))
        (self.folder / "server.pem").write_bytes(certificate)
        write_secret(self.folder, "server-key.pem", key)
        secrets = Path(str(local.summary["secretsDir"]))
        write_secret(secrets, PRODUCTS_ROOT, self.authority.pem)

        ports = local.summary["ports"]
        issuer_url = f"https://{self.products.address}:{ports['issuer']}"
        shutil.rmtree(local.issuer_state)
        issuer = IssuerState.create(local.issuer_state, issuer_url)
        local.summary["issuer"] = issuer_url
        write_secret(secrets, ISSUER_KEYS, json.dumps(issuer.jwks()).encode())

        document: dict[str, Any] = yaml.safe_load(local.runtime_file.read_text())
        deployment = document["deployment"]
        deployment["listener"]["bind"] = f"{self.core.address}:{ports['listener']}"
        deployment["authentication"]["issuer"] = issuer_url
        deployment["authentication"]["signingKeys"] = {"jwksRef": f"secret:file/{ISSUER_KEYS}"}
        for connection in document["connections"].values():
            kind = connection["type"]
            url = f"https://{self.products.address}:{ports[kind]}"
            connection["baseUrl"] = url
            connection["trustedRootCertificateRef"] = f"secret:file/{PRODUCTS_ROOT}"
            local.product_urls[kind] = url
        local.runtime_file.write_text(yaml.safe_dump(document, sort_keys=False))
        use_internal_tls(
            local,
            {name: f"{self.core.address}:{port}" for name, port in INTERNAL_PORTS.items()},
        )
        local.api_url = f"http://{self.core.address}:{ports['listener']}"

        for kind, url in local.product_urls.items():
            path = local.root / f"{kind}.json"
            settings = json.loads(path.read_text())
            settings.update(baseUrl=url, issuer=issuer_url, bind=url.removeprefix("https://"))
            path.write_text(json.dumps(settings, indent=2) + "\n")
        self._start(local, issuer_url)

    def _start(self, local: LocalStack, issuer_url: str) -> None:
        tls = ["--certificate", str(self.folder / "server.pem")]
        tls += ["--key", str(self.folder / "server-key.pem")]
        trust = {TRUST_ENV: str(self.trust_file)}
        local.spawn(
            "issuer",
            self.products.command(
                sys.executable,
                "-m",
                "devstack.issuer",
                "--state",
                str(local.issuer_state),
                "--clients",
                str(local.summary["publicKeysFile"]),
                "--bind",
                issuer_url.removeprefix("https://"),
                *tls,
            ),
            trust,
        )
        for kind in local.product_urls:
            settings = str(local.root / f"{kind}.json")
            command = [sys.executable, "-m", "bench.products", kind, settings, *tls]
            assert kind in CONNECTION_MODULES
            local.spawn(kind, self.products.command(*command), trust)
        verify = ssl.create_default_context(cafile=str(self.trust_file))
        probes = {"issuer": issuer_url + "/.well-known/openid-configuration"}
        probes.update({kind: url + "/dev/stats" for kind, url in local.product_urls.items()})
        for name, url in probes.items():
            wait_until(
                lambda url=url: httpx.get(url, verify=verify, timeout=2.0).is_success,
                f"{name} on the products host",
                process=local.processes[name],
            )


@contextlib.contextmanager
def spread_stack(cluster: HaCluster, database: DatabaseHandle) -> Iterator[Spread]:
    """The fault stack on the cluster's hosts (see the module); nothing of the coordinator
    is started yet."""
    core = cluster.add_host("core", CORE_OCTET)
    products = cluster.add_host("products", PRODUCTS_OCTET)
    mover = _Mover(core, products, cluster.folder / "products")
    with fault_stack(database, products=mover) as stack:
        stack.extra_env[TRUST_ENV] = str(mover.trust_file)
        yield Spread(stack, core, products, mover.trust_file)
