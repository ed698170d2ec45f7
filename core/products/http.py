"""Outbound HTTP to products and the issuer (CONTRACT §9.3).

**One exchange per connection.** An HTTP/1.1 answer does not name the request it answers,
so an answer that arrives late on a kept-alive connection (a second ``201`` written after
the first, say) cannot be told apart from the answer to the next request written on it. No
check of an idle connection closes that window; not reusing connections does. Every
exchange here opens its own connection, writes ``Connection: close`` with its request,
takes the first complete answer and closes the connection: whatever the product writes
after that answer is dropped with the socket, never parsed, never anyone's answer.

h11 (the framing library uvicorn and httpx's h11 backend also build on) turns the bytes
into events; asyncio's streams carry them. What this module adds is what a call's
classification needs:

- one **deadline per exchange** (connect, write, the complete answer), the connection's
  ``callTimeoutSeconds``, with connecting bounded on its own so that an unreachable product
  is a definite failure before the deadline can make it an ambiguous one;
- the answer **capped**: the head at 64 KiB and 128 lines, the body at 1 MiB raw and
  decoded (gzip and deflate are decoded here, under the same cap, so a small compressed
  body cannot grow past it), and a compressed body must end where its framing ends;
- framing that h11 tolerates but a product must not send refused: a ``Content-Length``
  beside ``Transfer-Encoding``;
- nothing taken from the environment (no proxy, no ``.netrc``), redirects never followed;
- every failure turned into one :class:`ExchangeFailure` saying whether a byte of the
  request can have left, and a value-free ``cause``.

Nothing here logs, and no message holds a URL query, header, body or token.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import h11

from core.errors import ConfigInvalid

MAX_BODY_BYTES: Final = 1 << 20
"""The largest answer body kept, raw and decoded (CONTRACT §9.3)."""
MAX_HEADER_BYTES: Final = 64 << 10
"""The largest answer head (status line and header lines)."""
MAX_HEADERS: Final = 128
CONNECT_SECONDS: Final = 10.0
"""Connecting (and waiting for a free connection slot) is bounded by this or half the
exchange's deadline, whichever is less."""
POOL_SIZE: Final = 100
"""Connections open at once, per component."""
READ_BYTES: Final = 64 << 10
RETIRED_KEEPALIVE_ENV: Final = "COORDINATOR_PRODUCT_KEEPALIVE_SECONDS"
"""No longer read: connections are never kept (see the module docstring). A component
refuses to start while it is set, so nobody believes it still has an effect."""

# Causes (CONTRACT §8.4) for an exchange whose request may have reached the product.
TIMEOUT_AFTER_SEND: Final = "timeout-after-send"
CONNECTION_LOST: Final = "connection-lost"
UNREADABLE_ANSWER: Final = "unreadable-answer"
FRAMING_VIOLATION: Final = "framing-violation"
ANSWER_TOO_LARGE: Final = "answer-too-large"
# And for one that certainly sent nothing.
NEVER_CONNECTED: Final = "never-connected"
"""The connection was never established: nothing left."""
TLS_REFUSED: Final = "tls-refused"
"""The TLS handshake failed (an untrusted, expired or misnamed certificate): nothing left,
but an operator must see it (CONTRACT §9.3, "Untrusted endpoints are visible")."""
UNSENDABLE: Final = "unsendable"
"""The request was refused here before anything was written (a header with a line break,
a URL that cannot be sent to)."""

_UNSAFE_HEADER: Final = re.compile(r"[\r\n\x00]")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


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
    retry_after: str | None = None
    """The ``Retry-After`` header as the product wrote it (:func:`retry_after_seconds`
    reads it), when it sent one."""


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Seconds a ``Retry-After`` value asks to wait (RFC 9110 §10.2.3): delay-seconds, or an
    HTTP-date counted from ``now``; None for no value or one that is neither (ignored, as a
    client may)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit() and len(text) <= 10:
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None  # an HTTP-date is always GMT; a date without a zone is not one
    return max(0.0, (when - now).total_seconds())


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


