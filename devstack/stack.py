"""The local stack: PostgreSQL with TLS, the development issuer, the product stand-ins and
the coordinator, each a real process on loopback.

``make quickstart``, ``make up`` and the end-to-end tests all build the stack through
:class:`LocalStack`, so what a new user runs is what the tests run.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from core.config.load import load_runtime_file
from devstack.issuer import IssuerState, write_token_file
from devstack.postgres import DatabaseHandle
from devstack.runtime_file import write_local_deployment

CONNECTION_MODULES = {
    "casework-review-producer": "devstack.products.casework",
    "messaging": "devstack.products.messaging",
    "scheduling": "devstack.products.scheduling",
    "breg-action": "devstack.products.breg",
}
CONNECTION_TYPES = tuple(CONNECTION_MODULES)
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0


CHECKOUT = Path(__file__).resolve().parents[1]


def module_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child started with ``python -m devstack.…``.

    devstack lives in the checkout, not in the installed wheel, so the checkout goes first
    on the child's module path whatever folder the parent was started from.
    """
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(CHECKOUT), env.get("PYTHONPATH"))))
    return env


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTENER_PORTS_FLOOR = 10_000


def _ephemeral_floor() -> int:
    """The lowest port the kernel gives an outgoing connection (32768 when unknown)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, taken below the kernel's
    ephemeral range: a port from that range can be handed to any outgoing connection (to
    PostgreSQL, to a stand-in) between this call and the listener's bind, and the listener
    then fails with EADDRINUSE. Falls back to a kernel-chosen port when no such port is free."""
    floor = _ephemeral_floor()
    if floor - LISTENER_PORTS_FLOOR >= 1_000:
        for _ in range(64):
            port = secrets.randbelow(floor - LISTENER_PORTS_FLOOR) + LISTENER_PORTS_FLOOR
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(
    probe: Any, what: str, *, timeout: float = READY_TIMEOUT_SECONDS, process: Any = None
) -> None:
    """Poll ``probe()`` until it is true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with status {process.returncode}")
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f} s")


def http_ok(url: str) -> bool:
    """True when ``url`` answers 2xx."""
    return httpx.get(url, timeout=2.0).is_success


def end_process(
    process: subprocess.Popen[bytes],
    sig: int = signal.SIGTERM,
    timeout: float = STOP_TIMEOUT_SECONDS,
) -> int:
    """Send ``sig`` to ``process`` unless it ended, wait up to ``timeout`` seconds, kill it
    after that; answer its exit status."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


