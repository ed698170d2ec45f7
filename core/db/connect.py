"""Open PostgreSQL connections the one way this service allows: TLS with a verified server.

Every URL must ask for TLS (``sslmode`` of ``require``, ``verify-ca`` or ``verify-full``).
Whatever the mode says, the server certificate chain *and* host name are always checked,
against the runtime file's private root when one is given, otherwise the system roots:
the weaker libpq modes would let anyone on the path pose as the database.

The URL is parsed here and its parts handed to asyncpg one by one, so no refusal or driver
error can echo the URL or its password. Refusals are ``deployment.refused`` and name only
``label`` (the key path of the URL) and the offending parameter.

A URL may name several hosts in libpq's form (``db-a:5432,db-b:5432``, CONTRACT §6.5):
they are tried in order and the first that accepts writes is used, as libpq does with
``target_session_attrs=read-write``. That is the only session kind this service opens,
whether the URL says so or not, so a read-only server (a standby, or one with
``default_transaction_read_only``) is never written to; with a single host that is read-only
the database counts as unreachable until it accepts writes. Each connection records which
host it reached (:func:`serving_host`), so a store can tell that a failover moved it.

A server can also vanish without a word: a machine lost, or cut off from the network, sends
no reset, and a statement waiting for its answer would wait for the kernel's retransmissions
(a quarter of an hour). Every connection therefore gives up on a peer that acknowledges
nothing for :data:`PEER_SILENCE_SECONDS` (TCP_USER_TIMEOUT) and probes one that is idle
(TCP keepalive), so the caller sees the database as away and reconnects, to the promoted
standby when there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg

from core.codes import Code
from core.db import statements
from core.errors import CoordinatorError

ACCEPTED_SSLMODES = ("require", "verify-ca", "verify-full")
MINIMUM_SERVER_VERSION_NUM = 170000
DEFAULT_CONNECT_TIMEOUT_S = 10.0
_SCHEMES = ("postgresql", "postgres")
_KNOWN_PARAMETERS = frozenset(
    {"sslmode", "application_name", "connect_timeout", "target_session_attrs"}
)
_WRITABLE_SESSIONS = ("read-write", "primary")
"""``target_session_attrs`` values a URL may give; either way, only a host that accepts
writes is used."""
PEER_SILENCE_SECONDS: Final = 15
"""How long a connection waits for a server to acknowledge anything it sent, or to answer
keepalive probes on an idle connection, before it counts as broken."""
_KEEPALIVE_IDLE_SECONDS: Final = 5
_KEEPALIVE_INTERVAL_SECONDS: Final = 2
_KEEPALIVE_PROBES: Final = 5

_NEXT_HOST_ERRORS = (
    OSError,
    asyncpg.TargetServerAttributeNotMatched,
    asyncpg.CannotConnectNowError,
    asyncpg.PostgresConnectionError,
)
"""Why one host of several is passed over for the next, as libpq passes it over: it cannot
be reached, its TLS handshake fails (``ssl.SSLError`` is an ``OSError``), it accepts no
writes, or it is starting or stopping. A refused login ends the attempt: every host would
refuse it the same way."""


def _refuse(label: str, reason: str) -> CoordinatorError:
    return CoordinatorError(Code.DEPLOYMENT_REFUSED, f"{label}: {reason}")


@dataclass(frozen=True)
class DatabaseHost:
    """One ``host:port`` a URL names."""

    host: str
    port: int

    def __str__(self) -> str:
        """``host:port`` (an IPv6 address in brackets), as ``doctor`` shows it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class DatabaseUrl:
    """The parts of a ``postgresql://`` URL this service uses; the password is never shown."""

    hosts: tuple[DatabaseHost, ...]
    """The hosts to try, in order (at least one)."""
    user: str
    database: str
    sslmode: str
    password: str | None = field(default=None, repr=False)
    application_name: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S

    @property
    def host(self) -> str:
        """The first host named."""
        return self.hosts[0].host

    @property
    def port(self) -> int:
        """The first host's port."""
        return self.hosts[0].port


def _hosts(netloc: str, label: str) -> tuple[DatabaseHost, ...]:
    """The comma-separated ``host[:port]`` list of a URL's network location."""
    hosts = []
    for entry in netloc.rpartition("@")[2].split(","):
        try:
            one = urllib.parse.urlsplit("//" + entry)
            port = one.port
        except ValueError:
            raise _refuse(label, "has an unreadable host or port") from None
        if not one.hostname:
            raise _refuse(
                label, "names no host; a TCP host is required (TLS cannot run on a socket)"
            )
        hosts.append(DatabaseHost(one.hostname, port or 5432))
    return tuple(hosts)