def refuse_retired_settings(environ: Mapping[str, str]) -> None:
    """Refuse :data:`RETIRED_KEEPALIVE_ENV` if it is set, naming it."""
    if RETIRED_KEEPALIVE_ENV in environ:
        raise ConfigInvalid(
            RETIRED_KEEPALIVE_ENV,
            "is no longer read: every product and issuer exchange uses a connection of its "
            "own; unset it",
        )


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    https: bool
    request: bytes
    """The whole request, framed: ready to write once connected."""
    framer: h11.Connection
    """The request's framer, which now expects its answer."""


def _target(method: str, url: str, headers: Mapping[str, str], body: bytes | None) -> _Target:
    """Parse ``url`` and frame the request, or refuse it as unsendable before anything is
    opened."""
    for name, value in headers.items():
        if _UNSAFE_HEADER.search(name) or _UNSAFE_HEADER.search(value):
            raise ExchangeFailure(UNSENDABLE, sent=False)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ExchangeFailure(UNSENDABLE, sent=False) from None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in _DEFAULT_PORTS or not host or parts.username is not None:
        raise ExchangeFailure(UNSENDABLE, sent=False)
    authority = f"[{host}]" if ":" in host else host
    if port is not None:
        authority += f":{port}"
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    # A caller's own Host stands (a test's loopback front routes by it).
    given_host = any(name.lower() == "host" for name in headers)
    sending = [
        *([] if given_host else [("Host", authority)]),
        *headers.items(),
        ("Accept-Encoding", "gzip, deflate"),
        ("Connection", "close"),
    ]
    if body is not None:
        sending.append(("Content-Length", str(len(body))))
    framer = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
    try:
        request = framer.send(h11.Request(method=method, target=target, headers=sending))
        if body:
            request += framer.send(h11.Data(data=body))
        request += framer.send(h11.EndOfMessage())
    except (h11.LocalProtocolError, UnicodeError):
        raise ExchangeFailure(UNSENDABLE, sent=False) from None
    return _Target(host, port or _DEFAULT_PORTS[scheme], scheme == "https", request, framer)


# ------------------------------------------------------------------------ the client


