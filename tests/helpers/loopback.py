"""The stand-ins behind real sockets: the same :class:`HostRouter`, reached over 127.0.0.1.

:class:`LoopbackHttp` is the coordinator's real client (:class:`core.products.http.ProductHttp`)
pointed at one uvicorn server on a loopback port. Each request keeps its original ``Host``;
the server rebuilds the URL from it and hands the request to the router, which records it
and routes it by host as it does in-process. So a test module written against the router
(faults, replaced products, recorded requests) runs unchanged with the real client's framing,
connections and deadlines on the path. A host the router does not serve is sent to a port nothing
listens on: the connection is refused, as for a product that is down. A stand-in that
drops the connection (or fails) aborts the real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httpx
import uvicorn
from starlette.types import Receive, Scope, Send

from core.products.http import Answer, ProductHttp
from devstack.products.faults import ABORT_STATE_KEY
from devstack.products.serving import DroppingH11Protocol
from tests.helpers.devstack_kit import HostRouter

LOOPBACK = "127.0.0.1"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
    return port


class _Front:
    """The ASGI app in front of the router."""

    def __init__(self, router: HostRouter, schemes: dict[str, str]) -> None:
        self._router = router
        self._schemes = schemes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = [(bytes(k), bytes(v)) for k, v in scope["headers"]]
        host = dict(headers).get(b"host", b"").decode()
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = scope.get("query_string") or b""
        url = f"{self._schemes.get(host, 'http')}://{host}{scope['raw_path'].decode()}"
        if query:
            url += "?" + query.decode()
        request = httpx.Request(scope["method"], url, headers=headers, content=body)
        try:
            response = await self._router.handle_async_request(request)
            content = await response.aread()
        except Exception:
            # The stand-in dropped the connection (or failed): so does the socket.
            abort = (scope.get("state") or {}).get(ABORT_STATE_KEY)
            if abort is not None:
                abort()
            return
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [
                    (k, v)
                    for k, v in response.headers.raw
                    if k.lower() not in (b"content-length", b"transfer-encoding")
                ]
                + [(b"content-length", str(len(content)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": content})


class LoopbackHttp:
    """An :class:`core.products.http.Exchanger` that sends everything to the router's apps
    over a real loopback connection (see the module docstring)."""

    def __init__(self, router: HostRouter) -> None:
        self._router = router
        self._schemes: dict[str, str] = {}
        self._http = ProductHttp()
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._port = 0
        self._down = _closed_port()

    async def start(self) -> None:
        """Serve the router on a loopback port (in the running loop)."""
        sock = socket.socket()
        sock.bind((LOOPBACK, 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            _Front(self._router, self._schemes),
            http=DroppingH11Protocol,
            lifespan="off",
            log_level="critical",
            access_log=False,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        # Started here, so the port is listening when start() returns; the main loop (which
        # only watches for should_exit) and the shutdown run in the background.
        await server.startup(sockets=[sock])
        self._server = server
        self._serving = asyncio.create_task(self._run(server, sock))

    @staticmethod
    async def _run(server: uvicorn.Server, sock: socket.socket) -> None:
        await server.main_loop()
        await server.shutdown(sockets=[sock])

    async def exchange(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> Answer:
        parts = urlsplit(url)
        host = parts.netloc
        self._schemes[host] = parts.scheme
        port = self._port if self._router.serves(host) else self._down
        local = f"http://{LOOPBACK}:{port}{parts.path}" + (f"?{parts.query}" if parts.query else "")
        return await self._http.exchange(
            method, local, headers={**headers, "Host": host}, body=body, timeout=timeout
        )

    async def close(self) -> None:
        await self._http.close()
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving


@contextlib.asynccontextmanager
async def loopback(router: HostRouter) -> AsyncIterator[LoopbackHttp]:
    """A started :class:`LoopbackHttp`, closed on exit."""
    http = LoopbackHttp(router)
    await http.start()
    try:
        yield http
    finally:
        await http.close()
