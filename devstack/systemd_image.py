"""A systemd host in a container, for booting the units of ``deploy/systemd`` for real.

``tests/deploy_live/test_systemd_boot.py`` uses it. Everything runs on the deploy tests'
private Docker daemon (:class:`devstack.containers.Engine`) and is named ``rc-systemd-…``:

- **the image** (:func:`systemd_image`): the coordinator's own image
  (:func:`devstack.containers.coordinator_image`: the project's ``Dockerfile`` from ``dist/``
  and the lock on the ``debootstrap`` Debian 12 base, which carries systemd 252), so the
  ``coordinator`` account (uid/gid :data:`COORDINATOR_UID`) and the virtual environment at
  ``/opt/registry-coordinator`` are the ones the compose tests run, and the units in
  :data:`UNIT_DIR`, where an operator installs them, so that ``systemctl mask`` can put its
  link in ``/etc/systemd/system``. Built with no network.
- **PostgreSQL 17** (:func:`start_postgres`): a container of
  :data:`devstack.containers.POSTGRES_IMAGE` with TLS from a throw-away authority, and the
  two login roles of the runbook's chapter 2, on the network :data:`NETWORK`.
- **the host** (:func:`start_host`): systemd as PID 1 of a container on that network, and
  :func:`install_deployment` writes what the units expect on a host (deploy/systemd/README.md):
  the runtime file, ``/etc/registry-coordinator/secrets``, the apply unit's
  ``/etc/registry-coordinator/apply-secrets`` and the package.

What a container needs for systemd as PID 1 here (Docker 20.10, cgroup v1 with systemd's
named hierarchy): the host's ``/sys/fs/cgroup`` mounted read-write with the host's cgroup
namespace, tmpfs on ``/run`` and ``/run/lock``, ``CAP_SYS_ADMIN`` (systemd builds each
unit's sandbox from mounts: ``ProtectSystem=``, ``PrivateTmp=``, ``InaccessiblePaths=``,
``BindReadOnlyPaths=``), no seccomp filter of Docker's, and ``/`` made a shared mount before
``/sbin/init`` starts. Not ``--privileged``.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.workflow.package import build_package
from devstack.containers import (
    CACHE,
    CHECKOUT,
    COORDINATOR_IMAGE,
    POSTGRES_IMAGE,
    Engine,
    HostError,
    coordinator_image,
    postgres_image,
)
from devstack.issuer import generate_private_jwk, public_jwk
from devstack.postgres_tls import CertificateAuthority

PREFIX = "rc-systemd-"
IMAGE = f"{PREFIX}coordinator:test"
NETWORK = f"{PREFIX}net"
HOST = f"{PREFIX}host"
POSTGRES = f"{PREFIX}postgres"
COORDINATOR_UID = 10001
UNIT_DIR = "/usr/local/lib/systemd/system"
UNITS = CHECKOUT / "deploy" / "systemd"
PACKAGE_SOURCE = CHECKOUT / "examples" / "approval-notice"

ETC = "/etc/registry-coordinator"
SECRETS = f"{ETC}/secrets"
APPLY_SECRETS = f"{ETC}/apply-secrets"
PACKAGES = "/srv/registry-coordinator/packages"
LISTENER = "127.0.0.1:8108"

# Units a container has no use for: consoles, udev, kernel modules and file systems the
# container does not own. Masked in the image so the boot ends "running", not "degraded".
CONTAINER_MASKS = (
    "getty.target",
    "console-getty.service",
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
    "systemd-modules-load.service",
    "systemd-remount-fs.service",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
)

# On top of the project's own image, built by the project's Dockerfile on the systemd base
# (:func:`systemd_image`): the same account and virtual environment an operator's image has.
DOCKERFILE = f"""\
ARG COORDINATOR_IMAGE
FROM ${{COORDINATOR_IMAGE}}
USER root
WORKDIR /
RUN systemctl mask {" ".join(CONTAINER_MASKS)} \\
 && systemctl set-default multi-user.target
COPY units/ {UNIT_DIR}/
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT []
CMD ["/bin/sh", "-c", "mount --make-rshared / && exec /sbin/init"]
"""

RUN_OPTIONS = (
    "--cap-add=SYS_ADMIN",
    "--security-opt=seccomp=unconfined",
    "--tmpfs=/run",
    "--tmpfs=/run/lock",
    "--volume=/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--cgroupns=host",
)
"""``docker run`` options for systemd as PID 1 (see the module's text)."""


# ---------------------------------------------------------------------------------- images


def systemd_image(engine: Engine) -> float:
    """Build :data:`IMAGE`: the units on the coordinator's own image (the project's
    Dockerfile from ``dist/`` and the lock, on the Debian base, which carries systemd);
    answers the seconds the builds took."""
    seconds = coordinator_image(engine)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="systemd-context-") as scratch:
        context = Path(scratch)
        (context / "Dockerfile").write_text(DOCKERFILE, encoding="utf-8")
        (context / "units").mkdir()
        for unit in sorted(UNITS.iterdir()):
            if unit.suffix in (".service", ".target", ".timer"):
                shutil.copy2(unit, context / "units" / unit.name)
        return seconds + engine.build(context, IMAGE, args={"COORDINATOR_IMAGE": COORDINATOR_IMAGE})