class ProductHttp:
    """Outbound exchanges of one component: each on a connection of its own, at most
    ``pool_size`` open at once."""

    def __init__(self, *, max_body_bytes: int = MAX_BODY_BYTES, pool_size: int = POOL_SIZE) -> None:
        self._max_body = max_body_bytes
        self._slots = asyncio.Semaphore(pool_size)
        self._system_roots: ssl.SSLContext | None = None
        self._open: set[asyncio.StreamWriter] = set()

    def _default_tls(self) -> ssl.SSLContext:
        # Loading the system roots costs milliseconds: once per client, not per call.
        if self._system_roots is None:
            from core.products.tls import product_ssl_context

            self._system_roots = product_ssl_context(None)
        return self._system_roots

    async def close(self) -> None:
        """Close the connections of exchanges still running."""
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

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
        target = _target(method, url, headers, body)
        context = (tls or self._default_tls()) if target.https else None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await self._connect(target, context, timeout)
                self._open.add(writer)
                try:
                    # Written without waiting for the product to read it: an answer that
                    # comes before the body is taken all the same.
                    writer.write(target.request)
                    return await self._answer(reader, target.framer)
                finally:
                    self._open.discard(writer)
                    writer.transport.abort()
                    self._slots.release()
        except ExchangeFailure:
            raise
        except TimeoutError:
            raise ExchangeFailure(TIMEOUT_AFTER_SEND, sent=True) from None
        except Exception:
            # A reset, a broken pipe, a TLS alert after the handshake: written, maybe read.
            raise ExchangeFailure(CONNECTION_LOST, sent=True) from None

    async def _connect(
        self, target: _Target, context: ssl.SSLContext | None, timeout: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A slot and a connection, both within the connect bound: waiting for a slot sends
        nothing either, so running out of time there is as definite as a refused connect.
        The caller releases the slot once done with the connection."""
        try:
            async with asyncio.timeout(min(CONNECT_SECONDS, timeout / 2)):
                await self._slots.acquire()
                try:
                    return await asyncio.open_connection(
                        target.host,
                        target.port,
                        ssl=context,
                        server_hostname=target.host if context is not None else None,
                        limit=READ_BYTES,
                    )
                except BaseException:
                    self._slots.release()
                    raise
        except ssl.SSLError:
            # (Before OSError: ssl.SSLError is one.) The handshake failed; nothing was sent.
            raise ExchangeFailure(TLS_REFUSED, sent=False) from None
        except (OSError, TimeoutError, UnicodeError):
            raise ExchangeFailure(NEVER_CONNECTED, sent=False) from None

    async def _answer(self, reader: asyncio.StreamReader, framer: h11.Connection) -> Answer:
        status = 0
        opening = b""
        decoder: Any = None
        parts: list[bytes] = []
        raw = kept = 0
        ended = False
        retry_after: str | None = None
        while True:
            try:
                event = framer.next_event()
            except h11.RemoteProtocolError as exc:
                cause = _protocol_cause(exc, status=status, ended=ended, opening=opening)
                raise ExchangeFailure(cause, sent=True) from None
            if event is h11.NEED_DATA:
                data = await reader.read(READ_BYTES)
                ended = not data
                if len(opening) < len(_HTTP):
                    opening += data[: len(_HTTP)]
                framer.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue  # 100 Continue and the like; a 101 is refused by h11 itself
            if isinstance(event, h11.Response):
                status = event.status_code
                decoder = self._head(event)
                retry_after = next(
                    (v.decode("latin-1") for n, v in event.headers if n == b"retry-after"), None
                )
            elif isinstance(event, h11.Data):
                raw += len(event.data)
                if raw > self._max_body:
                    raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
                chunk = bytes(event.data)
                if decoder is not None:
                    chunk = _inflate(decoder, chunk, self._max_body - kept)
                kept += len(chunk)
                parts.append(chunk)
            elif isinstance(event, h11.EndOfMessage):
                if decoder is not None and (not decoder.eof or decoder.unused_data):
                    # Cut short, or more after the compressed stream's end (junk, a second
                    # gzip member): not the body the product meant, whatever it holds.
                    raise ExchangeFailure(UNREADABLE_ANSWER, sent=True)
                return Answer(status, b"".join(parts), retry_after)
            else:  # ConnectionClosed before the answer ended
                raise ExchangeFailure(CONNECTION_LOST, sent=True)

    def _head(self, response: h11.Response) -> Any:
        """Check an answer's head; the body's decoder (None for identity)."""
        if len(response.headers) > MAX_HEADERS:
            raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
        size = len(response.reason) + 15
        lengths: list[bytes] = []
        chunked = False
        encoding = b""
        for name, value in response.headers:
            size += len(name) + len(value) + 4
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"content-encoding":
                encoding = value
        if size > MAX_HEADER_BYTES:
            raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
        if lengths and chunked:
            # A length beside chunked: whichever this client believed, something on the
            # path may have believed the other (request smuggling's shape). (Repeated equal
            # lengths reach here as one, as RFC 9110 §8.6 allows; unequal ones h11 refuses.)
            raise ExchangeFailure(FRAMING_VIOLATION, sent=True)
        if lengths and int(lengths[0]) > self._max_body:
            raise ExchangeFailure(ANSWER_TOO_LARGE, sent=True)
        decoder = _decoder(encoding.decode("latin-1"))
        if decoder is _UNKNOWN:
            raise ExchangeFailure(UNREADABLE_ANSWER, sent=True)
        return decoder


_HTTP: Final = b"HTTP/"


def _protocol_cause(
    exc: h11.RemoteProtocolError, *, status: int, ended: bool, opening: bytes
) -> str:
    """What h11's refusal means: the head too long to be an answer we keep, the
    connection ending inside the answer, no HTTP at all, or broken framing."""
    if exc.error_status_hint == 431:
        return ANSWER_TOO_LARGE  # the head outgrew MAX_HEADER_BYTES before it ended
    if ended:
        return CONNECTION_LOST
    if status == 0 and not opening.startswith(_HTTP[: len(opening)]):
        return UNREADABLE_ANSWER  # not an HTTP answer at all
    return FRAMING_VIOLATION


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