def parse_database_url(url: str, *, label: str = "database URL") -> DatabaseUrl:
    """Split a PostgreSQL URL into parts, refusing anything without TLS or with unknown options.

    Raises ``CoordinatorError('deployment.refused')``; the detail names ``label`` and the
    parameter at fault, never the URL or any of its values.
    """
    if "#" in url:
        raise _refuse(label, "contains '#'; percent-encode it (%23) inside a password")
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        # The ValueError text may quote part of the URL: drop it (and its chaining).
        raise _refuse(label, "is not a valid postgresql:// URL") from None
    if parts.scheme not in _SCHEMES:
        raise _refuse(label, "must start with postgresql://")
    hosts = _hosts(parts.netloc, label)
    if parts.username is None or not urllib.parse.unquote(parts.username):
        raise _refuse(label, "names no user")
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    database = urllib.parse.unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if "/" in database:
        raise _refuse(label, "has a path that is not a single database name")

    try:
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    except ValueError:
        raise _refuse(label, "has an unreadable query string") from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key not in _KNOWN_PARAMETERS:
            shown = key if key.isidentifier() and len(key) <= 40 else "(unreadable)"
            allowed = ", ".join(sorted(_KNOWN_PARAMETERS))
            raise _refuse(label, f"parameter {shown} is not supported (allowed: {allowed})")
        if key in params:
            raise _refuse(label, f"parameter {key} appears more than once")
        params[key] = value

    sslmode = params.get("sslmode")
    if sslmode is None:
        raise _refuse(label, f"sslmode is missing; use one of {', '.join(ACCEPTED_SSLMODES)}")
    if sslmode not in ACCEPTED_SSLMODES:
        raise _refuse(label, f"sslmode must be one of {', '.join(ACCEPTED_SSLMODES)}")

    if params.get("target_session_attrs", "read-write") not in _WRITABLE_SESSIONS:
        raise _refuse(
            label,
            "target_session_attrs must be read-write or primary (every component writes)",
        )

    timeout = DEFAULT_CONNECT_TIMEOUT_S
    if "connect_timeout" in params:
        try:
            timeout = float(int(params["connect_timeout"]))
        except ValueError:
            raise _refuse(label, "connect_timeout must be a whole number of seconds") from None
        if timeout <= 0:
            raise _refuse(label, "connect_timeout must be positive")

    return DatabaseUrl(
        hosts=hosts,
        user=user,
        database=database or user,  # libpq's default: a database named like the user
        sslmode=sslmode,
        password=password,
        application_name=params.get("application_name") or None,
        connect_timeout=timeout,
    )


class _OneWayClose(ssl.SSLObject):
    """Ends TLS by sending close_notify without waiting for the server's own.

    asyncio otherwise keeps the socket open until the server answers (up to 30 s); when a
    login is refused the server just exits, and a loop closed meanwhile (a CLI command, a
    test) leaks the socket. Not waiting is allowed by TLS 1.2 and 1.3 and is what libpq does.
    """

    def unwrap(self) -> None:
        with contextlib.suppress(ssl.SSLWantReadError):
            super().unwrap()


def client_ssl_context(
    trusted_root_pem: bytes | None, *, label: str = "database URL"
) -> ssl.SSLContext:
    """A TLS client context that verifies chain and host name.

    ``trusted_root_pem`` (one or more PEM certificates) replaces the system roots when given.
    """
    cadata: str | None = None
    if trusted_root_pem is not None:
        try:
            cadata = trusted_root_pem.decode("ascii")
        except UnicodeDecodeError:
            raise _refuse(label, "trusted root certificate is not PEM text") from None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=cadata)
    except (ssl.SSLError, ValueError):
        raise _refuse(label, "trusted root certificate could not be loaded as PEM") from None
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.sslobject_class = _OneWayClose
    return context


def _connect_kwargs(
    url: str,
    trusted_root_pem: bytes | None,
    server_settings: Mapping[str, str] | None,
    label: str,
) -> dict[str, Any]:
    parsed = parse_database_url(url, label=label)
    settings = dict(server_settings or {})
    if parsed.application_name and "application_name" not in settings:
        settings["application_name"] = parsed.application_name
    return {
        "hosts": parsed.hosts,
        "user": parsed.user,
        "password": parsed.password,
        "database": parsed.database,
        "ssl": client_ssl_context(trusted_root_pem, label=label),
        "timeout": parsed.connect_timeout,
        "server_settings": settings or None,
    }


async def connect(
    url: str,
    trusted_root_pem: bytes | None,
    *,
    server_settings: Mapping[str, str] | None = None,
    label: str = "database URL",
) -> asyncpg.Connection:
    """Open one verified TLS connection.

    URL refusals raise ``CoordinatorError('deployment.refused')``; failures to reach or
    authenticate come from asyncpg / ``ssl`` unchanged (``OSError``,
    ``ssl.SSLCertVerificationError``, ``asyncpg.PostgresError``) and carry no password.
    """
    kwargs = _connect_kwargs(url, trusted_root_pem, server_settings, label)
    return await _open(**kwargs)


class ServedConnection(asyncpg.Connection):  # type: ignore[misc]
    """A connection that knows which of the URL's hosts it reached."""

    __slots__ = ("serving",)

    serving: DatabaseHost