# ------------------------------------------------------------------------------ containers


def remove_ours(engine: Engine) -> None:
    """Remove the containers and the network this module creates, if they exist."""
    for name in (HOST, POSTGRES):
        engine.docker("rm", "--force", "--volumes", name, check=False, timeout=120)
    engine.docker("network", "rm", NETWORK, check=False, timeout=60)


def _copy_in(engine: Engine, container: str, entries: Sequence[Entry]) -> None:
    """Copy ``entries`` into ``container`` (running, or created from an image without USER)
    with their owners and modes, as one tar stream."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.path.lstrip("/"))
            info.uid = info.gid = entry.owner
            info.mode = entry.mode
            info.mtime = int(time.time())
            if entry.data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(entry.data)
                archive.addfile(info, io.BytesIO(entry.data))
    running = engine.docker("inspect", "--format", "{{.State.Running}}", container).stdout
    if running.strip() == "true":
        # Unpacked by the container's own tar as root, so the numeric owners stay as given
        # (`docker cp --archive` gives everything the image's USER when it names one, as
        # the host's image, made from the coordinator's, does).
        engine.docker(
            "exec",
            "-i",
            container,
            "tar",
            "--extract",
            "--same-owner",
            "--numeric-owner",
            "--same-permissions",
            "--directory=/",
            input=buffer.getvalue(),
        )
    else:
        engine.docker("cp", "--archive", "-", f"{container}:/", input=buffer.getvalue())


@dataclass(frozen=True)
class Entry:
    """A folder (``data`` None) or file to put into a container."""

    path: str
    mode: int
    owner: int = 0
    data: bytes | None = None


@dataclass(frozen=True)
class Database:
    """The PostgreSQL container's roles, as the runtime file's secrets name them."""

    runtime_url: str = field(repr=False)
    migration_url: str = field(repr=False)
    root_pem: bytes = field(repr=False)


PG_HBA = """\
# The boot test's PostgreSQL: the bootstrap superuser only over the socket inside its
# container; the two login roles only to `coordinator`, only with TLS and SCRAM, only from
# the test's network.
local    all          postgres                                peer
hostssl  coordinator  coordinator_migrator   samenet          scram-sha-256
hostssl  coordinator  coordinator_runtime    samenet          scram-sha-256
"""


def start_postgres(engine: Engine, *, timeout: float = 120.0) -> Database:
    """PostgreSQL 17 with TLS on :data:`NETWORK`, the database ``coordinator`` and its two
    login roles; returns their URLs (``sslmode=verify-full``) and the authority's root."""
    if not engine.has_image(POSTGRES_IMAGE):
        postgres_image(engine)
    authority = CertificateAuthority.create("Registry Coordinator systemd boot test CA")
    certificate, key = authority.issue_server((POSTGRES,))
    passwords = {role: secrets.token_hex(24) for role in ("postgres", "migrator", "runtime")}
    engine.docker(
        "create",
        f"--name={POSTGRES}",
        f"--network={NETWORK}",
        "--env=POSTGRES_USER=postgres",
        "--env=POSTGRES_PASSWORD_FILE=/etc/postgresql/private/postgres-password",
        POSTGRES_IMAGE,
        "postgres",
        "-c",
        "listen_addresses=*",
        "-c",
        "ssl=on",
        "-c",
        "ssl_cert_file=/etc/postgresql/private/server.crt",
        "-c",
        "ssl_key_file=/etc/postgresql/private/server.key",
        "-c",
        "hba_file=/etc/postgresql/pg_hba.conf",
    )
    postgres_uid = 999
    _copy_in(
        engine,
        POSTGRES,
        [
            Entry("/etc/postgresql", 0o755),
            Entry("/etc/postgresql/pg_hba.conf", 0o644, data=PG_HBA.encode()),
            Entry("/etc/postgresql/private", 0o700, postgres_uid),
            Entry("/etc/postgresql/private/server.crt", 0o600, postgres_uid, certificate),
            Entry("/etc/postgresql/private/server.key", 0o600, postgres_uid, key),
            Entry(
                "/etc/postgresql/private/postgres-password",
                0o600,
                postgres_uid,
                passwords["postgres"].encode(),
            ),
        ],
    )
    engine.docker("start", POSTGRES)
    deadline = time.monotonic() + timeout
    while True:
        # TCP, so only the real server answers (the entry point's first one listens on its
        # socket only).
        probe = engine.docker(
            "exec", POSTGRES, "pg_isready", "--host=127.0.0.1", "--port=5432", check=False
        )
        if probe.returncode == 0:
            break
        if time.monotonic() > deadline:
            logs = engine.docker("logs", "--tail=30", POSTGRES, check=False)
            raise HostError(
                f"{POSTGRES} did not accept connections in {timeout:.0f} s:\n"
                f"{logs.stdout}{logs.stderr}"
            )
        time.sleep(0.5)
    # The passwords travel on psql's standard input, never on a command line.
    sql = f"""
\\set ON_ERROR_STOP 1
CREATE ROLE coordinator_migrator LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB CREATEROLE
    NOREPLICATION PASSWORD '{passwords["migrator"]}';
CREATE ROLE coordinator_runtime LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE
    NOREPLICATION NOINHERIT PASSWORD '{passwords["runtime"]}';
CREATE DATABASE coordinator OWNER coordinator_migrator;
REVOKE ALL ON DATABASE coordinator FROM PUBLIC;
GRANT CONNECT ON DATABASE coordinator TO coordinator_runtime;
"""
    made = engine.docker(
        "exec",
        "--interactive",
        "--user=postgres",
        POSTGRES,
        "psql",
        "--no-psqlrc",
        "--quiet",
        "--dbname=postgres",
        input=sql.encode(),
        check=False,
    )
    if made.returncode != 0:
        # Given input as bytes, docker's output comes back as bytes too.
        errors: str | bytes = made.stderr
        if isinstance(errors, bytes):
            errors = errors.decode(errors="replace")
        raise HostError(f"creating the roles failed: {errors[-2000:]}")

    def url(role: str, password: str) -> str:
        return f"postgresql://{role}:{password}@{POSTGRES}:5432/coordinator?sslmode=verify-full"

    return Database(
        runtime_url=url("coordinator_runtime", passwords["runtime"]),
        migration_url=url("coordinator_migrator", passwords["migrator"]),
        root_pem=authority.pem,
    )


