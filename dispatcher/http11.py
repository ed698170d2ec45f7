"""A lean HTTP/1.1 transport for httpx: the dispatcher's product calls and token requests.

httpx's own transport (httpcore) spent about half of the dispatcher's CPU in the bench:
a pure-Python HTTP state machine, anyio stream wrappers and pool bookkeeping around every
request. This one keeps httpx's client API and — what the call classification depends on —
its exception classes, and does the rest with an :class:`asyncio.Protocol` per connection
and the ``httptools`` parser (the one uvicorn uses).

Which failure is which matters more than speed (:mod:`dispatcher.classify`):

- nothing of the request left: the connection could not be opened
  (:class:`httpx.ConnectError`, :class:`httpx.ConnectTimeout`), no connection became free in
  time (:class:`httpx.PoolTimeout`), or the URL's scheme is not http/https
  (:class:`httpx.UnsupportedProtocol`);
- the request was written, and then no complete answer: the read timeout passed
  (:class:`httpx.ReadTimeout`), the product closed the connection
  (:class:`httpx.RemoteProtocolError`), the connection failed (:class:`httpx.ReadError`), or
  the answer could not be parsed (:class:`httpx.RemoteProtocolError`).

An idle connection is used again only if nothing arrived on it while idle (no end of
stream, no stray bytes), checked both from the protocol's callbacks and by asking the
socket right before the request is written; one idle longer than ``keepalive_expiry`` is
closed instead. The whole answer is read before the response is handed over, so a
connection goes back to the pool at once. The read timeout bounds the whole answer, writing
included (requests are small and written in one piece).

Requests through an HTTP proxy are not supported; :func:`dispatcher.engine.product_client`
uses httpx's own transport when the environment names one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import select
import ssl
import time
from collections.abc import Callable
from typing import cast

import httptools
import httpx

_DEFAULT_PORTS = {"http": 80, "https": 443}
_UNSAFE = re.compile(rb"[\r\n\x00]")


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: at most one exchange at a time."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._answer: asyncio.Future[None] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._headers_done = False
        self.keep_alive = False

    # --------------------------------------------------------------- asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports do not derive from asyncio.Transport, but have its methods.)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done() or self._parser is None:
            # Bytes nobody asked for: this connection's framing can no longer be trusted.
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(httpx.RemoteProtocolError("the answer is not valid HTTP/1.1"))
            self.close()

    def eof_received(self) -> bool | None:
        self.closed = True
        if self._awaiting():
            if self._headers_done and not self._framed():
                self._complete()  # a body delimited by the end of the connection
            else:
                self._fail(httpx.RemoteProtocolError("the product closed the connection"))
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._awaiting():
            if exc is None:
                self._fail(httpx.RemoteProtocolError("the product closed the connection"))
            else:
                self._fail(httpx.ReadError(f"the connection failed ({type(exc).__name__})"))

    # ------------------------------------------------------------ parser callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._status = self._parser.get_status_code()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._parser is not None
        if 100 <= self._status < 200:
            # An interim answer (103 Early Hints, say): the real one follows.
            self._headers, self._body, self._headers_done = [], [], False
            return
        self.keep_alive = self._parser.should_keep_alive()
        self._complete()

    # ------------------------------------------------------------------ one exchange

    def _awaiting(self) -> bool:
        return self._answer is not None and not self._answer.done()

    def _framed(self) -> bool:
        names = {name.lower() for name, _ in self._headers}
        return b"content-length" in names or b"transfer-encoding" in names

    def _complete(self) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)

    def usable(self) -> bool:
        """Whether an idle connection can carry another request: open, and nothing (an
        end of stream, stray bytes) waiting on its socket."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            poller = select.poll()  # (select() cannot take descriptors past 1023)
            poller.register(sock.fileno(), select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    async def exchange(self, data: bytes, timeout: float | None) -> httpx.Response:
        """Write one request and read its whole answer."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._answer = loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._status, self._headers, self._body = 0, [], []
        self._headers_done = self.keep_alive = False
        self.transport.write(data)
        try:
            async with asyncio.timeout(timeout):
                await self._answer
        except TimeoutError:
            raise httpx.ReadTimeout("no complete answer within the read timeout") from None
        finally:
            self._parser = None
        return httpx.Response(
            self._status,
            headers=self._headers,
            stream=httpx.ByteStream(b"".join(self._body)),
            extensions={"http_version": b"HTTP/1.1"},
        )

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http11Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive, for ``httpx.AsyncClient(transport=...)``."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 100,
        keepalive_expiry: float = 4.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ssl = ssl_context
        self._expiry = keepalive_expiry
        self._monotonic = monotonic
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._max = max_connections
        self._open = 0
        """Connections open now, idle or busy."""
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}")
        if request.method == "HEAD":
            raise httpx.UnsupportedProtocol("HEAD is not supported by this transport")
        timeouts = request.extensions.get("timeout", {})
        origin = (url.scheme, url.host, url.port or _DEFAULT_PORTS[url.scheme])
        body = await request.aread()
        for name, value in request.headers.raw:
            if _UNSAFE.search(name) or _UNSAFE.search(value):
                # What h11 refuses too (a header line break would forge another header).
                raise httpx.LocalProtocolError("a header name or value contains a line break")
        head = b"".join(
            [
                request.method.encode("ascii"),
                b" ",
                url.raw_path,
                b" HTTP/1.1\r\n",
                *(b"%s: %s\r\n" % (name, value) for name, value in request.headers.raw),
                b"\r\n",
            ]
        )
        conn = await self._acquire(origin, timeouts)
        try:
            response = await conn.exchange(head + body, timeouts.get("read"))
        except BaseException:
            conn.close()
            self._release(conn)
            raise
        if not conn.keep_alive:
            conn.close()
        self._release(conn)
        return response

    async def _acquire(
        self, origin: tuple[str, str, int], timeouts: dict[str, float | None]
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        pool_timeout = timeouts.get("pool")
        deadline = None if pool_timeout is None else loop.time() + pool_timeout
        while True:
            conn = self._take_idle(origin)
            if conn is not None:
                return conn
            if self._open >= self._max:
                self._evict_one_idle()
            if self._open < self._max:
                self._open += 1
                try:
                    return await self._connect(origin, timeouts.get("connect"))
                except BaseException:
                    self._open -= 1
                    self._wake_one()
                    raise
            # Full: wait until a connection is given back or closed, then look again.
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                raise httpx.PoolTimeout("no connection became free in time") from None
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _take_idle(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = self._monotonic()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < self._expiry and conn.usable():
                return conn
            self._discard(conn)
        return None

    def _evict_one_idle(self) -> None:
        """Make room for a new connection by closing an idle one of any origin."""
        for conns in self._idle.values():
            if conns:
                self._discard(conns.pop(0))
                return

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, origin: tuple[str, str, int], timeout: float | None) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        conn = _Connection(origin)
        tls = self._ssl_context() if scheme == "https" else None
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: conn, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except TimeoutError:
            conn.close()
            raise httpx.ConnectTimeout("connecting timed out") from None
        except (OSError, ssl.SSLError) as exc:
            conn.close()
            raise httpx.ConnectError(f"could not connect ({type(exc).__name__})") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.closed:
            self._open -= 1
        else:
            conn.idle_since = self._monotonic()
            self._idle.setdefault(conn.origin, []).append(conn)
        self._wake_one()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            while conns:
                self._discard(conns.pop())
