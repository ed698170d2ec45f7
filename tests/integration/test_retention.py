"""Retention against the real TLS PostgreSQL server: which runs `retain` erases, that their
payload rows are really gone, what stays (tombstones, ids, states, timings, status and
inspection) and that a spent start identity is refused afterwards."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from admission.start import Admitter
from core.clock import ENV_VAR, format_instant, write_test_clock
from core.codes import Code
from core.errors import CoordinatorError
from core.products.http import ProductHttp
from devstack.postgres import DatabaseHandle
from recovery import reads
from recovery.env import RecoveryEnv
from recovery.operator import operator_action
from tests.helpers.deployment import migration_connection
from tests.helpers.serving import Caller, Served, served

pytestmark = pytest.mark.postgres

ALICE = Caller()
WORKFLOW = "approval-notice"
CALL = "call-notices"
T0 = datetime(2027, 1, 1, tzinfo=UTC)
MARKER = "MARKER-3e9a7c21"


@pytest.fixture
def clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test clock file, at :data:`T0`; every process and transaction reads it."""
    path = tmp_path / "clock"
    write_test_clock(path, T0)
    monkeypatch.setenv(ENV_VAR, str(path))
    return path


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle, clock: Path) -> AsyncIterator[Served]:
    async with served(tmp_path, database) as made:
        yield made


@pytest.fixture
async def recovery(env: Served) -> AsyncIterator[RecoveryEnv]:
    http = ProductHttp()
    try:
        yield RecoveryEnv.from_store(env.store("recovery"), http, recovery_only=False)
    finally:
        await http.close()


async def retain(
    recovery: RecoveryEnv, before: datetime, limit: int, *, dry_run: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {"before": format_instant(before), "limit": limit}
    if dry_run:
        body["dryRun"] = True
    return await operator_action(recovery, "retain", body)


def admitter(env: Served) -> Admitter:
    return Admitter.from_runtime(env.runtime, env.store("admission"))


async def start(env: Served, key: str) -> str:
    return (await admitter(env).start(ALICE, WORKFLOW, key, {"subjectRef": MARKER})).run_id


async def add_payload(env: Served, run_id: str, step_id: str, purpose: str) -> int:
    rows = await env.owner_fetch(
        "INSERT INTO {ns}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext) "
        "VALUES ($1, $2, $3, 1, $4, $5) RETURNING id",
        run_id,
        step_id,
        purpose,
        secrets.token_bytes(12),
        secrets.token_bytes(40),
    )
    return int(rows[0]["id"])


async def ran_two_calls(env: Served, key: str) -> str:
    """A run whose two call steps each stored a command, a response and an output."""
    run_id = await start(env, key)
    await env.owner_execute(
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state) "
        "VALUES ($1, 'call-again', 2, 'call', 'ready')",
        run_id,
    )
    for step_id in (CALL, "call-again"):
        command = await add_payload(env, run_id, step_id, "command")
        await add_payload(env, run_id, step_id, "response")
        await add_payload(env, run_id, step_id, "output")
        await env.owner_execute(
            "UPDATE {ns}.step SET state = 'completed', effect = 'accepted', attempts = 1, "
            "command_payload_id = $3, command_key = $4, due_at = NULL, ended_at = {ns}.now() "
            "WHERE run_id = $1 AND step_id = $2",
            run_id,
            step_id,
            command,
            secrets.token_hex(32),
        )
    return run_id


async def end_run(env: Served, run_id: str, ended_at: datetime, state: str = "succeeded") -> None:
    outcome = "notified" if state == "succeeded" else None
    await env.owner_execute(
        "UPDATE {ns}.run SET state = $2, outcome = $3, ended_at = $4, updated_at = $4 "
        "WHERE id = $1",
        run_id,
        state,
        outcome,
        ended_at,
    )


async def payload_count(env: Served, run_id: str) -> int:
    rows = await env.owner_fetch("SELECT count(*) AS n FROM {ns}.payload WHERE run_id = $1", run_id)
    return int(rows[0]["n"])


async def rows_of(env: Served, table: str, run_id: str) -> list[dict[str, Any]]:
    key = "id" if table == "run" else "run_id"
    rows = await env.owner_fetch(
        f"SELECT * FROM {{ns}}.{table} WHERE {key} = $1 ORDER BY 1", run_id
    )
    return [dict(row) for row in rows]


async def test_retain_erases_every_payload_and_keeps_the_run(
    env: Served, recovery: RecoveryEnv, clock: Path
) -> None:
    run_id = await ran_two_calls(env, "spent-key")
    await end_run(env, run_id, T0 + timedelta(days=1))
    identity = (await rows_of(env, "start_identity", run_id))[0]["identity"]
    keys = {step["command_key"] for step in await rows_of(env, "step", run_id)}
    run_before = (await rows_of(env, "run", run_id))[0]
    steps_before = await rows_of(env, "step", run_id)
    status_before = await reads.status(env.store("recovery"), run_id)
    inspection_before = await reads.inspection(env.store("recovery"), run_id)
    assert await payload_count(env, run_id) == 7  # input, and three per call
    erased_at = T0 + timedelta(days=40)
    write_test_clock(clock, erased_at)

    answer = await retain(recovery, T0 + timedelta(days=30), 10)

    assert answer == {"erased": 1, "runIds": [run_id]}
    assert await payload_count(env, run_id) == 0
    tombstones = await env.owner_fetch("SELECT kind, value, run_id, erased_at FROM {ns}.tombstone")
    assert {(row["kind"], row["value"]) for row in tombstones} == {
        ("start-identity", identity),
        *(("command-key", key) for key in keys),
    }
    assert all(row["run_id"] == run_id and row["erased_at"] == erased_at for row in tombstones)
    assert await rows_of(env, "start_identity", run_id) == []

    run_after = (await rows_of(env, "run", run_id))[0]
    assert run_after.pop("erased_at") == erased_at
    run_before.pop("erased_at")
    assert run_after == run_before
    # Steps keep their state, effect, key and timings; only the command reference is gone.
    steps_after = await rows_of(env, "step", run_id)
    assert all(step["command_payload_id"] is None for step in steps_after)
    for step in steps_before:
        step["command_payload_id"] = None
    assert steps_after == steps_before

    assert await reads.status(env.store("recovery"), run_id) == status_before
    inspection = await reads.inspection(env.store("recovery"), run_id)
    assert inspection["steps"] == inspection_before["steps"]
    assert MARKER not in json.dumps(inspection)

    with pytest.raises(CoordinatorError) as again:
        await admitter(env).start(ALICE, WORKFLOW, "spent-key", {"subjectRef": MARKER})
    assert again.value.code == "run.payload-erased"

    actions = await env.owner_fetch("SELECT run_id, kind, reason, at FROM {ns}.operator_action")
    assert [tuple(row) for row in actions] == [(None, "retain", None, erased_at)]


