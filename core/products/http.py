"""Outbound HTTP to products and the issuer, on aiohttp (CONTRACT §9.3).

aiohttp owns the HTTP/1.1 framing: its C parser, its connection pool, its header limits.
What this module adds is what a call's classification needs from it, and nothing else:

- one **deadline per exchange** (connect, write, the complete answer), the connection's
  ``callTimeoutSeconds``;
- the answer read as a stream and **capped**, raw and decoded (gzip and deflate are decoded
  here, under the same cap, so a small compressed body cannot grow past it);
- header lines up to 64 KiB each and 64 KiB in all;
- proxies in the environment ignored, redirects never followed;
- a pooled connection is used again only if it is provably clean: the answer ended exactly
  where its framing said, nothing arrived on it while it sat idle, and its socket has
  nothing to read. Bytes after a complete answer (a second message, half of one, a message
  sent late) close the connection, so they can never be read as the answer to a later
  request;
- every failure turned into one :class:`ExchangeFailure` saying whether a byte of the
  request can have left, and a value-free ``cause``.

Nothing here logs, and no message holds a URL query, header, body or token.
"""

from __future__ import annotations

import asyncio
import functools
import re
import select
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import aiohttp
from aiohttp import client_exceptions, http_exceptions
from aiohttp.client_proto import ResponseHandler

from core.errors import ConfigInvalid

MAX_BODY_BYTES: Final = 1 << 20
"""The largest answer body kept, raw and decoded (CONTRACT §9.3)."""
MAX_HEADER_BYTES: Final = 64 << 10
"""The largest header section, and the largest single header line."""
MAX_HEADERS: Final = 128
KEEPALIVE_SECONDS: Final = 2.0
"""Idle connections are closed after this long: below common servers' idle timeouts, so
a server rarely closes one just as it is used again."""
KEEPALIVE_ENV: Final = "COORDINATOR_PRODUCT_KEEPALIVE_SECONDS"
"""Overrides :data:`KEEPALIVE_SECONDS` (0 to 60; 0 opens a connection per exchange)."""
CONNECT_SECONDS: Final = 10.0
"""Connecting (and waiting for a pooled connection) is bounded by this or half the
exchange's deadline, whichever is less, so an unreachable product is a definite failure
before the deadline can make it an ambiguous one."""
POOL_SIZE: Final = 100

# Causes (CONTRACT §8.4) for an exchange whose request may have reached the product.
TIMEOUT_AFTER_SEND: Final = "timeout-after-send"
CONNECTION_LOST: Final = "connection-lost"
UNREADABLE_ANSWER: Final = "unreadable-answer"
FRAMING_VIOLATION: Final = "framing-violation"
ANSWER_TOO_LARGE: Final = "answer-too-large"
# And for one that certainly sent nothing.
NEVER_CONNECTED: Final = "never-connected"
"""The connection was never established: nothing left."""
UNSENDABLE: Final = "unsendable"
"""The request was refused here before anything was written (a header with a line break,
a URL aiohttp cannot send to)."""

_UNSAFE_HEADER: Final = re.compile(r"[\r\n\x00]")
_CONTENT_LENGTH: Final = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*(\d{1,19})[ \t]*\r\n", re.I)
_CHUNKED: Final = re.compile(rb"\r\ntransfer-encoding[ \t]*:[^\r\n]*chunked", re.I)
_HEAD_END: Final = b"\r\n\r\n"


class ExchangeFailure(Exception):
    """No usable answer. ``sent`` is False only when no byte of the request can have left."""

    def __init__(self, cause: str, *, sent: bool) -> None:
        super().__init__(cause)
        self.cause = cause
        self.sent = sent


@dataclass(frozen=True)
class Answer:
    """A complete answer: its status and its (decoded, capped) body."""

    status: int
    body: bytes


class Exchanger(Protocol):
    """What sends requests to products and the issuer: :class:`ProductHttp`, or a test's
    in-process stand-in router."""

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
        """One request and its complete answer; :class:`ExchangeFailure` otherwise."""
        ...

    async def close(self) -> None:
        """Let go of every connection."""
        ...


# --------------------------------------------------------------------- clean reuse


