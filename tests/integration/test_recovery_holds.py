"""The restore holds against the real TLS PostgreSQL server: what restore-hold snapshots,
the order release-restore-hold and release-admission-hold enforce, and that admission,
doctor and metrics follow the holds in the database.

The operator's settling of snapshotted steps (reconcile, retry-same, cancel) is simulated
with the writes those actions make, as the schema owner, so these tests depend only on the
hold actions themselves."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from admission.start import Admitter
from core.actions import members_of
from core.errors import CoordinatorError
from core.products.http import ProductHttp
from core.rpc import coordinator_pb2 as pb
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
REASON = "INC-2027-0042"
EXECUTION = {
    "recoveryReference": "RESTORE-7",
    "executionHistoryComplete": True,
    "priorDeploymentFenced": True,
}
ADMISSION = {
    "recoveryReference": "RESTORE-7/admission",
    "admissionHistoryComplete": True,
    "priorDeploymentFenced": True,
}


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Served]:
    async with served(tmp_path, database) as made:
        yield made


@pytest.fixture
async def recovery(env: Served) -> AsyncIterator[RecoveryEnv]:
    http = ProductHttp()
    try:
        yield RecoveryEnv.from_store(env.store("recovery"), http, recovery_only=False)
    finally:
        await http.close()


async def act(recovery: RecoveryEnv, action: str, body: dict[str, Any]) -> dict[str, Any]:
    return await operator_action(recovery, action, body)


async def refused(code: str, action: Any) -> CoordinatorError:
    with pytest.raises(CoordinatorError) as caught:
        await action
    assert caught.value.code == code, caught.value
    return caught.value


async def start(env: Served, key: str) -> str:
    admitter = Admitter.from_runtime(env.runtime, env.store("admission"))
    return (await admitter.start(ALICE, WORKFLOW, key, {"subjectRef": "S"})).run_id


async def set_call(env: Served, run_id: str, assignments: str, *args: Any) -> None:
    """Shape run ``run_id``'s first (call) step; ``$2..`` in ``assignments`` are ``args``."""
    await env.owner_execute(
        "UPDATE {ns}.step SET " + assignments + f" WHERE run_id = $1 AND step_id = '{CALL}'",
        run_id,
        *args,
    )


async def hold_run(env: Served, run_id: str) -> None:
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'held', attention = true WHERE id = $1", run_id
    )


async def steps_by_run(env: Served) -> dict[tuple[str, str], dict[str, Any]]:
    rows = await env.owner_fetch("SELECT * FROM {ns}.step")
    return {(row["run_id"], row["step_id"]): dict(row) for row in rows}


async def runs_by_id(env: Served) -> dict[str, dict[str, Any]]:
    return {row["id"]: dict(row) for row in await env.owner_fetch("SELECT * FROM {ns}.run")}


async def hold_row(env: Served) -> tuple[bool, bool, int]:
    row = (await env.owner_fetch("SELECT * FROM {ns}.hold"))[0]
    return (row["execution_hold"], row["admission_hold"], row["epoch"])


async def operator_log(env: Served) -> list[tuple[str | None, str, str | None]]:
    rows = await env.owner_fetch(
        "SELECT run_id, kind, reason FROM {ns}.operator_action ORDER BY id"
    )
    return [(row["run_id"], row["kind"], row["reason"]) for row in rows]


async def observed_holds(env: Served) -> tuple[dict[str, bool], dict[str, str]]:
    """The holds as doctor reports them and the coordinator_holds gauge's samples."""
    store = env.store("recovery")
    doctor = await reads.doctor(store, audit_ready=True, recovery_only=False)
    samples = {
        line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
        for line in (await reads.metrics_text(store)).splitlines()
        if line.startswith("coordinator_holds{")
    }
    return doctor["holds"], samples


def gauge(execution: bool, admission: bool) -> dict[str, str]:
    return {
        'coordinator_holds{hold="execution"}': str(float(execution)),
        'coordinator_holds{hold="admission"}': str(float(admission)),
    }


# ------------------------------------------------------------------------------ the snapshot