async def test_retain_touches_only_ended_settled_runs_before_the_cut_oldest_first(
    env: Served, recovery: RecoveryEnv, clock: Path
) -> None:
    # Created in one order, ended in another: retention goes by the end.
    second = await ran_two_calls(env, "second")
    first = await ran_two_calls(env, "first")
    third = await ran_two_calls(env, "third")
    await end_run(env, first, T0 + timedelta(days=1), "failed")
    await end_run(env, second, T0 + timedelta(days=2), "cancelled")
    await end_run(env, third, T0 + timedelta(days=3))
    live = await ran_two_calls(env, "live")
    recent = await ran_two_calls(env, "recent")
    await end_run(env, recent, T0 + timedelta(days=20))
    # Cancelled long ago, but its call's effect is still unknown: kept for reconcile.
    uncertain = await start(env, "uncertain")
    await env.owner_execute(
        "UPDATE {ns}.step SET state = 'uncertain', effect = 'unknown', command_key = $2, "
        "due_at = NULL WHERE run_id = $1",
        uncertain,
        secrets.token_hex(32),
    )
    await end_run(env, uncertain, T0, "cancelled")
    kept = {run_id: await payload_count(env, run_id) for run_id in (live, recent, uncertain)}
    write_test_clock(clock, T0 + timedelta(days=40))
    cut = T0 + timedelta(days=10)

    # A dry run names exactly what the same retain then erases, and erases nothing.
    assert await retain(recovery, cut, 2, dry_run=True) == {
        "dryRun": True,
        "erased": 0,
        "wouldErase": 2,
        "runIds": [first, second],
    }
    assert await payload_count(env, first) > 0 and await payload_count(env, second) > 0
    assert await retain(recovery, cut, 2) == {"erased": 2, "runIds": [first, second]}
    # Another transaction holding a run (a concurrent retain, say) makes this one skip it.
    blocker = await migration_connection(env.database)
    try:
        async with blocker.transaction():
            await blocker.execute(
                f'SELECT 1 FROM "{env.namespace}".run WHERE id = $1 FOR UPDATE', third
            )
            assert await retain(recovery, cut, 100) == {"erased": 0, "runIds": []}
    finally:
        await blocker.close()
    assert await retain(recovery, cut, 100) == {"erased": 1, "runIds": [third]}
    assert await retain(recovery, cut, 100) == {"erased": 0, "runIds": []}

    for run_id in (first, second, third):
        assert await payload_count(env, run_id) == 0
    for run_id, count in kept.items():
        assert await payload_count(env, run_id) == count > 0
        assert len(await rows_of(env, "start_identity", run_id)) == 1
        assert (await rows_of(env, "run", run_id))[0]["erased_at"] is None
    tombstoned = await env.owner_fetch("SELECT DISTINCT run_id FROM {ns}.tombstone")
    assert {row["run_id"] for row in tombstoned} == {first, second, third}

    # The cut is exclusive: a run that ended exactly at it stays.
    assert await retain(recovery, T0 + timedelta(days=20), 100) == {"erased": 0, "runIds": []}
    assert (await retain(recovery, T0 + timedelta(days=20, microseconds=1), 100))["runIds"] == [
        recent
    ]


async def test_retain_refuses_a_cutoff_later_than_now_and_erases_nothing(
    env: Served, recovery: RecoveryEnv, clock: Path
) -> None:
    ended = await ran_two_calls(env, "ended")
    await end_run(env, ended, T0 + timedelta(days=1))
    write_test_clock(clock, T0 + timedelta(days=2))
    before = await payload_count(env, ended)
    for dry_run in (False, True):
        with pytest.raises(CoordinatorError) as caught:
            # A mistyped year: a year from now.
            await retain(recovery, T0 + timedelta(days=367), 100, dry_run=dry_run)
        assert caught.value.code == Code.REQUEST_INVALID
        assert caught.value.detail == "/before: the cutoff is later than now"
    assert await payload_count(env, ended) == before > 0
    # A moment ago is fine.
    assert await retain(recovery, T0 + timedelta(days=2) - timedelta(seconds=1), 100) == {
        "erased": 1,
        "runIds": [ended],
    }


async def test_retain_takes_dry_run_only_as_a_boolean(recovery: RecoveryEnv) -> None:
    body = {"before": format_instant(T0), "limit": 1, "dryRun": "yes"}
    with pytest.raises(CoordinatorError) as caught:
        await operator_action(recovery, "retain", body)
    assert (caught.value.code, caught.value.detail) == (
        Code.REQUEST_INVALID,
        "/dryRun: must be true or false",
    )
