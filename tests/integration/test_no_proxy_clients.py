"""Outbound clients ignore proxy settings in the environment (CONTRACT §9.3, issue 36).

Each test names a listening socket of its own as the proxy, in one of ``HTTP_PROXY``,
``HTTPS_PROXY``, ``ALL_PROXY`` or their lowercase forms, drives one client at a real
endpoint on loopback, and checks both sides: the endpoint got the request and the proxy
socket got no connection. The proxy socket closes whatever reaches it, so a client that
obeyed the variable would fail at once instead of waiting for a timeout.

The endpoint speaks plain HTTP or TLS under a private CA that ``SSL_CERT_FILE`` names:
``HTTPS_PROXY`` only applies to ``https://`` URLs, and the TLS cases also show that the
roots ``SSL_CERT_FILE`` names are still trusted once the environment's proxies are not.

The clients: the gateway's JWKS fetch (the whole gateway served from a runtime file whose
``jwksUrl`` is the endpoint), ``coordinatorctl``'s API commands, and the console's API
client.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml

from cli import console
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import server as grpc_server
from core.runtime import load_runtime
from devstack.postgres_tls import CertificateAuthority
from devstack.stack import free_port
from gateway.service import serve
from tests.helpers.cli_run import run_cli
from tests.helpers.gateway_kit import (
    RUN_A,
    FakeAudit,
    FakeRecovery,
    bearer,
    gateway_runtime_file,
    jwks_document,
    mint,
    status_document,
)
from tests.helpers.runtime_files import complete_runtime, write_runtime

LOOPBACK: Final = "127.0.0.1"
GUARD_SECONDS: Final = 15.0
"""A bound on waits that should be short; it decides nothing."""

CASES: Final = [
    ("HTTP_PROXY", "http"),
    ("http_proxy", "http"),
    ("HTTPS_PROXY", "https"),
    ("https_proxy", "https"),
    ("ALL_PROXY", "https"),
    ("all_proxy", "http"),
]
"""Each proxy variable, with an endpoint scheme it applies to."""
ENVIRONMENT: Final = (
    *(name for name, _ in CASES),
    "NO_PROXY",
    "no_proxy",
    "SSL_CERT_DIR",
    "COORDINATOR_URL",
    "COORDINATOR_TOKEN_FILE",
)
"""Variables a test sets itself or that would change what it shows; cleared first."""


class ProxyTrap:
    """A listening socket named as the proxy: it counts the connections made to it and
    closes each at once."""

    def __init__(self) -> None:
        self._sock = socket.create_server((LOOPBACK, 0))
        self.address = f"http://{LOOPBACK}:{self._sock.getsockname()[1]}"
        self._connections = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, name="proxy-trap", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.close()
            if self._stopping:
                return
            self._connections += 1

    def close(self) -> int:
        """Stop, and answer how many connections were made to the trap."""
        if not self._stopping:
            self._stopping = True
            # The accept queue is first in, first out: every connection made before this
            # one has been counted when the thread sees it and stops.
            socket.create_connection(self._sock.getsockname()).close()
            self._thread.join(GUARD_SECONDS)
            self._sock.close()
        return self._connections


@dataclass
class Endpoint:
    """What the real endpoint was asked: (method, path, Authorization header)."""

    url: str
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]


@pytest.fixture(params=CASES, ids=[name for name, _ in CASES])
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    variable, scheme = request.param
    return str(variable), str(scheme)


@pytest.fixture
def trap(case: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[ProxyTrap]:
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    proxy = ProxyTrap()
    monkeypatch.setenv(case[0], proxy.address)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def endpoint(
    case: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Endpoint]:
    """The issuer's JWKS (``/jwks``) and a gateway's status route, on loopback; over TLS
    under a private CA in ``SSL_CERT_FILE`` for the ``https`` cases."""
    authority = CertificateAuthority.create("no-proxy test CA")
    roots = tmp_path / "roots.pem"
    roots.write_bytes(authority.pem)
    monkeypatch.setenv("SSL_CERT_FILE", str(roots))
    seen: list[tuple[str, str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(("GET", self.path, self.headers.get("Authorization")))
            if self.path == "/jwks":
                document: Any = jwks_document()
            else:
                document = status_document(RUN_A)
            data = json.dumps(document).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    scheme = case[1]
    if scheme == "https":
        certificate, key = authority.issue_server((LOOPBACK,))
        (tmp_path / "endpoint.crt").write_bytes(certificate)
        (tmp_path / "endpoint.key").write_bytes(key)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(tmp_path / "endpoint.crt", tmp_path / "endpoint.key")
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="endpoint", daemon=True
    )
    thread.start()
    try:
        yield Endpoint(f"{scheme}://{LOOPBACK}:{httpd.server_address[1]}", seen)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(GUARD_SECONDS)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator-token"
    path.write_text("header.payload.signature\n")
    path.chmod(0o600)
    return path


def test_coordinatorctl_ignores_proxy_settings(
    trap: ProxyTrap,
    endpoint: Endpoint,
    token_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["status", "--run", RUN_A, "--url", endpoint.url, "--token-file", str(token_file)]
    code, out, err = run_cli([*args, "--output", "json"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out)["runId"] == RUN_A
    assert endpoint.requests == [("GET", f"/v1/runs/{RUN_A}", "Bearer header.payload.signature")]
    assert trap.close() == 0


async def test_the_console_api_client_ignores_proxy_settings(
    trap: ProxyTrap, endpoint: Endpoint, token_file: Path
) -> None:
    api = console.Api(console.Settings(api_url=endpoint.url, token_file=token_file))
    try:
        document = await asyncio.wait_for(api.call("GET", f"/v1/runs/{RUN_A}"), GUARD_SECONDS)
    finally:
        await api.close()
    assert document["runId"] == RUN_A
    assert endpoint.requests == [("GET", f"/v1/runs/{RUN_A}", "Bearer header.payload.signature")]
    assert trap.close() == 0


@pytest.fixture
def sockets_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gwp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def test_the_gateways_jwks_fetch_ignores_proxy_settings(
    trap: ProxyTrap, endpoint: Endpoint, tmp_path: Path, sockets_dir: Path
) -> None:
    """The gateway as :func:`gateway.service.serve` runs it: a token is verified with the
    keys fetched from ``jwksUrl``, and the proxy socket never hears of it."""
    document = complete_runtime(tmp_path)
    main_port, metrics_port = free_port(), free_port()
    document["deployment"]["listener"]["bind"] = f"{LOOPBACK}:{main_port}"
    path = gateway_runtime_file(tmp_path, document, sockets_dir, metrics_port)
    written = yaml.safe_load(path.read_text())
    written["deployment"]["authentication"]["signingKeys"] = {"jwksUrl": endpoint.url + "/jwks"}
    runtime = load_runtime(write_runtime(path, written))

    recovery, audit = FakeRecovery(), FakeAudit()
    servers = [grpc_server(runtime.endpoints, name) for name in ("recovery", "auditd")]
    pb_grpc.add_RecoveryServicer_to_server(recovery, servers[0])
    pb_grpc.add_AuditServicer_to_server(audit, servers[1])
    for srv in servers:
        await srv.start()
    now = int(time.time())
    token = mint("alice", "intake-portal", iat=now - 5, exp=now + 300)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(runtime, stop=stop))
    try:
        # The test's own client must not obey the variable either.
        async with httpx.AsyncClient(
            base_url=f"http://{LOOPBACK}:{main_port}", trust_env=False
        ) as client:
            answer = await asyncio.wait_for(
                client.get(f"/v1/runs/{RUN_A}", headers=bearer(token)), GUARD_SECONDS
            )
    finally:
        stop.set()
        await asyncio.wait_for(task, GUARD_SECONDS)
        for srv in servers:
            await srv.stop(None)

    assert answer.status_code == 200, answer.text
    assert "/jwks" in endpoint.paths()
    assert trap.close() == 0