def start_host(engine: Engine, *, timeout: float = 120.0) -> None:
    """Start :data:`HOST` from :data:`IMAGE`, systemd as PID 1, and wait until the boot is
    finished (``systemctl is-system-running`` says running)."""
    engine.docker(
        "run",
        "--detach",
        f"--name={HOST}",
        f"--hostname={HOST}",
        f"--network={NETWORK}",
        *RUN_OPTIONS,
        IMAGE,
    )
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        found = engine.docker("exec", HOST, "systemctl", "is-system-running", check=False)
        state = found.stdout.strip()
        if state == "running":
            return
        if state == "degraded":
            failed = engine.docker("exec", HOST, "systemctl", "--failed", "--no-pager", check=False)
            raise HostError(f"{HOST} booted degraded:\n{failed.stdout}")
        time.sleep(0.2)
    logs = engine.docker("logs", "--tail=40", HOST, check=False)
    raise HostError(
        f"{HOST}: systemd not running after {timeout:.0f} s (last state {state!r}):\n"
        f"{logs.stdout}{logs.stderr}"
    )


# ------------------------------------------------------------------------------ deployment


def runtime_document(package: str, digest: str) -> dict[str, Any]:
    """The runtime file for the host: the paths deploy/systemd/README.md names, one secret
    folder, the package at ``PACKAGES/<package>``, token keys from a file (no issuer has to
    answer for ``/ready``) and connections to product URLs that are never called here."""
    return {
        "namespace": "coordinator_systemd",
        "secretProviders": {"file": {"root": SECRETS}},
        "database": {
            "runtimeUrlRef": "secret:file/runtime-db-url",
            "migrationUrlRef": "secret:file/migration-db-url",
            "trustedRootCertificateRef": "secret:file/db-root.pem",
        },
        "deployment": {
            "databaseId": str(uuid.uuid4()),
            "runtimeRole": "coordinator_runtime",
            "packages": [{"root": f"{PACKAGES}/{package}", "expectedDigest": digest}],
            "listener": {
                "bind": LISTENER,
                "tlsTermination": "operator-controlled-upstream",
                "publicUrl": "https://coordinator.example.org",
            },
            "internal": {"socketDir": "/run/registry-coordinator/sockets"},
            "logging": {"level": "notice", "format": "text"},
            "authentication": {
                "issuer": "https://issuer.example.org",
                "audience": "https://coordinator.example.org",
                "signingKeys": {"jwksRef": "secret:file/issuer-jwks"},
                "algorithms": ["ES256"],
                "clockSkewSeconds": 60,
                "policies": {
                    "intake-portal": {
                        "workflows": ["approval-notice"],
                        "actions": ["start", "status"],
                    },
                    "platform-operators": {
                        "operator": True,
                        "actions": ["doctor", "restore-hold", "release-restore-hold"],
                    },
                },
            },
            "auditFile": "/var/lib/registry-coordinator/audit.jsonl",
            "auditKeyRef": "secret:file/audit-key",
            "stateKeys": [{"version": 1, "ref": "secret:file/state-key-1"}],
            "activeStateKey": 1,
            "admissionKeyRef": "secret:file/admission-key",
        },
        "connections": {
            "review": {
                "type": "casework-review-producer",
                "baseUrl": "https://casework.invalid",
                "profile": "licensing-reviews",
                "producer": "coordinator",
                "authorization": {
                    "clientId": "coordinator-review",
                    "signingKeyRef": "secret:file/review-client.jwk",
                    "scopes": ["review-requests:write", "review-requests:read"],
                },
                "completion": {
                    "recipientBinding": "coordinator-v1",
                    "bearerTokenRef": "secret:file/review-completion-token",
                },
                "resultCheckSeconds": 900,
            },
            "notices": {
                "type": "messaging",
                "baseUrl": "https://messaging.invalid",
                "profile": "applicant-notices",
                "authorization": {
                    "clientId": "coordinator-notices",
                    "signingKeyRef": "secret:file/notices-client.jwk",
                    "scopes": ["messages:send", "receipts:read"],
                },
            },
        },
    }


