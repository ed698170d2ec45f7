"""The internal gRPC channels ignore proxy settings in the environment (CONTRACT §9.3: every
outbound client of every component). gRPC core reads ``grpc_proxy``, ``https_proxy`` and
``http_proxy`` for TCP targets unless a channel says otherwise; a component on a network
with a proxy configured must still talk to its peers directly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from core.rpc.transport import Endpoints, TlsMaterial, channel
from devstack.postgres_tls import LOOPBACK, CertificateAuthority

PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy", "HTTPS_PROXY", "HTTP_PROXY")


class CountingProxy:
    """A listening socket that counts the connections it is offered and drops each."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._drop, LOOPBACK, 0)
        self.address = f"http://{LOOPBACK}:{self._server.sockets[0].getsockname()[1]}"

    async def _drop(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def proxy() -> AsyncIterator[CountingProxy]:
    counting = CountingProxy()
    await counting.start()
    try:
        yield counting
    finally:
        await counting.close()


def _echo(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
    return b"echo:" + request


@pytest.mark.parametrize("variable", PROXY_VARIABLES)
async def test_an_internal_tcp_channel_goes_straight_to_its_peer(
    proxy: CountingProxy, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    for name in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, proxy.address)
    ca = CertificateAuthority.create("Internal test CA")
    certificate, key = ca.issue_server(("localhost", LOOPBACK), client_auth=True)
    tls = TlsMaterial(certificate=certificate, private_key=key, trusted_root=ca.pem)
    peer = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    peer.add_generic_rpc_handlers((handler,))
    port = peer.add_secure_port(
        "localhost:0",
        grpc.ssl_server_credentials(
            [(key, certificate)], root_certificates=ca.pem, require_client_auth=True
        ),
    )
    await peer.start()
    try:
        talking = Endpoints({"auditd": f"localhost:{port}"}, tls)
        async with channel(talking, "auditd") as link:
            say = link.unary_unary("/test.Echo/Say")
            answer = await say(b"hello", timeout=10.0)
    finally:
        await peer.stop(None)
    assert answer == b"echo:hello"
    assert proxy.connections == 0