async def _shape_deployment(env: Served) -> dict[str, str]:
    """One run per kind of call step a restore must or must not hold; answers their ids."""
    runs = {
        name: await start(env, name)
        for name in (
            "prepared-leased",
            "uncertain",
            "retry-pending",
            "leased-unprepared",
            "not-sent",
            "cancelled-uncertain",
            "due-fresh",
            "accepted-then-waiting",
            "succeeded",
        )
    }
    lease = (
        "lease_owner = 'dispatcher-1', lease_expires_at = {ns}.now() + interval '30 s', "
        "lease_epoch = 0"
    )
    await set_call(
        env,
        runs["prepared-leased"],
        "state = 'prepared', command_key = $2, prepared_at = {ns}.now(), attempts = 1, " + lease,
        "a" * 64,
    )
    await set_call(
        env,
        runs["uncertain"],
        "state = 'uncertain', effect = 'unknown', command_key = $2, due_at = NULL, attempts = 1",
        "b" * 64,
    )
    await hold_run(env, runs["uncertain"])
    # A retryable answer came back: the stored command goes out again later, same key.
    await set_call(
        env,
        runs["retry-pending"],
        "command_key = $2, attempts = 1, due_at = {ns}.now() + interval '1 minute'",
        "c" * 64,
    )
    # Claimed but not yet prepared: the holder may have prepared and sent since the backup.
    await set_call(env, runs["leased-unprepared"], lease)
    await set_call(
        env,
        runs["not-sent"],
        "state = 'not-sent', command_key = $2, due_at = NULL, attempts = 1",
        "d" * 64,
    )
    await hold_run(env, runs["not-sent"])
    # A cancel without onCancel ended this run; its uncertain call stays for review.
    await set_call(
        env,
        runs["cancelled-uncertain"],
        "state = 'uncertain', effect = 'unknown', command_key = $2, due_at = NULL",
        "e" * 64,
    )
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'cancelled', cancelling = true, attention = true, "
        "ended_at = {ns}.now() WHERE id = $1",
        runs["cancelled-uncertain"],
    )
    done = (
        "state = 'completed', effect = 'accepted', command_key = $2, due_at = NULL, "
        "attempts = 1, ended_at = {ns}.now()"
    )
    await set_call(env, runs["accepted-then-waiting"], done, "f" * 64)
    await env.owner_execute(
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at, lease_owner, "
        "lease_expires_at, lease_epoch) VALUES ($1, 'pause', 2, 'wait-until', 'waiting', "
        "{ns}.now() - interval '1 s', 'dispatcher-1', {ns}.now() + interval '30 s', 0)",
        runs["accepted-then-waiting"],
    )
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'waiting' WHERE id = $1", runs["accepted-then-waiting"]
    )
    await set_call(env, runs["succeeded"], done, "0" * 64)
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'succeeded', outcome = 'notified', ended_at = {ns}.now() "
        "WHERE id = $1",
        runs["succeeded"],
    )
    return runs


SNAPSHOTTED = (
    "prepared-leased",
    "uncertain",
    "retry-pending",
    "leased-unprepared",
    "not-sent",
    "cancelled-uncertain",
)


async def test_restore_hold_sets_both_holds_and_holds_every_possibly_sent_call(
    env: Served, recovery: RecoveryEnv
) -> None:
    runs = await _shape_deployment(env)
    steps_before = await steps_by_run(env)
    runs_before = await runs_by_id(env)

    answer = await act(recovery, "restore-hold", {"reason": REASON})

    assert answer == {
        "holds": {"execution": True, "admission": True},
        "epoch": 1,
        "snapshot": {"steps": len(SNAPSHOTTED), "runs": len(SNAPSHOTTED)},
    }
    assert await hold_row(env) == (True, True, 1)
    record = (await env.owner_fetch("SELECT * FROM {ns}.recovery_record"))[0]
    assert (record["epoch"], record["restore_reason"]) == (1, REASON)
    assert record["execution_recovered_at"] is None and record["restore_released_at"] is None
    snapshot = await env.owner_fetch("SELECT * FROM {ns}.restore_snapshot")
    assert {(row["run_id"], row["step_id"]) for row in snapshot} == {
        (runs[name], CALL) for name in SNAPSHOTTED
    }
    assert all(row["epoch"] == 1 and row["resolution"] is None for row in snapshot)

    steps_after = await steps_by_run(env)
    runs_after = await runs_by_id(env)
    for name in SNAPSHOTTED:
        step = steps_after[(runs[name], CALL)]
        assert (step["state"], step["effect"], step["due_at"]) == ("uncertain", "unknown", None)
        assert (step["lease_owner"], step["lease_expires_at"], step["lease_epoch"]) == (
            None,
            None,
            None,
        )
        # The command and its key stay: reconcile asks for this key, retry-same resends it.
        assert step["command_key"] == steps_before[(runs[name], CALL)]["command_key"]
    for name in SNAPSHOTTED[:-1]:
        assert (runs_after[runs[name]]["state"], runs_after[runs[name]]["attention"]) == (
            "held",
            True,
        )
    # An ended run stays ended; its uncertain step still waits for the operator.
    assert runs_after[runs["cancelled-uncertain"]] == runs_before[runs["cancelled-uncertain"]]

    # Nothing possibly sent there: a fresh due call, accepted and ended calls, ended runs.
    for name in ("due-fresh", "accepted-then-waiting", "succeeded"):
        assert steps_after[(runs[name], CALL)] == steps_before[(runs[name], CALL)], name
        assert runs_after[runs[name]] == runs_before[runs[name]], name
    # A wait under a lease only loses the lease and is due again at its time.
    pause_before = steps_before[(runs["accepted-then-waiting"], "pause")]
    pause = steps_after[(runs["accepted-then-waiting"], "pause")]
    assert (pause["state"], pause["due_at"], pause["lease_owner"], pause["lease_epoch"]) == (
        "waiting",
        pause_before["due_at"],
        None,
        None,
    )

    assert await operator_log(env) == [(None, "restore-hold", REASON)]
    doctor = await reads.doctor(env.store("recovery"), audit_ready=True, recovery_only=False)
    assert doctor["holds"] == {"execution": True, "admission": True}
    assert doctor["state"]["uncertain"] == len(SNAPSHOTTED)
    assert doctor["state"]["held"] == len(SNAPSHOTTED) - 1
    assert (await observed_holds(env))[1] == gauge(True, True)


