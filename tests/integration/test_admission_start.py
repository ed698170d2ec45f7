"""Each outcome of ``admission_start``, driven through the Admitter against the real
database: what it answers, what it writes (only a created run writes anything) and how many
statements it costs (a valid start is one; an input that does not fit, one read)."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core import derive
from core.clock import timestamp
from core.errors import CoordinatorError
from core.runtime import Store
from devstack.postgres import DatabaseHandle
from tests.helpers.admitting import admitter, refused
from tests.helpers.deployment import migration_connection
from tests.helpers.serving import Caller, Served, served

pytestmark = pytest.mark.postgres

ALICE = Caller()
WORKFLOW = "approval-notice"
VALID = {"subjectRef": "S-1"}
OTHER = {"subjectRef": "S-2"}
INVALID = {"subjectRef": "S-1", "extra": True}
# Fits the schema but has no canonical form (a lone surrogate is no UTF-8): refused only
# when made canonical, after the schema.
UNCANONICAL = {"subjectRef": "\ud800"}
# Every table a start writes to, and the one retention leaves behind.
WRITTEN = ("run", "binding", "payload", "start_identity", "step")
TABLES = (*WRITTEN, "tombstone")


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Served]:
    async with served(tmp_path, database, components=("admission",)) as made:
        yield made


async def counts(env: Served) -> dict[str, int]:
    """Rows per table a start can touch."""
    found = {}
    for table in TABLES:
        rows = await env.owner_fetch(f"SELECT count(*) AS n FROM {{ns}}.{table}")
        found[table] = int(rows[0]["n"])
    return found


NOTHING = dict.fromkeys(TABLES, 0)
ONE_RUN = {**dict.fromkeys(WRITTEN, 1), "tombstone": 0}


class Recorder:
    """A pooled connection that notes each statement (and each transaction) it is given."""

    def __init__(self, conn: Any, sent: list[str]) -> None:
        self._conn = conn
        self._sent = sent

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._conn, name)
        if name not in ("execute", "fetch", "fetchrow", "fetchval", "transaction"):
            return attribute

        def noted(*args: Any, **kwargs: Any) -> Any:
            self._sent.append("BEGIN" if name == "transaction" else str(args[0]))
            return attribute(*args, **kwargs)

        return noted


def record_statements(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements (``BEGIN`` for a transaction) ``store``'s connections are given from
    now on."""
    sent: list[str] = []
    pooled = store.connection

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[Any]:
        async with pooled() as conn:
            yield Recorder(conn, sent)

    monkeypatch.setattr(store, "connection", connection)
    return sent