class _GuardedHandler(ResponseHandler):
    """aiohttp's connection protocol, counting what arrives so a connection is pooled only
    when its answer ended exactly where its framing said and nothing came after."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._received = 0
        self._head = b""
        self._head_end = -1
        self._last = b""
        self._released_at: int | None = None

    def set_response_params(self, *args: Any, **kwargs: Any) -> None:
        # A new exchange on this connection begins.
        self._received = 0
        self._head = b""
        self._head_end = -1
        self._last = b""
        self._released_at = None
        super().set_response_params(*args, **kwargs)

    def data_received(self, data: bytes) -> None:
        if self._head_end < 0 and len(self._head) <= MAX_HEADER_BYTES:
            start = max(0, len(self._head) - 3)
            self._head += data
            found = self._head.find(_HEAD_END, start)
            if found >= 0:
                self._head_end = found + len(_HEAD_END)
        self._received += len(data)
        self._last = (self._last + data)[-5:]
        super().data_received(data)

    def _ended_cleanly(self) -> bool:
        """Whether the bytes received are exactly one answer, by its own framing."""
        if self._head_end < 0:
            return False
        head = self._head[: self._head_end]
        if head.startswith(b"HTTP/1.1 1"):
            return False  # interim answers: not worth reasoning about, use a new connection
        length = _CONTENT_LENGTH.search(head)
        if length is not None:
            return self._received == self._head_end + int(length.group(1))
        if _CHUNKED.search(head):
            # (Trailers end otherwise: such a connection is simply not reused.)
            return self._last == b"0\r\n\r\n"
        return False  # framed by the end of the connection

    @property
    def should_close(self) -> bool:
        # aiohttp asks this when the answer is done, to pool the connection or close it.
        unclean = not self._ended_cleanly()
        self._released_at = self._received
        return bool(super().should_close) or unclean

    def is_connected(self) -> bool:
        # aiohttp asks this before it uses a pooled connection again.
        if self._released_at is not None and self._received != self._released_at:
            return False  # something arrived while it was idle
        if not super().is_connected():
            return False
        return not _readable(self.transport)


def keepalive_seconds(environ: Mapping[str, str]) -> float:
    """The idle keep-alive of outbound connections, from :data:`KEEPALIVE_ENV` if set."""
    value = environ.get(KEEPALIVE_ENV)
    if value is None:
        return KEEPALIVE_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= 60.0:
        raise ConfigInvalid(KEEPALIVE_ENV, "must be a number of seconds from 0 to 60")
    return seconds


def _readable(transport: asyncio.BaseTransport | None) -> bool:
    """Whether the socket has something to read (an end of stream, stray bytes)."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return True
    try:
        poller = select.poll()  # (select() cannot take descriptors past 1023)
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


# ------------------------------------------------------------------------ the client


