"""A component's pooled connections: one statement without BEGIN/COMMIT, and a release
that keeps the session (the component role) but never an open transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import pytest

from core.db.roles import component_role
from core.payloads import statement, transaction
from core.runtime import Store
from devstack.postgres import DatabaseHandle
from tests.helpers.dispatching import DispatchKit, dispatch_kit
from tests.helpers.pinned_clock import T0

pytestmark = pytest.mark.postgres


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


async def _store(kit: DispatchKit) -> Store:
    store = Store(kit.runtime, "dispatcher")
    kit.stores.append(store)
    await store.open()
    return store


async def test_one_statement_runs_outside_an_explicit_transaction(kit: DispatchKit) -> None:
    store = await _store(kit)
    async with statement(store) as conn:
        assert not conn.is_in_transaction()
        # Its own implicit transaction: the statement's xid is gone once it ends.
        first = await conn.fetchval("SELECT txid_current()")
        second = await conn.fetchval("SELECT txid_current()")
        assert second != first
    async with transaction(store) as conn:
        assert conn.is_in_transaction()


async def test_under_the_test_clock_one_statement_still_sees_the_fake_now(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    store = await _store(kit)
    async with statement(store) as conn:
        assert conn.is_in_transaction()
        assert await conn.fetchval(f"SELECT {kit.ns}.now()") == T0


async def test_a_released_connection_keeps_its_role_and_no_transaction(
    kit: DispatchKit,
) -> None:
    store = await _store(kit)
    role = component_role(kit.deployment.namespace, "dispatcher")
    for _ in range(3):  # the pool may hand back the same connection each time
        async with store.connection() as conn:
            assert await conn.fetchval("SELECT current_user::text") == role
            assert not conn.is_in_transaction()
            # Left open on purpose: the release must roll it back.
            await conn.execute("BEGIN")
            await conn.execute("SELECT set_config('coordinator.probe', 'x', true)")
    async with store.connection() as conn:
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT current_setting('coordinator.probe', true)") in (
            None,
            "",
        )


@pytest.mark.parametrize(
    ("component", "mode"),
    [
        ("dispatcher", "force_generic_plan"),
        ("admission", "force_generic_plan"),
        ("recovery", "auto"),
    ],
)
async def test_the_per_run_components_plan_each_statement_once_per_connection(
    kit: DispatchKit, component: str, mode: str
) -> None:
    store = Store(kit.runtime, component)
    kit.stores.append(store)
    await store.open()
    async with store.connection() as conn:
        assert await conn.fetchval("SELECT current_setting('plan_cache_mode')") == mode
        # A statement whose LIMIT makes every custom plan look cheaper than the generic
        # one: the dispatcher's and admission's sessions still keep one generic plan.
        limited = await conn.prepare(f"SELECT step_id FROM {kit.ns}.step ORDER BY due_at LIMIT $1")
        for _ in range(8):
            await limited.fetch(2)
        plans = await conn.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'SELECT step_id FROM%'"
        )
        assert plans is not None
        if mode == "force_generic_plan":
            assert (plans["generic_plans"], plans["custom_plans"]) == (8, 0)
        else:
            assert plans["custom_plans"] >= 5