def deployment_entries(database: Database) -> list[Entry]:
    """Everything deploy/systemd/README.md asks for on the host, with owners and modes."""
    uid = COORDINATOR_UID
    with tempfile.TemporaryDirectory(prefix="rc-systemd-package-") as scratch:
        built = build_package(PACKAGE_SOURCE, Path(scratch))
        package_files = sorted(path for path in built.path.rglob("*"))
        package = [Entry(f"{PACKAGES}/{built.path.name}", 0o755)]
        for path in package_files:
            target = f"{PACKAGES}/{built.path.name}/{path.relative_to(built.path)}"
            if path.is_dir():
                package.append(Entry(target, 0o755))
            else:
                package.append(Entry(target, 0o644, data=path.read_bytes()))
        document = runtime_document(built.path.name, built.digest)
    # No token is minted here: /ready only needs a key set held, so the private half goes.
    issuer_public = public_jwk(generate_private_jwk())
    shared = {
        "runtime-db-url": database.runtime_url.encode(),
        "db-root.pem": database.root_pem,
        "state-key-1": secrets.token_bytes(32),
        "admission-key": secrets.token_bytes(32),
        "audit-key": secrets.token_bytes(32),
        "issuer-jwks": json.dumps({"keys": [issuer_public]}).encode(),
        "review-client.jwk": json.dumps(generate_private_jwk()).encode(),
        "notices-client.jwk": json.dumps(generate_private_jwk()).encode(),
        "review-completion-token": secrets.token_hex(32).encode(),
    }
    apply_only = {**shared, "migration-db-url": database.migration_url.encode()}
    header = "# Written by devstack.systemd_image for the boot test. Holds no secret values.\n"
    runtime = header + yaml.safe_dump(document, sort_keys=False)
    entries = [
        Entry(ETC, 0o755),
        Entry(f"{ETC}/runtime.yaml", 0o640, data=runtime.encode()),
        Entry(SECRETS, 0o700, uid),
        *(Entry(f"{SECRETS}/{name}", 0o600, uid, data) for name, data in shared.items()),
        Entry(APPLY_SECRETS, 0o700, uid),
        *(Entry(f"{APPLY_SECRETS}/{name}", 0o600, uid, data) for name, data in apply_only.items()),
        Entry("/srv/registry-coordinator", 0o755),
        Entry(PACKAGES, 0o755),
        *package,
    ]
    return entries


def install_deployment(engine: Engine, database: Database) -> None:
    """Write the runtime file, both secret folders and the package into :data:`HOST`; the
    runtime file is root:coordinator 0640 as the README asks."""
    _copy_in(engine, HOST, deployment_entries(database))
    engine.docker("exec", HOST, "chgrp", "coordinator", f"{ETC}/runtime.yaml")


@contextlib.contextmanager
def booted(engine: Engine) -> Iterator[dict[str, float]]:
    """Network, PostgreSQL and the systemd host up, the deployment installed; yields the
    seconds each phase took; removes all of it afterwards."""
    timings: dict[str, float] = {}
    remove_ours(engine)
    started = time.monotonic()
    timings["image build"] = systemd_image(engine)
    try:
        engine.docker("network", "create", NETWORK)
        mark = time.monotonic()
        database = start_postgres(engine)
        timings["postgres up"] = time.monotonic() - mark
        mark = time.monotonic()
        start_host(engine)
        timings["systemd boot"] = time.monotonic() - mark
        install_deployment(engine, database)
        timings["total setup"] = time.monotonic() - started
        yield timings
    finally:
        remove_ours(engine)