async def test_restore_hold_again_starts_a_new_epoch_with_a_new_snapshot(
    env: Served, recovery: RecoveryEnv
) -> None:
    runs = await _shape_deployment(env)
    await act(recovery, "restore-hold", {"reason": "INC-1"})
    # Between the two holds one held step was settled; it is not snapshotted again. Every
    # other one is, the leased step that never stored a command key included.
    await set_call(
        env,
        runs["uncertain"],
        "state = 'completed', effect = 'accepted', cause = NULL, ended_at = {ns}.now()",
    )

    answer = await act(recovery, "restore-hold", {"reason": "INC-2"})

    assert answer["epoch"] == 2 and answer["snapshot"]["steps"] == len(SNAPSHOTTED) - 1
    assert await hold_row(env) == (True, True, 2)
    rows = await env.owner_fetch(
        "SELECT epoch, count(*) AS n FROM {ns}.restore_snapshot GROUP BY 1"
    )
    assert {row["epoch"]: row["n"] for row in rows} == {
        1: len(SNAPSHOTTED),
        2: len(SNAPSHOTTED) - 1,
    }
    records = await env.owner_fetch("SELECT epoch, restore_reason FROM {ns}.recovery_record")
    assert sorted((row["epoch"], row["restore_reason"]) for row in records) == [
        (1, "INC-1"),
        (2, "INC-2"),
    ]


async def test_restore_hold_without_work_snapshots_nothing(
    env: Served, recovery: RecoveryEnv
) -> None:
    answer = await act(recovery, "restore-hold", {"reason": REASON})
    assert answer["snapshot"] == {"steps": 0, "runs": 0}
    assert await env.owner_fetch("SELECT * FROM {ns}.restore_snapshot") == []


# ----------------------------------------------------------------- the order of the releases


async def _resolve(env: Served, run_id: str, resolution: str | None, step_state: str) -> None:
    """What reconcile, retry-same or cancel leave behind on a snapshotted step."""
    if step_state != "uncertain":
        ended = ", ended_at = {ns}.now()" if step_state in ("completed", "cancelled") else ""
        effect = "'accepted'" if step_state == "completed" else "NULL"
        # The effect is known now, so the cause that explained it being unknown goes too.
        known = f"state = '{step_state}', effect = {effect}, cause = NULL, cause_status = NULL"
        await set_call(env, run_id, known + ended)
    if resolution is not None:
        await env.owner_execute(
            "UPDATE {ns}.restore_snapshot SET resolution = $2, resolved_at = {ns}.now() "
            "WHERE run_id = $1",
            run_id,
            resolution,
        )