@dataclass
class LocalStack:
    """One local deployment and the processes around it."""

    root: Path
    runtime_file: Path
    summary: dict[str, Any]
    issuer_state: Path
    product_urls: dict[str, str]
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _log_handles: list[IO[bytes]] = field(default_factory=list)
    api_url: str | None = None
    """Where the test process reaches the API when the listener is not the audience's
    address (the coordinator on a host of its own); the audience otherwise."""

    # ------------------------------------------------------------------ construction

    @classmethod
    def prepare(
        cls,
        root: Path,
        *,
        packages: Sequence[tuple[Path, str]],
        database: DatabaseHandle,
        result_check_seconds: int = 60,
    ) -> LocalStack:
        """Write the deployment, the issuer state and the stand-ins' settings under ``root``."""
        root.mkdir(parents=True, exist_ok=True)
        secret_files = database.write_secret_files(root / "db-secrets")
        files: dict[str, Path] = {
            "runtime_url": secret_files.runtime_url,
            "migration_url": secret_files.migration_url,
        }
        if secret_files.trusted_root is not None:
            files["trusted_root"] = secret_files.trusted_root
        ports = {name: free_port() for name in ("listener", "metrics", "issuer")}
        ports.update({kind: free_port() for kind in CONNECTION_TYPES})
        runtime_file = write_local_deployment(
            root / "deployment",
            packages=list(packages),
            database_secret_files=files,
            ports=ports,
            result_check_seconds=result_check_seconds,
        )
        summary = json.loads((root / "deployment" / "devstack.json").read_text())
        issuer_state = root / "issuer"
        IssuerState.create(issuer_state, summary["issuer"])
        logs = root / "logs"
        logs.mkdir(exist_ok=True)
        stack = cls(root, runtime_file, summary, issuer_state, {}, logs)
        stack._write_product_settings()
        return stack

    def _write_product_settings(self) -> None:
        config = load_runtime_file(self.runtime_file)
        by_type: dict[str, list[str]] = {}
        urls: dict[str, str] = {}
        for connection in config.connections.values():
            by_type.setdefault(connection.type, []).append(connection.authorization.client_id)
            urls[connection.type] = connection.base_url
        completions = self.summary.get("completions", {})
        for kind, clients in by_type.items():
            settings: dict[str, Any] = {
                "baseUrl": urls[kind],
                "issuer": self.summary["issuer"],
                "allowedClients": sorted(clients),
                "bind": urls[kind].removeprefix("http://"),
            }
            if kind == "casework-review-producer":
                producers: dict[str, Any] = {}
                for name, completion in completions.items():
                    producers[completion["producer"]] = {
                        "clientId": config.connections[name].authorization.client_id,
                        "completion": {
                            "url": self.summary["audience"] + "/v1/review-completions",
                            "recipientBinding": completion["recipientBinding"],
                            "tokenFile": completion["tokenFile"],
                        },
                    }
                settings["trustedProducers"] = producers
            path = self.root / f"{kind}.json"
            path.write_text(json.dumps(settings, indent=2) + "\n")
            self.product_urls[kind] = urls[kind]

    # ---------------------------------------------------------------------- processes

    def spawn(self, name: str, command: list[str], env: Mapping[str, str] | None = None) -> None:
        """Start ``command`` as process ``name`` of this stack, logging to ``<logs>/<name>.log``
        and stopped with the rest by :meth:`stop` (the bench starts its stand-ins this way)."""
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._log_handles.append(log)
        self.processes[name] = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=module_env(env),
            start_new_session=True,
        )

    def start_products(self) -> None:
        """Start the issuer and every stand-in the deployment's connections use."""
        issuer_url = self.summary["issuer"]
        self.spawn(
            "issuer",
            [
                sys.executable,
                "-m",
                "devstack.issuer",
                "--state",
                str(self.issuer_state),
                "--clients",
                self.summary["publicKeysFile"],
                "--bind",
                issuer_url.removeprefix("http://"),
            ],
        )
        for kind in self.product_urls:
            # Casework's module also has list/decide tools, so serving is a subcommand there.
            serve = ["serve"] if kind == "casework-review-producer" else []
            settings = str(self.root / f"{kind}.json")
            module = CONNECTION_MODULES[kind]
            self.spawn(kind, [sys.executable, "-m", module, *serve, "--settings", settings])
        wait_until(
            lambda: http_ok(issuer_url + "/.well-known/openid-configuration"),
            "development issuer",
            process=self.processes["issuer"],
        )
        for kind, url in self.product_urls.items():
            wait_until(
                lambda url=url: http_ok(url + "/dev/stats"), kind, process=self.processes[kind]
            )

    def start_coordinator(
        self,
        *extra: str,
        name: str = "coordinator",
        env: Mapping[str, str] | None = None,
        wait_ready: bool = True,
        prefix: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """Start ``coordinator --runtime-config …`` (after ``prefix``, such as the command
        that enters a network namespace) and wait for /ready."""
        command = [
            *prefix,
            str(Path(sys.executable).with_name("coordinator")),
            "--runtime-config",
            str(self.runtime_file),
            *extra,
        ]
        self.spawn(name, command, env)
        process = self.processes[name]
        if wait_ready:
            wait_until(lambda: http_ok(self.url + "/ready"), "coordinator /ready", process=process)
        return process

    @property
    def url(self) -> str:
        """The coordinator's base URL, as the test process reaches it."""
        return self.api_url or str(self.summary["audience"])

    @property
    def metrics_url(self) -> str:
        """The metrics listener's base URL."""
        return f"http://127.0.0.1:{self.summary['ports']['metrics']}"

    def mint(self, role: str, subject: str, out: Path) -> Path:
        """Write an access token for the producer or operator client into ``out`` (0600)."""
        client = self.summary["producerClientId" if role == "producer" else "operatorClientId"]
        token = IssuerState.open(self.issuer_state).mint(
            client_id=client,
            subject=subject,
            audience=str(self.summary["audience"]),
            lifetime_seconds=43200,
        )
        write_token_file(out, token)
        return out

    def stop_process(self, name: str, sig: int = signal.SIGTERM) -> int:
        """Signal one process and wait for it; answer its exit status."""
        return end_process(self.processes.pop(name), sig)

    def stop(self) -> None:
        """Stop everything this stack started, coordinator first."""
        order = sorted(self.processes, key=lambda name: 0 if name.startswith("coordinator") else 1)
        for name in order:
            self.stop_process(name)
        for handle in self._log_handles:
            handle.close()
        self._log_handles.clear()

    def log_text(self, name: str) -> str:
        """What a process wrote so far."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def running(stack: LocalStack) -> Iterator[LocalStack]:
    """Stop the stack on exit, whatever happened."""
    try:
        yield stack
    finally:
        stack.stop()