async def test_created_writes_the_run_with_everything_of_it_in_one_statement(
    env: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = env.store("admission")
    sent = record_statements(store, monkeypatch)

    result = await admitter(env).start(ALICE, WORKFLOW, "key-1", VALID)

    # One statement, without BEGIN and COMMIT: PostgreSQL runs it as its own transaction.
    assert sent == [store.queries["admission_start"]]
    assert result.created is True
    assert await counts(env) == ONE_RUN
    run_ids = {
        table: (await env.owner_fetch(f"SELECT run_id FROM {{ns}}.{table}"))[0]["run_id"]
        for table in WRITTEN[1:]
    }
    assert set(run_ids.values()) == {result.run_id}, run_ids
    key = env.runtime.resolver.read_key(env.runtime.config.deployment.admission_key_ref)
    identity = derive.api_start_identity(key, ALICE.iss, ALICE.sub, WORKFLOW, "key-1")
    stored = await env.owner_fetch("SELECT identity, run_id FROM {ns}.start_identity")
    assert (stored[0]["identity"], stored[0]["run_id"]) == (identity, result.run_id)
    step = (await env.owner_fetch("SELECT step_id, seq, state, due_at FROM {ns}.step"))[0]
    assert (step["step_id"], step["seq"], step["state"]) == ("call-notices", 1, "ready")
    assert step["due_at"] is not None
    run = (await env.owner_fetch("SELECT * FROM {ns}.run"))[0]
    assert result.status["createdAt"] == timestamp(run["created_at"])
    assert result.status["state"] == run["state"] == "running"


async def test_known_answers_the_run_as_it_is_now_and_writes_nothing(
    env: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await admitter(env).start(ALICE, WORKFLOW, "key-1", VALID)
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'waiting', attention = true WHERE id = $1", first.run_id
    )
    before = await env.owner_fetch("SELECT * FROM {ns}.payload")
    store = env.store("admission")
    sent = record_statements(store, monkeypatch)

    again = await admitter(env).start(ALICE, WORKFLOW, "key-1", VALID)

    assert sent == [store.queries["admission_start"]]
    assert (again.created, again.run_id) == (False, first.run_id)
    assert (again.status["state"], again.status["attention"]) == ("waiting", True)
    assert again.status["workflow"] == first.status["workflow"]
    assert await counts(env) == ONE_RUN
    assert await env.owner_fetch("SELECT * FROM {ns}.payload") == before


async def test_conflict_refuses_another_input_and_writes_nothing(env: Served) -> None:
    await admitter(env).start(ALICE, WORKFLOW, "key-1", VALID)
    digest = await env.owner_fetch("SELECT input_digest FROM {ns}.start_identity")

    await refused("start.conflict", admitter(env).start(ALICE, WORKFLOW, "key-1", OTHER))

    assert await counts(env) == ONE_RUN
    assert await env.owner_fetch("SELECT input_digest FROM {ns}.start_identity") == digest


async def test_erased_refuses_the_key_and_writes_nothing(env: Served) -> None:
    first = await admitter(env).start(ALICE, WORKFLOW, "key-1", VALID)
    # What retention leaves: the identity moved to a tombstone, the payloads gone.
    await env.owner_execute(
        "WITH gone AS (DELETE FROM {ns}.start_identity RETURNING identity, run_id) "
        "INSERT INTO {ns}.tombstone (kind, value, run_id) "
        "SELECT 'start-identity', identity, run_id FROM gone"
    )
    await env.owner_execute("DELETE FROM {ns}.payload WHERE run_id = $1", first.run_id)
    after_retention = await counts(env)

    # The same input and another one alike: the key is spent.
    for value in (VALID, OTHER):
        await refused("run.payload-erased", admitter(env).start(ALICE, WORKFLOW, "key-1", value))

    assert await counts(env) == after_retention
    assert after_retention["tombstone"] == 1 and after_retention["start_identity"] == 0


async def test_admission_held_refuses_a_valid_input_and_writes_nothing(env: Served) -> None:
    await env.owner_execute("UPDATE {ns}.hold SET admission_hold = true")
    await refused("admission.held", admitter(env).start(ALICE, WORKFLOW, "key-1", VALID))
    assert await counts(env) == NOTHING


async def test_admission_held_is_judged_before_an_input_that_does_not_fit(
    env: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    await env.owner_execute("UPDATE {ns}.hold SET admission_hold = true")
    store = env.store("admission")
    sent = record_statements(store, monkeypatch)

    for value in (INVALID, UNCANONICAL):
        await refused("admission.held", admitter(env).start(ALICE, WORKFLOW, "key-1", value))

    assert sent == [store.queries["admission_gate"]] * 2
    assert await counts(env) == NOTHING


async def test_an_input_that_does_not_fit_costs_one_read_when_nothing_holds(
    env: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = env.store("admission")
    sent = record_statements(store, monkeypatch)

    await refused("input.invalid", admitter(env).start(ALICE, WORKFLOW, "key-1", INVALID))
    await refused("input.invalid", admitter(env).start(ALICE, WORKFLOW, "key-2", UNCANONICAL))

    assert sent == [store.queries["admission_gate"]] * 2
    assert await counts(env) == NOTHING


async def test_activation_changed_refuses_before_the_hold_and_the_input(env: Served) -> None:
    await env.owner_execute("UPDATE {ns}.deployment SET activation_serial = activation_serial + 1")
    await env.owner_execute("UPDATE {ns}.hold SET admission_hold = true")
    for value in (VALID, INVALID, UNCANONICAL):
        await refused(
            "deployment.activation-changed",
            admitter(env).start(ALICE, WORKFLOW, "key-1", value),
        )
    assert await counts(env) == NOTHING


async def test_the_refusals_come_before_a_known_identity(env: Served) -> None:
    await admitter(env).start(ALICE, WORKFLOW, "key-1", VALID)
    await env.owner_execute("UPDATE {ns}.hold SET admission_hold = true")
    # Even the same start again, which would otherwise answer its run.
    await refused("admission.held", admitter(env).start(ALICE, WORKFLOW, "key-1", VALID))
    await env.owner_execute("UPDATE {ns}.deployment SET activation_serial = activation_serial + 1")
    await refused(
        "deployment.activation-changed", admitter(env).start(ALICE, WORKFLOW, "key-1", VALID)
    )
    assert await counts(env) == ONE_RUN


async def test_a_start_that_loses_the_race_with_another_input_conflicts(env: Served) -> None:
    # Hold the run table so both starts have judged the identity new and queue on their
    # insert; releasing it lets one win while the other hits the primary key, runs the
    # statement again and finds the winner's identity with the other input.
    blocker = await migration_connection(env.database)
    try:
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute(f'LOCK TABLE "{env.namespace}".run IN SHARE MODE')
        starts = [
            asyncio.ensure_future(admitter(env).start(ALICE, WORKFLOW, "key-1", value))
            for value in (VALID, OTHER)
        ]
        await _wait_for_lock_waiters(env, 2)
        await transaction.rollback()
        results = await asyncio.gather(*starts, return_exceptions=True)
    finally:
        await blocker.close()

    created = [result for result in results if not isinstance(result, BaseException)]
    refusals = [result for result in results if isinstance(result, CoordinatorError)]
    assert len(created) == 1 and created[0].created is True
    assert [error.code for error in refusals] == ["start.conflict"]
    assert await counts(env) == ONE_RUN


async def _wait_for_lock_waiters(env: Served, expected: int) -> None:
    """Return once ``expected`` sessions wait for a lock on the run table (each round is a
    query; pg_locks shows other roles' waits, pg_stat_activity would not)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        rows = await env.owner_fetch(
            "SELECT count(*) AS n FROM pg_locks "
            "WHERE relation = '{ns}.run'::regclass AND NOT granted"
        )
        if rows[0]["n"] >= expected:
            return
    raise AssertionError(f"{expected} starts never queued on the run table")