async def test_the_holds_are_released_only_in_the_contract_order(
    env: Served, recovery: RecoveryEnv
) -> None:
    admitter = Admitter.from_runtime(env.runtime, env.store("admission"))
    sent = [await start(env, f"sent-{n}") for n in range(4)]
    for number, run_id in enumerate(sent):
        await set_call(
            env, run_id, "state = 'prepared', command_key = $2, attempts = 1", f"{number:064x}"
        )
    await act(recovery, "restore-hold", {"reason": REASON})
    assert await observed_holds(env) == ({"execution": True, "admission": True}, gauge(True, True))
    await refused("admission.held", admitter.start(ALICE, WORKFLOW, "new-1", {"subjectRef": "S"}))

    unresolved = await refused(
        "restore.unresolved", act(recovery, "release-restore-hold", {"reason": REASON})
    )
    assert unresolved.detail.startswith("4 snapshotted step(s)")
    assert all(run_id not in unresolved.detail for run_id in sent)

    # Reconciled and settled; left for retry-same; cancel left it uncertain for inspection;
    # settled without a recorded resolution (no longer uncertain is resolved too).
    await _resolve(env, sent[0], "reconciled", "completed")
    await _resolve(env, sent[1], "retry", "uncertain")
    await _resolve(env, sent[2], "cancel", "uncertain")
    still = await refused(
        "restore.unresolved", act(recovery, "release-restore-hold", {"reason": REASON})
    )
    assert still.detail.startswith("1 snapshotted step(s)")
    await _resolve(env, sent[3], None, "not-sent")

    await refused(
        "restore.review-required", act(recovery, "release-restore-hold", {"reason": REASON})
    )
    await refused("restore.hold-required", act(recovery, "release-admission-hold", ADMISSION))

    recovered = await act(recovery, "complete-execution-recovery", EXECUTION)
    assert recovered["holds"] == {"execution": True, "admission": True}
    assert recovered["epoch"] == 1 and recovered["executionRecoveredAt"].endswith("Z")

    released = await act(recovery, "release-restore-hold", {"reason": "INC-2027-0042/done"})
    assert released == {"holds": {"execution": False, "admission": True}, "epoch": 1}
    assert await hold_row(env) == (False, True, 1)
    assert await observed_holds(env) == (
        {"execution": False, "admission": True},
        gauge(False, True),
    )
    # The execution hold is gone but admission still refuses new runs.
    await refused("admission.held", admitter.start(ALICE, WORKFLOW, "new-1", {"subjectRef": "S"}))
    await refused("restore.hold-required", act(recovery, "release-restore-hold", {"reason": "X"}))

    opened = await act(recovery, "release-admission-hold", ADMISSION)
    assert opened == {"holds": {"execution": False, "admission": False}, "epoch": 1}
    assert await hold_row(env) == (False, False, 1)
    assert await observed_holds(env) == (
        {"execution": False, "admission": False},
        gauge(False, False),
    )
    created = await admitter.start(ALICE, WORKFLOW, "new-1", {"subjectRef": "S"})
    assert created.created is True

    record = dict((await env.owner_fetch("SELECT * FROM {ns}.recovery_record"))[0])
    assert record["execution_recovery_reference"] == "RESTORE-7"
    assert record["execution_history_complete"] is True
    assert record["execution_deployment_fenced"] is True
    assert record["restore_release_reason"] == "INC-2027-0042/done"
    assert record["admission_recovery_reference"] == "RESTORE-7/admission"
    assert record["admission_history_complete"] is True
    assert record["admission_deployment_fenced"] is True
    assert (
        record["held_at"]
        <= record["execution_recovered_at"]
        <= record["restore_released_at"]
        <= record["admission_released_at"]
    )
    # Refused actions leave no operator action (the audit journal records the refusals).
    assert await operator_log(env) == [
        (None, "restore-hold", REASON),
        (None, "complete-execution-recovery", "RESTORE-7"),
        (None, "release-restore-hold", "INC-2027-0042/done"),
        (None, "release-admission-hold", "RESTORE-7/admission"),
    ]


async def test_actions_that_need_the_hold_are_refused_without_it(
    env: Served, recovery: RecoveryEnv
) -> None:
    await refused("restore.hold-required", act(recovery, "complete-execution-recovery", EXECUTION))
    await refused("restore.hold-required", act(recovery, "release-restore-hold", {"reason": "A"}))
    assert await env.owner_fetch("SELECT * FROM {ns}.recovery_record") == []
    assert await operator_log(env) == []

    # Never held: releasing admission changes nothing and records no recovery step.
    answer = await act(recovery, "release-admission-hold", ADMISSION)
    assert answer == {"holds": {"execution": False, "admission": False}, "epoch": 0}
    assert await hold_row(env) == (False, False, 0)
    assert await operator_log(env) == [(None, "release-admission-hold", "RESTORE-7/admission")]


