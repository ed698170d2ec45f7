"""An applied deployment with open admission and recovery stores, for in-process tests of
the serving components (no launcher, no child processes).

``served(tmp_path, database)`` applies a fresh namespace, builds the :class:`Runtime` the
launcher would (with Unix sockets in a short temporary folder, since socket paths are
limited to about 100 bytes), and opens and verifies one store per component.
``serving(admission=...)`` runs components' ``serve`` functions for the length of a block.
"""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import deploy
from core.config.model import CheckedDeployment
from core.keys import resolver_for
from core.rpc.transport import unix_endpoints
from core.runtime import Runtime, Store
from devstack.postgres import DatabaseHandle
from tests.helpers.deployment import TestDeployment, drop_deployment, migration_connection


@dataclass(frozen=True)
class Caller:
    """A verified caller, shaped like ``pb.Caller``."""

    iss: str = "https://issuer.example.org"
    sub: str = "alice"
    client_id: str = "intake-portal"
    operator: bool = False


def socket_runtime(
    checked: CheckedDeployment, sockets: Path, *, recovery_only: bool = False
) -> Runtime:
    """The :class:`Runtime` the launcher would build for ``checked``, with the components'
    Unix sockets in ``sockets`` (short, since socket paths are limited to about 100 bytes)."""
    return Runtime(
        checked=checked,
        resolver=resolver_for(checked.config),
        endpoints=unix_endpoints(sockets),
        recovery_only=recovery_only,
    )


@dataclass
class Served:
    """One applied deployment and the stores of the components under test."""

    deployment: TestDeployment
    runtime: Runtime
    stores: dict[str, Store]

    @property
    def namespace(self) -> str:
        return self.deployment.namespace

    @property
    def database(self) -> DatabaseHandle:
        return self.deployment.database

    def store(self, component: str) -> Store:
        return self.stores[component]

    async def owner_execute(self, sql: str, *args: Any) -> str:
        """Run one statement as the schema owner (``{ns}`` is the quoted namespace)."""
        conn = await migration_connection(self.database)
        try:
            return str(await conn.execute(sql.format(ns=f'"{self.namespace}"'), *args))
        finally:
            await conn.close()

    async def owner_fetch(self, sql: str, *args: Any) -> list[Any]:
        """Fetch rows as the schema owner (``{ns}`` is the quoted namespace)."""
        conn = await migration_connection(self.database)
        try:
            return list(await conn.fetch(sql.format(ns=f'"{self.namespace}"'), *args))
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path,
    database: DatabaseHandle,
    *,
    workflows: tuple[str, ...] = ("approval-notice",),
    components: tuple[str, ...] = ("admission", "recovery"),
    recovery_only: bool = False,
) -> AsyncIterator[Served]:
    """Apply a deployment of ``workflows`` and open a verified store per component."""
    deployment = TestDeployment.create(tmp_path, database, workflows=workflows)
    checked = deployment.checked()
    await deploy.apply(checked, [])
    sockets = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    runtime = socket_runtime(checked, sockets, recovery_only=recovery_only)
    stores: dict[str, Store] = {}
    try:
        for component in components:
            store = Store(runtime, component)
            stores[component] = store
            await store.open()
            await store.verify()
        yield Served(deployment, runtime, stores)
    finally:
        for store in stores.values():
            await store.close()
        shutil.rmtree(sockets, ignore_errors=True)
        await drop_deployment(database, deployment.namespace)


Server = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""A component's ``serve`` with its other arguments bound: it sets the event once listening."""

START_SECONDS = 30


@contextlib.asynccontextmanager
async def serving(**servers: Server) -> AsyncIterator[None]:
    """Run each named server until the block ends; enter the block once every one has
    started, and fail with the cause if one ends before."""
    loop = asyncio.get_running_loop()
    started = {name: asyncio.Event() for name in servers}
    tasks: dict[str, asyncio.Task[Any]] = {
        name: asyncio.create_task(server(started[name])) for name, server in servers.items()
    }
    waiting: dict[str, asyncio.Task[Any]] = {
        name: asyncio.create_task(event.wait()) for name, event in started.items()
    }
    try:
        deadline = loop.time() + START_SECONDS
        while waiting:
            done, _ = await asyncio.wait(
                [*tasks.values(), *waiting.values()],
                timeout=deadline - loop.time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
            for name, task in tasks.items():
                if task in done:
                    task.result()  # serve ended early: show why
                    raise AssertionError(f"{name} ended before it started")
            assert done, f"{', '.join(waiting)} did not start"
            waiting = {name: waiter for name, waiter in waiting.items() if waiter not in done}
        yield
    finally:
        for task in [*waiting.values(), *tasks.values()]:
            task.cancel()
        for task in tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