def serving_host(conn: asyncpg.Connection) -> DatabaseHost | None:
    """The host ``conn`` reached (``None`` for a connection this module did not open)."""
    found = getattr(conn, "serving", None)
    return found if isinstance(found, DatabaseHost) else None


async def _open(
    _dsn: None = None, *, hosts: tuple[DatabaseHost, ...], **kwargs: Any
) -> asyncpg.Connection:
    """A connection to the first of ``hosts`` that accepts writes (a pool passes a ``None``
    DSN first: every part is a keyword here).

    When every host is passed over, the first TLS failure is raised (a certificate that does
    not verify is the operator's to mend, and must not hide behind a later host that is
    merely down), else the last host's failure.
    """
    kwargs.pop("connection_class", None)  # (a pool names the class it expects: this one)
    last: BaseException | None = None
    tls_failure: ssl.SSLError | None = None
    for where in hosts:
        try:
            conn = await asyncpg.connect(
                host=where.host,
                port=where.port,
                target_session_attrs="read-write",
                connection_class=ServedConnection,
                **kwargs,
            )
        except _NEXT_HOST_ERRORS as exc:
            await asyncio.sleep(0)  # (see below)
            last = exc
            if isinstance(exc, ssl.SSLError) and tls_failure is None:
                tls_failure = exc
            continue
        except Exception:
            # A refused login closes the socket through a callback asyncpg has just scheduled;
            # one pass of the loop runs it, so no socket outlives a loop that closes next.
            await asyncio.sleep(0)
            raise
        conn.serving = where
        _watch_peer(conn)
        return conn
    if tls_failure is not None:
        raise tls_failure
    assert last is not None  # a URL names at least one host
    raise last


def _watch_peer(conn: asyncpg.Connection) -> None:
    """Give up on a silent server (see the module's docstring); Linux's socket options,
    set where the platform has them."""
    # asyncpg keeps its transport private; the socket is the asyncio transport's to show.
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), _KEEPALIVE_IDLE_SECONDS),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), _KEEPALIVE_INTERVAL_SECONDS),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), _KEEPALIVE_PROBES),
        (
            socket.IPPROTO_TCP,
            getattr(socket, "TCP_USER_TIMEOUT", None),
            PEER_SILENCE_SECONDS * 1000,
        ),
    ]
    for level, option, value in options:
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)


def quote_ident(name: str) -> str:
    """Quote a PostgreSQL identifier (role, database, schema) for use in SQL text."""
    if not name or "\x00" in name:
        raise ValueError("an identifier must be non-empty and contain no NUL")
    return '"' + name.replace('"', '""') + '"'


async def create_pool(
    url: str,
    trusted_root_pem: bytes | None,
    *,
    min_size: int,
    max_size: int,
    setup_role: str | None = None,
    admit: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    server_settings: Mapping[str, str] | None = None,
    label: str = "database URL",
) -> asyncpg.Pool:
    """A pool of verified TLS connections; with ``setup_role`` each new connection acts as
    that role (``SET ROLE``) once, for its life (a release resets nothing of the session).
    ``admit`` then sees each new connection before anyone uses it, and may refuse it by
    raising (the acquire that opened it raises the same)."""
    kwargs = _connect_kwargs(url, trusted_root_pem, server_settings, label)
    if setup_role is not None or admit is not None:
        kwargs["init"] = _initializer(setup_role, admit)
    pool: asyncpg.Pool = await asyncpg.create_pool(
        min_size=min_size,
        max_size=max_size,
        connect=_open,
        reset=_keep_session,
        connection_class=ServedConnection,
        **kwargs,
    )
    return pool


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """What a released connection needs beyond asyncpg's own clean-up: nothing.

    asyncpg always rolls back a transaction left open and drops listener callbacks; its
    default reset query (unlock advisory locks, close cursors, UNLISTEN, RESET ALL) would be
    one more round trip on every release for state this code never leaves behind: locks are
    transaction-scoped, no cursor outlives its transaction, the listener unlistens itself,
    and the only session setting is the component role, which must stay.
    """


def _initializer(
    role: str | None, admit: Callable[[asyncpg.Connection], Awaitable[None]] | None
) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def init(conn: asyncpg.Connection) -> None:
        if role is not None:
            await statements.role_set(conn, role=role)
        if admit is not None:
            await admit(conn)

    return init


async def server_version_num(conn: asyncpg.Connection) -> int:
    """The server's ``server_version_num`` (e.g. 170010 for 17.10)."""
    return await statements.server_version_num(conn)


async def require_server_version(
    conn: asyncpg.Connection, minimum: int = MINIMUM_SERVER_VERSION_NUM
) -> int:
    """Refuse (``deployment.refused``) a server older than ``minimum``; return its version."""
    version = await server_version_num(conn)
    if version < minimum:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"database: PostgreSQL {minimum // 10000} or newer is required "
            f"(server_version_num is {version})",
        )
    return version