class ProductHttp:
    """One pool of outbound connections, shared by a component's calls."""

    def __init__(
        self,
        *,
        keepalive_seconds: float = KEEPALIVE_SECONDS,
        max_body_bytes: int = MAX_BODY_BYTES,
        pool_size: int = POOL_SIZE,
    ) -> None:
        self._keepalive = keepalive_seconds
        self._max_body = max_body_bytes
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = (
                aiohttp.TCPConnector(
                    limit=self._pool_size, keepalive_timeout=self._keepalive, ttl_dns_cache=10
                )
                if self._keepalive > 0
                else aiohttp.TCPConnector(limit=self._pool_size, force_close=True, ttl_dns_cache=10)
            )
            # aiohttp's connection protocol, watched (see _GuardedHandler).
            connector._factory = functools.partial(  # type: ignore[assignment]
                _GuardedHandler, loop=asyncio.get_running_loop()
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                auto_decompress=False,
                max_line_size=MAX_HEADER_BYTES,
                max_field_size=MAX_HEADER_BYTES,
                max_headers=MAX_HEADERS,
                skip_auto_headers=("User-Agent",),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        """Send one request and read its whole answer within ``timeout`` seconds.

        Raises :class:`ExchangeFailure` for anything short of a complete, readable answer.
        """
        for name, value in headers.items():
            if _UNSAFE_HEADER.search(name) or _UNSAFE_HEADER.search(value):
                raise ExchangeFailure(UNSENDABLE, sent=False)
        session = self._open()
        connect = min(CONNECT_SECONDS, timeout / 2)
        sending = {**headers, "Accept-Encoding": "gzip, deflate"}
        try:
            async with asyncio.timeout(timeout):
                async with session.request(
                    method,
                    url,
                    data=body,
                    headers=sending,
                    allow_redirects=False,
                    ssl=tls if tls is not None else True,
                    timeout=aiohttp.ClientTimeout(total=None, connect=connect),
                ) as response:
                    return await self._answer(response)
        except ExchangeFailure:
            raise
        except TimeoutError as exc:
            if isinstance(exc, client_exceptions.ConnectionTimeoutError):
                raise ExchangeFailure(NEVER_CONNECTED, sent=False) from None
            raise ExchangeFailure(TIMEOUT_AFTER_SEND, sent=True) from None
        except Exception as exc:
            raise _failure(exc) from None

    async def _answer(self, response: aiohttp.ClientResponse) -> Answer:
        if response.status == 101 or 100 <= response.status < 200:
            # An upgrade (or an interim answer as the last word): not an HTTP answer at all.
            response.close()
            raise ExchangeFailure(FRAMING_VIOLATION, sent=True)
        size = sum(len(name) + len(value) + 4 for name, value in response.raw_headers)
        if size > MAX_HEADER_BYTES:
            response.close()
            raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
        if response.content_length is not None and response.content_length > self._max_body:
            response.close()
            raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
        decoder = _decoder(response.headers.get("Content-Encoding", ""))
        if decoder is _UNKNOWN:
            response.close()
            raise ExchangeFailure(UNREADABLE_ANSWER, sent=True)
        raw = 0
        parts: list[bytes] = []
        kept = 0
        async for chunk in response.content.iter_any():
            raw += len(chunk)
            if raw > self._max_body:
                response.close()
                raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
            decoded = chunk if decoder is None else _inflate(decoder, chunk, self._max_body - kept)
            kept += len(decoded)
            parts.append(decoded)
        if decoder is not None and not decoder.eof:
            response.close()
            raise ExchangeFailure(UNREADABLE_ANSWER, sent=True)
        return Answer(response.status, b"".join(parts))


_UNKNOWN: Final[Any] = object()


def _decoder(encoding: str) -> Any:
    """A zlib decompressor for the answer's Content-Encoding; None for identity."""
    value = encoding.strip().lower()
    if value in ("", "identity"):
        return None
    if value in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if value == "deflate":
        return zlib.decompressobj()
    return _UNKNOWN


def _inflate(decoder: Any, chunk: bytes, room: int) -> bytes:
    """Decode ``chunk``, refusing to produce more than ``room`` bytes."""
    try:
        decoded: bytes = decoder.decompress(chunk, room + 1)
    except zlib.error:
        raise ExchangeFailure(UNREADABLE_ANSWER, sent=True) from None
    if len(decoded) > room or decoder.unconsumed_tail:
        raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
    return decoded


def _failure(exc: BaseException) -> ExchangeFailure:
    """What aiohttp (or the socket) reported, as a cause; see CAUSES_TABLE."""
    for kind, cause, sent in FAILURES:
        if isinstance(exc, kind):
            if kind is client_exceptions.ClientResponseError:
                return ExchangeFailure(_parser_cause(exc), sent=True)
            return ExchangeFailure(cause, sent=sent)
    return ExchangeFailure(CONNECTION_LOST, sent=True)


def _parser_cause(exc: BaseException) -> str:
    """aiohttp reports its parser's refusals as a response error with status 400; the
    parser's own exception is further down the chain."""
    seen = exc.__cause__
    while seen is not None:
        if isinstance(seen, http_exceptions.LineTooLong):
            return ANSWER_TOO_LARGE
        if isinstance(seen, http_exceptions.BadStatusLine):
            return UNREADABLE_ANSWER
        if isinstance(seen, http_exceptions.BadHttpMessage) and "too many headers" in (
            str(seen.message).lower()
        ):
            # More header lines than MAX_HEADERS: aiohttp has no class of its own for it.
            return ANSWER_TOO_LARGE
        if isinstance(seen, http_exceptions.HttpProcessingError) and type(seen) is not (
            http_exceptions.HttpProcessingError
        ):
            return FRAMING_VIOLATION
        seen = seen.__cause__
    return FRAMING_VIOLATION


FAILURES: Final[tuple[tuple[type[BaseException], str, bool], ...]] = (
    # Nothing left: the connection never existed (refused, DNS, TLS handshake, connect
    # timeout, no pooled connection in time) or aiohttp refused the URL itself.
    (client_exceptions.ClientConnectorError, NEVER_CONNECTED, False),
    (client_exceptions.ConnectionTimeoutError, NEVER_CONNECTED, False),
    (client_exceptions.InvalidURL, UNSENDABLE, False),
    (client_exceptions.NonHttpUrlClientError, UNSENDABLE, False),
    # The request was (or may have been) written.
    (client_exceptions.ClientPayloadError, CONNECTION_LOST, True),
    (client_exceptions.ServerDisconnectedError, CONNECTION_LOST, True),
    (client_exceptions.ClientResponseError, FRAMING_VIOLATION, True),
    (client_exceptions.ClientOSError, CONNECTION_LOST, True),
    (ConnectionError, CONNECTION_LOST, True),
    (OSError, CONNECTION_LOST, True),
)
"""Which failure is which, first match wins. The order matters: aiohttp's connector errors
derive from its OS error class, and only they prove nothing was written."""
