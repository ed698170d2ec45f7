"""What every serving component shares at startup: the checked runtime file, secrets,
internal endpoints, and a database store with its own component role.

A component builds one :class:`Runtime`, opens one :class:`Store` for its grant, and calls
:meth:`Store.verify` before serving. While PostgreSQL is unreachable the store says so once
per 10 s on standard error (``store-unavailable``), reports not ready, and keeps trying.

The runtime URL may name several hosts (CONTRACT §6.5); every connection goes to one that
accepts writes. After the database was away, or when a new connection reaches another host
than the one verified (a failover), that connection runs the activation checks again before
anyone may use it; when they fail, it is refused with ``deployment.refused`` (logged once per
10 s) and so is every use of the store until a host passes them. A write refused because the
server has become read-only (a demoted primary) drops every pooled connection, so the next
ones find the new writable host.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from core import logs
from core.codes import Code
from core.config.check import check_runtime_file
from core.config.model import CheckedDeployment, RuntimeConfig
from core.db.connect import DatabaseHost, create_pool, serving_host
from core.db.roles import component_role
from core.db.statements import Statements
from core.deploy.activation import verify_activation
from core.deploy.database import RUNTIME_LABEL, read_url, translate, trusted_root
from core.deploy.model import Activation
from core.errors import CoordinatorError
from core.keys import resolver_for
from core.rpc.transport import Endpoints, TlsMaterial, default_socket_dir, unix_endpoints
from core.secrets import SecretResolver

STORE_NOTICE_INTERVAL_SECONDS = 10.0
# The all-in-one process shares 32 connections; each component's share of that budget.
POOL_SIZES = {"admission": 6, "dispatcher": 14, "recovery": 6, "audit": 2}
# The components that run statements per run plan them once per connection: PostgreSQL
# would otherwise plan the dispatcher's claim afresh on every call (its LIMIT makes the
# generic plan look dearer than each custom one, so it never switches; planning was a
# quarter of a claim, issue 43), and likewise statements inside the transition functions
# that read array arguments. tests/integration/test_plans_at_scale.py holds every named
# query and transition function to its generic plan, so these are the plans it checked.
# Recovery keeps PostgreSQL's choice: an operator's list is worth a plan for its values.
GENERIC_PLANS = {"plan_cache_mode": "force_generic_plan"}
GENERIC_PLAN_COMPONENTS = frozenset({"admission", "dispatcher"})


def raw(code: str, detail: str = "") -> None:
    """One line on standard error that starts with a raw code (CONTRACT §15); under the
    JSON log format, one JSON record whose message starts with it."""
    line = f"{code}: {detail}" if detail else code
    if logs.json_format():
        logs.log.warning("%s", line)
        return
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class Runtime:
    """The checked runtime file and what follows from it."""

    checked: CheckedDeployment
    resolver: SecretResolver
    endpoints: Endpoints
    recovery_only: bool

    @property
    def config(self) -> RuntimeConfig:
        """The runtime file."""
        return self.checked.config


def endpoints_for(config: RuntimeConfig, resolver: SecretResolver) -> Endpoints:
    """The internal endpoints the runtime file asks for (Unix sockets by default)."""
    internal = config.deployment.internal
    if internal is None:
        return unix_endpoints(default_socket_dir(config.namespace))
    if internal.socket_dir is not None:
        return unix_endpoints(internal.socket_dir)
    tls = internal.tls
    if tls is None:
        raise CoordinatorError(Code.DEPLOYMENT_REFUSED, "deployment.internal.tls is required")
    material = TlsMaterial(
        certificate=resolver.read_bytes(tls.certificate_ref),
        private_key=resolver.read_bytes(tls.private_key_ref),
        trusted_root=resolver.read_bytes(tls.trusted_root_certificate_ref),
    )
    addresses = {name: f"{bind.host}:{bind.port}" for name, bind in internal.addresses.items()}
    return Endpoints(addresses, material)


def load_runtime(path: Path, *, recovery_only: bool = False) -> Runtime:
    """Check the runtime file and its packages; resolve the secret providers."""
    checked = check_runtime_file(path)
    resolver = resolver_for(checked.config)
    return Runtime(checked, resolver, endpoints_for(checked.config, resolver), recovery_only)


class Store:
    """A component's pool of runtime-role connections, each ``SET ROLE`` to its grant."""

    def __init__(
        self, runtime: Runtime, component: str, clock: Callable[[], float] = time.monotonic
    ):
        self.runtime = runtime
        self.component = component
        self.role = component_role(runtime.config.namespace, component)
        self.queries = Statements(runtime.config.namespace)
        self._pool: asyncpg.Pool | None = None
        self._clock = clock
        self._last_notice = -STORE_NOTICE_INTERVAL_SECONDS
        self.available = False
        self.activation: Activation | None = None
        self._verified_host: DatabaseHost | None = None
        self._recheck = False
        self._check_lock = asyncio.Lock()
        self._last_refusal = -STORE_NOTICE_INTERVAL_SECONDS

    def notice_unavailable(self) -> None:
        """Log ``store-unavailable`` at most once per 10 s; mark the store not ready."""
        self.available = False
        self._recheck = True
        now = self._clock()
        if now - self._last_notice >= STORE_NOTICE_INTERVAL_SECONDS:
            self._last_notice = now
            raw("store-unavailable", f"{self.component}: the database cannot be reached")

    async def open(self) -> None:
        """Create the pool (retrying while the database is unreachable) and verify it."""
        config = self.runtime.config
        url = read_url(config, self.runtime.resolver, "runtime")
        root = trusted_root(config, self.runtime.resolver)
        while self._pool is None:
            try:
                self._pool = await create_pool(
                    url,
                    root,
                    min_size=1,
                    max_size=POOL_SIZES.get(self.component, 4),
                    setup_role=self.role,
                    admit=self._admit,
                    server_settings=(
                        GENERIC_PLANS if self.component in GENERIC_PLAN_COMPONENTS else None
                    ),
                    label=RUNTIME_LABEL,
                )
            except Exception as exc:
                coded = translate(exc, RUNTIME_LABEL)
                if coded is None or coded.code != Code.STORE_UNAVAILABLE:
                    raise (coded or exc) from None
                self.notice_unavailable()
                await asyncio.sleep(1.0)
        self.available = True

    async def verify(self) -> Activation:
        """Verify the activation (§6.4) on one of the pool's connections."""
        async with self.connection() as conn:
            self.activation = await verify_activation(
                conn, self.runtime.checked, resolver=self.runtime.resolver
            )
            self._verified_host = serving_host(conn)
            self._recheck = False
        return self.activation

    async def _admit(self, conn: asyncpg.Connection) -> None:
        """Run the activation checks again on a new connection when the database was away
        or the connection reached another host than the one verified (§6.5)."""
        if self.activation is None:
            return  # not verified yet: :meth:`verify` checks the first connection itself
        async with self._check_lock:
            where = serving_host(conn)
            if where == self._verified_host and not self._recheck:
                return
            try:
                await verify_activation(conn, self.runtime.checked, resolver=self.runtime.resolver)
            except CoordinatorError as refused:
                now = self._clock()
                if now - self._last_refusal >= STORE_NOTICE_INTERVAL_SECONDS:
                    self._last_refusal = now
                    raw(
                        refused.code,
                        f"{self.component}: the database at {where} failed the activation "
                        f"checks, nothing resumes: {refused.detail}",
                    )
                raise
            if where != self._verified_host:
                logs.log.warning(
                    "%s: the database moved to %s; the activation checks passed there",
                    self.component,
                    where,
                )
            self._verified_host = where
            self._recheck = False

    @property
    def pool(self) -> asyncpg.Pool:
        """The open pool."""
        if self._pool is None:
            raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database is not connected yet")
        return self._pool

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """One pooled connection; losing the database becomes ``service.unavailable``.

        A connection that broke under its user counts as the database being away whatever
        the driver raised: when the server goes while a transaction is open, what surfaces
        is often a bare ``InterfaceError`` from leaving the transaction block (the
        connection is closed), not one of the connection errors :func:`translate` knows.
        """
        lost = False
        try:
            async with self.pool.acquire() as conn:
                try:
                    yield conn
                except Exception:
                    lost = _lost(conn)
                    raise
            self.available = True
        except CoordinatorError:
            raise
        except Exception as exc:
            coded = translate(exc, RUNTIME_LABEL)
            if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
                # The server stopped taking writes (a primary demoted under us): nothing was
                # written; every pooled connection goes, so the next find the writable host.
                await self.pool.expire_connections()
                lost = True
            if lost or (coded is not None and coded.code == Code.STORE_UNAVAILABLE):
                self.notice_unavailable()
                raise CoordinatorError(
                    Code.SERVICE_UNAVAILABLE, "the database cannot be reached"
                ) from None
            raise

    async def close(self) -> None:
        """Close the pool, waiting at most a few seconds for connections to return."""
        if self._pool is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._pool.close()
            self._pool.terminate()
            self._pool = None


def _lost(conn: asyncpg.Connection) -> bool:
    """Whether a pooled connection broke while it was in use: it is closed, or the pool has
    taken it back already, which asyncpg does as soon as a connection it lent out closes."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True
