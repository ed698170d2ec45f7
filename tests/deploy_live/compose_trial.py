"""One compose deployment made the way deploy/compose/README.md tells an operator to, run by a
real Docker Engine and Compose v2 (devstack/containers.py), with the product stand-ins and the
development issuer on the host.

What differs from an operator's host, and why:

- ``compose.override.yaml`` (which Compose reads by itself) gives ``postgres`` the image
  devstack/containers.py builds, because no registry serves the official one here, and gives
  the dispatchers and recovery ``SSL_CERT_FILE``: the trial's issuer has a certificate from a
  private authority, as an issuer inside an organisation often has;
- the runtime file's deployment-specific parts are what chapter 4 of the README asks the
  operator to fill in: a new databaseId, the issuer with its signing keys as a file
  (``jwksRef``), and the connections' URLs, here on the host's address on the network
  ``outbound`` (:data:`HOST_ADDRESS`), where the stand-ins serve HTTPS.

Everything else is the checkout's own: compose.yaml, deploy/compose/* and the README's
commands that make the secrets, run as written (with the real ``docker compose run``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from core.workflow.package import build_package
from devstack.containers import (
    CACHE,
    DOCKER,
    POSTGRES_IMAGE,
    Engine,
    compose_binary,
)
from devstack.issuer import IssuerState, public_jwk
from devstack.postgres_tls import CertificateAuthority
from devstack.runtime_file import DEFAULT_PROFILES, DEFAULT_SCOPES
from devstack.stack import end_process

CHECKOUT = Path(__file__).resolve().parents[2]
PROJECT = "registry-coordinator"
# The host's address on the network `outbound` (Docker gives a bridge network's first
# address to the host).
HOST_ADDRESS = "172.30.9.1"
ISSUER_PORT, CASEWORK_PORT, MESSAGING_PORT = 9543, 9544, 9545
ISSUER_URL = f"https://{HOST_ADDRESS}:{ISSUER_PORT}"
API = "http://127.0.0.1:8108"
AUDIENCE = "https://coordinator.example.org"
PRODUCTS_ROOT = "products-root.pem"
CASEWORK = "casework-review-producer"
MESSAGING = "messaging"
COORDINATOR_SERVICES = ("auditd", "recovery", "admission", "dispatcher", "gateway")
# The maintenance file as an operator starts it, with the trial's image for postgres.
RECOVERY_ONLY = ("-f", "deploy/compose/recovery-only.yaml", "-f", "recovery-only.override.yaml")
ENDED = {"succeeded", "failed", "cancelled"}


def wait_for(check: Callable[[], bool], what: str, timeout: float, every: float = 0.5) -> None:
    """Poll ``check`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


@dataclass
class Trial:
    """A compose project folder and the processes around it."""

    root: Path
    engine: Engine
    products: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)

    # ----------------------------------------------------------------------- commands

    @functools.cached_property
    def env(self) -> dict[str, str]:
        """Docker's CLI of Debian's package, with Compose v2 as its plugin, on this engine."""
        shims = CACHE / "bin"
        shims.mkdir(parents=True, exist_ok=True)
        docker = shims / "docker"
        if not docker.is_symlink():
            docker.symlink_to(DOCKER)
        env = self.engine.env
        plugins = Path(env["DOCKER_CONFIG"]) / "cli-plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        plugin = plugins / "docker-compose"
        if not plugin.is_symlink():
            plugin.symlink_to(compose_binary())
        env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
        env["HOME"] = str(self.root)
        return env

    def compose(
        self, *args: str, check: bool = True, timeout: float = 600.0
    ) -> subprocess.CompletedProcess[str]:
        """``docker compose ARGS`` in the project folder."""
        found = subprocess.run(
            [str(DOCKER), "compose", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and found.returncode != 0:
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {found.returncode}:\n"
                f"{found.stdout[-3000:]}{found.stderr[-3000:]}"
            )
        return found

    def containers(self, *files: str) -> list[dict[str, Any]]:
        """``docker compose [FILES] ps --all`` as records (service, state, health, exit
        code); ``files`` are ``-f`` options, as :data:`RECOVERY_ONLY`."""
        found = self.compose(*files, "ps", "--all", "--format", "json").stdout.strip()
        if not found:
            return []
        # Compose 2.26 prints one JSON object per line.
        return [json.loads(line) for line in found.splitlines() if line.strip()]

    def running_services(self) -> set[str]:
        """The services with a running container, whichever file started them."""
        found = self.engine.docker(
            "ps",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--format",
            '{{.Label "com.docker.compose.service"}}',
        ).stdout
        return {line for line in found.split() if line}

    def wait_healthy(self, services: Iterable[str], *files: str, timeout: float = 180.0) -> None:
        """Wait until every container of ``services`` runs and reports healthy."""
        wanted = set(services)

        def healthy() -> bool:
            by_service: dict[str, list[dict[str, Any]]] = {}
            for container in self.containers(*files):
                by_service.setdefault(container["Service"], []).append(container)
            return all(
                name in by_service
                and all(
                    c["State"] == "running" and c.get("Health") == "healthy"
                    for c in by_service[name]
                )
                for name in wanted
            )

        wait_for(healthy, f"healthy {sorted(wanted)}", timeout, every=1.0)

    # ------------------------------------------------------------------------- set-up

    def make(self) -> None:
        """The project folder: the checkout's files, the README's secrets, the packages, the
        runtime file finished as chapter 4 says, and the override."""
        shutil.copy2(CHECKOUT / "compose.yaml", self.root / "compose.yaml")
        here = self.root / "deploy" / "compose"
        here.mkdir(parents=True)
        # runtime.yaml too: the README's commands run `docker compose run … apply`, which
        # mounts it (Docker would make a folder of a missing file).
        for name in (
            "initdb",
            "pg_hba.conf",
            "recovery-only.yaml",
            "prometheus.yml",
            "runtime.yaml",
        ):
            source = CHECKOUT / "deploy" / "compose" / name
            if source.is_dir():
                shutil.copytree(source, here / name)
            else:
                shutil.copy2(source, here / name)
        self._override()
        self._readme_secrets()
        digest = self._package()
        self._runtime(digest)
        self._products_side()

    def _override(self) -> None:
        trust = {"SSL_CERT_FILE": f"/etc/registry-coordinator/secrets/{PRODUCTS_ROOT}"}
        override = {
            "services": {
                "postgres": {"image": POSTGRES_IMAGE},
                "dispatcher": {"environment": trust},
                "recovery": {"environment": trust},
            }
        }
        (self.root / "compose.override.yaml").write_text(yaml.safe_dump(override))
        # Compose reads compose.override.yaml only when no file is named; the maintenance
        # file is named, so its override is named beside it (RECOVERY_ONLY).
        maintenance = {"services": {"postgres": {"image": POSTGRES_IMAGE}}}
        (self.root / "recovery-only.override.yaml").write_text(yaml.safe_dump(maintenance))

    def _readme_secrets(self) -> None:
        readme = (CHECKOUT / "deploy" / "compose" / "README.md").read_text("utf-8")
        start = readme.index("\n## 3. Make the secrets\n")
        end = readme.index("\n## ", start + 1)
        blocks = re.findall(r"^```sh\n(.*?)^```$", readme[start:end], re.S | re.M)
        script = "\n".join(blocks)
        found = subprocess.run(
            ["/bin/sh", "-eu", "-c", script],
            cwd="/",  # the commands find their folder by $CHECKOUT, from anywhere
            env={**self.env, "CHECKOUT": str(self.root)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert found.returncode == 0, found.stdout[-3000:] + found.stderr[-3000:]

    def _package(self) -> str:
        built = build_package(
            CHECKOUT / "examples" / "approval-notice", self.root / "deploy/compose/packages"
        )
        return str(built.digest)

    @property
    def secrets(self) -> Path:
        return self.root / "deploy" / "compose" / "secrets"

    def _write_secret(self, name: str, data: bytes) -> None:
        path = self.secrets / name
        path.write_bytes(data)
        path.chmod(0o600)

    def _runtime(self, digest: str) -> None:
        path = self.root / "deploy" / "compose" / "runtime.yaml"
        document = yaml.safe_load(path.read_text())
        deployment = document["deployment"]
        deployment["databaseId"] = str(uuid.uuid4())
        (package,) = deployment["packages"]
        package["expectedDigest"] = digest
        authentication = deployment["authentication"]
        authentication["issuer"] = ISSUER_URL
        authentication["signingKeys"] = {"jwksRef": "secret:file/issuer-jwks"}
        ports = {CASEWORK: CASEWORK_PORT, MESSAGING: MESSAGING_PORT}
        for connection in document["connections"].values():
            kind = connection["type"]
            connection["baseUrl"] = f"https://{HOST_ADDRESS}:{ports[kind]}"
            connection["profile"] = DEFAULT_PROFILES[kind]
            connection["authorization"]["scopes"] = list(DEFAULT_SCOPES[kind])
            connection["trustedRootCertificateRef"] = f"secret:file/{PRODUCTS_ROOT}"
        path.write_text(yaml.safe_dump(document, sort_keys=False))

    def _products_side(self) -> None:
        side = self.root / "host"
        side.mkdir()
        authority = CertificateAuthority.create("Registry Coordinator deploy-test products root")
        certificate, key = authority.issue_server((HOST_ADDRESS,))
        (side / "root.pem").write_bytes(authority.pem)
        (side / "server.pem").write_bytes(certificate)
        (side / "server-key.pem").write_bytes(key)
        (side / "server-key.pem").chmod(0o600)
        self._write_secret(PRODUCTS_ROOT, authority.pem)
        issuer = IssuerState.create(side / "issuer", ISSUER_URL)
        self._write_secret("issuer-jwks", json.dumps(issuer.jwks()).encode())
        runtime = yaml.safe_load((self.root / "deploy/compose/runtime.yaml").read_text())
        clients: dict[str, Any] = {}
        by_kind: dict[str, list[str]] = {}
        for name, connection in runtime["connections"].items():
            client = connection["authorization"]["clientId"]
            private = json.loads((self.secrets / f"{name}-client.jwk").read_text())
            clients[client] = {"keys": [public_jwk(private)]}
            by_kind.setdefault(connection["type"], []).append(client)
        (side / "clients.json").write_text(json.dumps(clients))
        review = runtime["connections"]["review"]
        for kind, port in ((CASEWORK, CASEWORK_PORT), (MESSAGING, MESSAGING_PORT)):
            settings: dict[str, Any] = {
                "baseUrl": f"https://{HOST_ADDRESS}:{port}",
                "issuer": ISSUER_URL,
                "allowedClients": by_kind[kind],
                "bind": f"{HOST_ADDRESS}:{port}",
            }
            if kind == CASEWORK:
                settings["trustedProducers"] = {
                    review["producer"]: {
                        "clientId": review["authorization"]["clientId"],
                        "completion": {
                            "url": f"{API}/v1/review-completions",
                            "recipientBinding": review["completion"]["recipientBinding"],
                            "tokenFile": str(self.secrets / "review-completion-token"),
                        },
                    }
                }
            (side / f"{kind}.json").write_text(json.dumps(settings))
        for client in ("intake-portal", "case-operators", "platform-operators"):
            self.tokens[client] = issuer.mint(
                client_id=client,
                subject=f"{client}-person",
                audience=AUDIENCE,
                lifetime_seconds=7200,
            )

    # ---------------------------------------------------------------------- products

    def start_products(self) -> None:
        """The issuer and the two stand-ins on :data:`HOST_ADDRESS` (the network must exist:
        call after ``up``)."""
        side = self.root / "host"
        tls = ["--certificate", str(side / "server.pem"), "--key", str(side / "server-key.pem")]
        env = {
            **os.environ,
            "PYTHONPATH": str(CHECKOUT),
            "SSL_CERT_FILE": str(side / "root.pem"),
        }
        commands = {
            "issuer": [
                sys.executable,
                "-m",
                "devstack.issuer",
                "--state",
                str(side / "issuer"),
                "--clients",
                str(side / "clients.json"),
                "--bind",
                f"{HOST_ADDRESS}:{ISSUER_PORT}",
                *tls,
            ],
            CASEWORK: [
                sys.executable,
                "-m",
                "bench.products",
                CASEWORK,
                str(side / f"{CASEWORK}.json"),
                *tls,
            ],
            MESSAGING: [
                sys.executable,
                "-m",
                "bench.products",
                MESSAGING,
                str(side / f"{MESSAGING}.json"),
                *tls,
            ],
        }
        for name, command in commands.items():
            log = (side / f"{name}.log").open("ab")
            self.products[name] = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=CHECKOUT,
                start_new_session=True,
            )
            log.close()
        verify = self.verify
        for name, url in (
            ("issuer", f"{ISSUER_URL}/.well-known/openid-configuration"),
            (CASEWORK, f"https://{HOST_ADDRESS}:{CASEWORK_PORT}/dev/stats"),
            (MESSAGING, f"https://{HOST_ADDRESS}:{MESSAGING_PORT}/dev/stats"),
        ):
            process = self.products[name]

            def answers(
                url: str = url, process: subprocess.Popen[bytes] = process, name: str = name
            ) -> bool:
                assert process.poll() is None, f"{name} exited; see {side}/{name}.log"
                try:
                    return httpx.get(url, verify=verify, timeout=2.0).is_success
                except httpx.HTTPError:
                    return False

            wait_for(answers, name, 60.0, every=0.2)

    @property
    def verify(self) -> ssl.SSLContext:
        """What the host's requests to the stand-ins and the issuer trust: the trial's root."""
        return ssl.create_default_context(cafile=str(self.root / "host" / "root.pem"))

    def product_stats(self, kind: str) -> dict[str, Any]:
        port = CASEWORK_PORT if kind == CASEWORK else MESSAGING_PORT
        answer = httpx.get(
            f"https://{HOST_ADDRESS}:{port}/dev/stats",
            verify=self.verify,
            timeout=10.0,
        )
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found

    def reviews(self) -> list[dict[str, Any]]:
        answer = httpx.get(
            f"https://{HOST_ADDRESS}:{CASEWORK_PORT}/dev/projects/"
            f"{DEFAULT_PROFILES[CASEWORK]}/review-requests",
            verify=self.verify,
            timeout=10.0,
        )
        answer.raise_for_status()
        found: list[dict[str, Any]] = answer.json()["reviews"]
        return found

    def decide(self, review_id: str, outcome: str = "approved") -> None:
        answer = httpx.post(
            f"https://{HOST_ADDRESS}:{CASEWORK_PORT}/dev/projects/"
            f"{DEFAULT_PROFILES[CASEWORK]}/review-requests/{review_id}/decision",
            json={"outcome": outcome},
            verify=self.verify,
            timeout=10.0,
        )
        answer.raise_for_status()

    def stop_products(self) -> None:
        for process in self.products.values():
            end_process(process)
        self.products.clear()

    # --------------------------------------------------------------------------- API

    def api(
        self,
        method: str,
        path: str,
        client: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 20.0,
    ) -> httpx.Response:
        return httpx.request(
            method,
            API + path,
            headers={"Authorization": f"Bearer {self.tokens[client]}", **(headers or {})},
            json=body,
            timeout=timeout,
        )

    def start_run(self, application: str) -> httpx.Response:
        """Start approval-notice for ``application`` (its id is the idempotency key)."""
        return self.api(
            "POST",
            "/v1/workflows/approval-notice/runs",
            "intake-portal",
            {"input": {"applicationId": application, "applicantRef": f"person-{application}"}},
            headers={"Idempotency-Key": f"deploy-test-{application}"},
        )

    def run_state(self, run_id: str) -> dict[str, Any]:
        answer = self.api("GET", f"/v1/runs/{run_id}", "intake-portal")
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found

    # ------------------------------------------------------------------------ ending

    def remove(self, files: Sequence[str] = ()) -> None:
        """Stop the products and remove every container, network and volume of the
        project."""
        self.stop_products()
        for selected in (list(files), list(RECOVERY_ONLY)):
            self.compose(
                *selected,
                "down",
                "--volumes",
                "--remove-orphans",
                "--timeout",
                "20",
                check=False,
                timeout=300,
            )