async def test_an_execution_hold_without_a_recovery_record_cannot_be_attested(
    env: Served, recovery: RecoveryEnv
) -> None:
    await env.owner_execute("UPDATE {ns}.hold SET execution_hold = true")
    await refused("restore.hold-required", act(recovery, "complete-execution-recovery", EXECUTION))
    await refused(
        "restore.review-required", act(recovery, "release-restore-hold", {"reason": REASON})
    )
    # A restore-hold opens the record that the procedure then completes.
    await act(recovery, "restore-hold", {"reason": REASON})
    await act(recovery, "complete-execution-recovery", EXECUTION)
    released = await act(recovery, "release-restore-hold", {"reason": REASON})
    assert released["holds"]["execution"] is False


async def _wait_for_row_lock_waiter(env: Served, xid: str) -> None:
    """Return once a session waits for transaction ``xid`` to end (each round is a query)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        rows = await env.owner_fetch(
            "SELECT count(*) AS n FROM pg_locks "
            "WHERE locktype = 'transactionid' AND NOT granted AND transactionid::text = $1",
            xid,
        )
        if rows[0]["n"] >= 1:
            return
    raise AssertionError("the operator action never queued on the hold row")


async def test_hold_actions_wait_for_each_other_on_the_hold_row(
    env: Served, recovery: RecoveryEnv
) -> None:
    # Another operator's action holds the hold row and is about to set the execution hold:
    # a release of the admission hold must wait and then see it, not act on what it read
    # before.
    blocker = await migration_connection(env.database)
    try:
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute(f'SELECT 1 FROM "{env.namespace}".hold FOR UPDATE')
        xid = str(await blocker.fetchval("SELECT pg_current_xact_id()::text"))
        release = asyncio.ensure_future(act(recovery, "release-admission-hold", ADMISSION))
        await _wait_for_row_lock_waiter(env, xid)
        await blocker.execute(
            f'UPDATE "{env.namespace}".hold SET execution_hold = true, admission_hold = true'
        )
        await transaction.commit()
        await refused("restore.hold-required", release)
    finally:
        await blocker.close()
    assert await hold_row(env) == (True, True, 0)


# ------------------------------------------------------------------------------ the bodies


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("restore-hold", {}),
        ("restore-hold", {"reason": ""}),
        ("restore-hold", {"reason": "has space"}),
        ("restore-hold", {"reason": "x" * 129}),
        ("restore-hold", {"reason": 7}),
        ("restore-hold", {"reason": "A", "extra": 1}),
        ("release-restore-hold", {"reason": "ünïcode"}),
        ("complete-execution-recovery", {**EXECUTION, "executionHistoryComplete": False}),
        ("complete-execution-recovery", {**EXECUTION, "priorDeploymentFenced": "true"}),
        ("complete-execution-recovery", {"recoveryReference": "R"}),
        ("release-admission-hold", {**ADMISSION, "recoveryReference": "a b"}),
        ("release-admission-hold", EXECUTION),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 0}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 101}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": True}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 1.5}),
        ("retain", {"before": "2027-01-01T00:00:00", "limit": 1}),
        ("retain", {"before": "2027-02-30T00:00:00Z", "limit": 1}),
        ("retain", {"before": "yesterday", "limit": 1}),
        ("retain", {"limit": 1}),
        ("no-such-action", {"reason": "A"}),
    ],
)
async def test_bodies_are_checked_again(
    env: Served, recovery: RecoveryEnv, action: str, body: dict[str, Any]
) -> None:
    await refused("request.invalid", act(recovery, action, body))
    assert await hold_row(env) == (False, False, 0)
    assert await operator_log(env) == []


@pytest.mark.parametrize(
    "sent",
    [
        pb.OperatorActionRequest(action="restore-hold"),
        pb.OperatorActionRequest(action="restore-hold", retain=pb.RetainBody(limit=1)),
        pb.OperatorActionRequest(action="doctor", reason=pb.ReasonBody(reason="r-1")),
    ],
)
async def test_a_request_without_the_action_s_body_is_refused(
    sent: pb.OperatorActionRequest,
) -> None:
    with pytest.raises(CoordinatorError) as caught:
        members_of(sent.action, sent)
    assert caught.value.code == "request.invalid"
