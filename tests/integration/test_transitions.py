"""Each outcome of the step transition functions (``core/db/transitions.sql``), driven through
the one call the dispatcher makes (:meth:`dispatcher.settle.Settler.conclude` for
``step_settle``, :meth:`dispatcher.settle.Settler.prepare` for ``step_prepare``,
:meth:`dispatcher.settle.Settler.uncertain` for ``step_make_uncertain``,
:meth:`dispatcher.settle.Settler.retry` for ``step_retry``, :meth:`dispatcher.settle.Settler.wait`
for ``step_wait``, :meth:`dispatcher.settle.Settler.plan_check` for ``step_plan_check``,
:meth:`dispatcher.settle.Settler.record_read` for ``step_record_read``) on the real
PostgreSQL server, with the rows each leaves behind. The end of a lease (``step_lease_end``)
is driven through :meth:`dispatcher.settle.Settler.release` and a sweep of expired leases;
operator mode (``step_operator_settle``, ``step_operator_not_sent``, ``step_retry_same``) and
``run_cancel`` are called as recovery's statements call them, with a step's row version.

The cases a step meets besides the common one — a lease lost or taken by a restore-hold, a
step settled already, a cancel that abandoned it, the execution hold, a run that ended or
was erased meanwhile — are set up with direct writes to the test namespace, as an operator
action or another dispatcher would leave them.
"""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from core.db.statements import SettleArgs
from core.execution.onward import Onward
from core.execution.settlement import Failure, Settlement
from core.payloads import seal_json
from core.states import Effect, RetryCause, SentNothing, StepState, Transition
from devstack.postgres import DatabaseHandle
from dispatcher.claim import Claimed
from dispatcher.engine import Dispatcher
from dispatcher.settle import NextCall
from tests.helpers.dispatching import DispatchKit, dispatch_kit

pytestmark = pytest.mark.postgres

DEADLINE_SECONDS = 60
COMMAND = {"template": "test-notice", "recipientRef": "applicant", "parameters": {}}
ANSWER = {"messageId": "m-1"}
# notice-checked: the call "send", then the choose "check", then the finish "kept".
THROUGH_TO_KEPT = Onward((("check", "choose"), ("kept", "finish")), None, None, "kept")
ACCEPTED = Settlement.onward(
    THROUGH_TO_KEPT, effect=Effect.ACCEPTED, keep={"response": ANSWER, "output": ANSWER}
)


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


INPUTS = {"route": {"kind": "a"}}


async def claimed_call(
    kit: DispatchKit, workflow: str = "notice-checked"
) -> tuple[Dispatcher, Claimed]:
    """A dispatcher, and a new run's first step claimed by it."""
    dispatcher = await kit.dispatcher()
    run_id = await kit.start(workflow, INPUTS.get(workflow, {"applicantRef": "applicant-1"}))
    [claimed] = await dispatcher.claimer.claim(10)
    assert claimed.run_id == run_id
    return dispatcher, claimed


async def steps(kit: DispatchKit, run_id: str) -> list[tuple[Any, ...]]:
    """(step, seq, type, state, effect, leased, due) of every step of the run, in order."""
    rows = await kit.db.fetch(
        f"SELECT step_id, seq, step_type, state, effect, lease_owner IS NOT NULL AS leased, "
        f"due_at IS NOT NULL AS due FROM {kit.ns}.step WHERE run_id = $1 ORDER BY seq",
        run_id,
    )
    return [tuple(row) for row in rows]


async def payloads(kit: DispatchKit, run_id: str) -> list[tuple[str | None, str]]:
    rows = await kit.db.fetch(
        f"SELECT step_id, purpose FROM {kit.ns}.payload WHERE run_id = $1 ORDER BY id", run_id
    )
    return [(row["step_id"], row["purpose"]) for row in rows]


async def run_row(kit: DispatchKit, run_id: str) -> tuple[Any, ...]:
    row = await kit.run(run_id)
    return (row["state"], row["outcome"], row["failure_kind"], row["failure_step"])


async def attention(kit: DispatchKit, run_id: str) -> bool:
    return bool((await kit.run(run_id))["attention"])


async def everything(kit: DispatchKit, run_id: str) -> tuple[Any, ...]:
    return (await steps(kit, run_id), await payloads(kit, run_id), await run_row(kit, run_id))


# ------------------------------------------------------------------------- step_settle


async def test_settle_written_ends_the_step_passes_local_steps_and_ends_the_run(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.WRITTEN
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False),
        ("check", 2, "choose", "completed", None, False, False),
        ("kept", 3, "finish", "completed", None, False, False),
    ]
    assert await payloads(kit, claimed.run_id) == [
        (None, "input"),
        ("send", "response"),
        ("send", "output"),
    ]
    assert await run_row(kit, claimed.run_id) == ("succeeded", "kept", None, None)
    assert dispatcher.settler.steps_done_inline == 2


async def test_settle_written_makes_the_next_step_due(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    way = Onward((), "check", "choose", None)
    assert await dispatcher.settler.conclude(claimed, Settlement.onward(way)) is (
        Transition.WRITTEN
    )
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", None, False, False),
        ("check", 2, "choose", "ready", None, False, True),
    ]
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)


async def test_settle_written_fails_the_run(kit: DispatchKit) -> None:
    dispatcher, other = await claimed_call(kit, "notice")
    failing = Settlement.failing(Failure("invalid-command", "/recipientRef"))
    assert await dispatcher.settler.conclude(other, failing) is Transition.WRITTEN
    assert await steps(kit, other.run_id) == [("send", 1, "call", "failed", None, False, False)]
    assert await run_row(kit, other.run_id) == ("failed", None, "invalid-command", "send")
    assert (await kit.run(other.run_id))["failure_path"] == "/recipientRef"


async def test_settle_lease_lost_writes_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET lease_owner = 'another-dispatcher' WHERE run_id = $1",
        claimed.run_id,
    )
    before = await everything(kit, claimed.run_id)
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.LEASE_LOST
    assert await everything(kit, claimed.run_id) == before


async def test_settle_restore_held_writes_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET epoch = epoch + 1")
    before = await everything(kit, claimed.run_id)
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.RESTORE_HELD
    assert await everything(kit, claimed.run_id) == before


async def test_settle_already_settled_writes_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.WRITTEN
    before = await everything(kit, claimed.run_id)
    failing = Settlement.failing(Failure("refused"), state=StepState.REFUSED)
    assert await dispatcher.settler.conclude(claimed, failing) is Transition.ALREADY_SETTLED
    assert await everything(kit, claimed.run_id) == before


async def test_settle_abandoned_call_keeps_its_outcome_and_the_run_ends_cancelled(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.ABANDONED
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False)
    ]
    assert await payloads(kit, claimed.run_id) == [
        (None, "input"),
        ("send", "response"),
        ("send", "output"),
    ]
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_settle_abandoned_choice_decides_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit, "route")
    # An onCancel path made due beside it keeps the run going: only the step ends.
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET cancelling = true, cancel_seq = 2 WHERE id = $1",
        claimed.run_id,
    )
    way = Settlement.onward(Onward((("went-a", "finish"),), None, None, "a"))
    assert await dispatcher.settler.conclude(claimed, way) is Transition.ABANDONED
    assert await steps(kit, claimed.run_id) == [
        ("decide", 1, "choose", "cancelled", None, False, False)
    ]
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)


async def test_settle_held_makes_the_first_local_step_due_unexecuted(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true")
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.HELD
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False),
        ("check", 2, "choose", "ready", None, False, True),
    ]
    assert ("send", "output") in await payloads(kit, claimed.run_id)
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)
    assert dispatcher.settler.steps_done_inline == 0


# ------------------------------------------------- step_settle given the next call

# The run goes on to a call, "again", which the settle prepares when it can.
ON_TO_A_CALL = Settlement.onward(
    Onward((("check", "choose"),), "again", "call", None),
    effect=Effect.ACCEPTED,
    keep={"response": ANSWER, "output": ANSWER},
)
STRAIGHT_TO_A_CALL = Settlement.onward(Onward((), "again", "call", None))


def again(dispatcher: Dispatcher, claimed: Claimed) -> NextCall:
    """The call "again", its command sealed for the claimed step's run."""
    namespace = dispatcher.store.runtime.config.namespace
    sealed = seal_json(dispatcher.settler.keyring, namespace, claimed.run_id, "command", COMMAND)
    return NextCall("again", sealed, "key-again", DEADLINE_SECONDS)


async def test_settle_chain_prepares_the_next_call_under_the_settlers_lease(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    chained = await dispatcher.settler.conclude_chained(
        claimed, ON_TO_A_CALL, again(dispatcher, claimed), 30.0
    )
    assert chained is not None
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False),
        ("check", 2, "choose", "completed", None, False, False),
        ("again", 3, "call", "prepared", None, True, True),
    ]
    row = await kit.step(claimed.run_id, "again")
    # As a claim and step_prepare would have left it: leased in the current epoch, the
    # command stored and keyed, the first attempt counted, the deadline running.
    epoch = await kit.db.fetchval(f"SELECT epoch FROM {kit.ns}.hold")
    assert (row["lease_owner"], row["lease_epoch"], row["attempts"], row["command_key"]) == (
        dispatcher.owner,
        epoch,
        1,
        "key-again",
    )
    assert row["lease_expires_at"] - row["prepared_at"] == timedelta(seconds=30)
    assert row["deadline_at"] - row["first_attempt_at"] == timedelta(seconds=DEADLINE_SECONDS)
    assert await kit.payload(claimed.run_id, "again", "command") == COMMAND
    assert row["command_payload_id"] is not None
    assert (chained.claimed.step_id, chained.claimed.seq, chained.claimed.state) == (
        "again",
        3,
        "prepared",
    )
    assert (chained.claimed.lease_epoch, chained.prepared.attempts) == (epoch, 1)
    assert chained.prepared.deadline_in == pytest.approx(DEADLINE_SECONDS, abs=1)
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)
    assert dispatcher.settler.calls_chained == 1
    # The prepared call is the dispatcher's to settle like any other.
    done = Settlement.onward(Onward((("kept", "finish"),), None, None, "kept"))
    assert await dispatcher.settler.conclude(chained.claimed, done) is Transition.WRITTEN
    assert (await kit.step(claimed.run_id, "again"))["state"] == "completed"
    assert await run_row(kit, claimed.run_id) == ("succeeded", "kept", None, None)


async def test_settle_chain_under_the_execution_hold_leaves_the_next_call_due(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true")
    chained = await dispatcher.settler.conclude_chained(
        claimed, STRAIGHT_TO_A_CALL, again(dispatcher, claimed), 30.0
    )
    assert chained is None
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", None, False, False),
        ("again", 2, "call", "ready", None, False, True),
    ]
    assert ("again", "command") not in await payloads(kit, claimed.run_id)
    assert dispatcher.settler.calls_chained == 0


async def due_notices(kit: DispatchKit, act: Callable[[], Awaitable[object]]) -> int:
    """How many notifications of due work the commits of ``act`` sent. A notice the test
    sends after ``act`` marks where they end: listeners hear notices in commit order."""
    channel = f"{kit.deployment.namespace}_due"
    heard: list[str] = []
    fenced = asyncio.Event()

    def listen(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == "fence":
            fenced.set()
        else:
            heard.append(payload)

    await kit.db.add_listener(channel, listen)
    try:
        await act()
        await kit.db.execute("SELECT pg_notify($1, 'fence')", channel)
        await asyncio.wait_for(fenced.wait(), timeout=10)
    finally:
        await kit.db.remove_listener(channel, listen)
    return len(heard)


async def test_a_chained_call_wakes_no_dispatcher_while_one_made_due_does(
    kit: DispatchKit,
) -> None:
    # Made prepared, the next call is never due work: no notification, no claim for it.
    dispatcher, claimed = await claimed_call(kit)
    following = again(dispatcher, claimed)

    async def chain() -> None:
        assert await dispatcher.settler.conclude_chained(
            claimed, STRAIGHT_TO_A_CALL, following, 30.0
        )

    assert await due_notices(kit, chain) == 0
    # Under the execution hold the same settle makes the call ready and due: one notice.
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true")
    following = again(dispatcher, claimed)

    async def settle() -> None:
        assert (
            await dispatcher.settler.conclude_chained(claimed, STRAIGHT_TO_A_CALL, following, 30.0)
            is None
        )

    assert await due_notices(kit, settle) == 1
    assert (await kit.step(claimed.run_id, "again"))["state"] == "ready"


async def test_settle_chain_of_an_abandoned_call_prepares_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    assert (
        await dispatcher.settler.conclude_chained(
            claimed, ON_TO_A_CALL, again(dispatcher, claimed), 30.0
        )
        is None
    )
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False)
    ]
    assert ("again", "command") not in await payloads(kit, claimed.run_id)
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_settle_chain_without_the_lease_writes_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET lease_owner = 'another-dispatcher' WHERE run_id = $1",
        claimed.run_id,
    )
    before = await everything(kit, claimed.run_id)
    assert (
        await dispatcher.settler.conclude_chained(
            claimed, ON_TO_A_CALL, again(dispatcher, claimed), 30.0
        )
        is None
    )
    assert await everything(kit, claimed.run_id) == before


async def test_settle_on_an_ended_run_records_the_step_alone(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'failed', ended_at = {kit.ns}.now() WHERE id = $1",
        claimed.run_id,
    )
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.RUN_ENDED
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False)
    ]
    assert ("send", "response") in await payloads(kit, claimed.run_id)
    assert await run_row(kit, claimed.run_id) == ("failed", None, None, None)


async def test_settle_on_an_erased_run_keeps_no_payload(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'failed', ended_at = {kit.ns}.now(), "
        f"erased_at = {kit.ns}.now() WHERE id = $1",
        claimed.run_id,
    )
    await kit.db.execute(f"DELETE FROM {kit.ns}.payload WHERE run_id = $1", claimed.run_id)
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.ERASED
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False)
    ]
    assert await payloads(kit, claimed.run_id) == []


# --------------------------------------------------------------------------- step_retry


async def test_retry_written_makes_the_step_due_again(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert (
        await dispatcher.settler.retry(claimed, 30.0, met=RetryCause.STATUS_503, status=503)
        is Transition.WRITTEN
    )
    assert await steps(kit, claimed.run_id) == [("send", 1, "call", "ready", None, False, True)]
    step = await kit.step(claimed.run_id, "send")
    waited = await kit.db.fetchval(
        f"SELECT extract(epoch FROM due_at - {kit.ns}.now()) FROM {kit.ns}.step WHERE run_id = $1",
        claimed.run_id,
    )
    assert 29 < float(waited) <= 30
    assert step["cause"] is None
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)
    assert not await attention(kit, claimed.run_id)


async def test_retry_after_a_tls_refusal_keeps_the_cause_and_asks_for_attention(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    written = await dispatcher.settler.retry(
        claimed, 5.0, SentNothing.TLS_REFUSED, met=RetryCause.TLS_REFUSED
    )
    assert written is Transition.WRITTEN
    assert (await kit.step(claimed.run_id, "send"))["cause"] == "tls-refused"
    assert await attention(kit, claimed.run_id)


async def test_retry_abandoned_ends_the_step_cancelled(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    assert await dispatcher.settler.retry(claimed, 5.0, met=RetryCause.NEVER_CONNECTED) is (
        Transition.ABANDONED
    )
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "cancelled", None, False, False)
    ]
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_retry_past_the_deadline_fails_the_run(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET deadline_at = {kit.ns}.now() + interval '10 seconds' "
        "WHERE run_id = $1",
        claimed.run_id,
    )
    assert (
        await dispatcher.settler.retry(claimed, 10.0, met=RetryCause.STATUS_429, status=429)
        is Transition.WRITTEN
    )
    assert await steps(kit, claimed.run_id) == [("send", 1, "call", "failed", None, False, False)]
    assert await run_row(kit, claimed.run_id) == ("failed", None, "deadline-exceeded", "send")


async def test_retry_before_the_deadline_is_due_again(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET deadline_at = {kit.ns}.now() + interval '10 seconds' "
        "WHERE run_id = $1",
        claimed.run_id,
    )
    assert (
        await dispatcher.settler.retry(claimed, 9.0, met=RetryCause.STATUS_429, status=429)
        is Transition.WRITTEN
    )
    assert (await kit.step(claimed.run_id, "send"))["state"] == "ready"


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ("UPDATE {ns}.step SET lease_owner = 'another-dispatcher'", Transition.LEASE_LOST),
        ("UPDATE {ns}.hold SET epoch = epoch + 1", Transition.RESTORE_HELD),
    ],
)
async def test_retry_writes_nothing_without_the_lease(
    kit: DispatchKit, change: str, outcome: Transition
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(change.format(ns=kit.ns))
    before = await everything(kit, claimed.run_id)
    assert await dispatcher.settler.retry(claimed, 5.0, met=RetryCause.STATUS_503) is outcome
    assert await everything(kit, claimed.run_id) == before


# ---------------------------------------------------------------------------- step_wait


async def test_wait_written_makes_the_step_and_the_run_wait(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert claimed.now is not None
    due = claimed.now + timedelta(hours=1)
    timeout = claimed.now + timedelta(days=1)
    assert await dispatcher.settler.wait(claimed, due, timeout) is Transition.WRITTEN
    assert await steps(kit, claimed.run_id) == [("send", 1, "call", "waiting", None, False, True)]
    step = await kit.step(claimed.run_id, "send")
    assert (step["due_at"], step["timeout_at"]) == (due, timeout)
    assert await run_row(kit, claimed.run_id) == ("waiting", None, None, None)


async def test_wait_keeps_a_timeout_already_set_and_may_wait_for_an_event_alone(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert claimed.now is not None
    timeout = claimed.now + timedelta(days=2)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET timeout_at = $2 WHERE run_id = $1", claimed.run_id, timeout
    )
    assert await dispatcher.settler.wait(claimed, None) is Transition.WRITTEN
    step = await kit.step(claimed.run_id, "send")
    assert (step["state"], step["due_at"], step["timeout_at"]) == ("waiting", None, timeout)


async def test_wait_abandoned_ends_the_step_cancelled(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    assert claimed.now is not None
    due = claimed.now + timedelta(hours=1)
    assert await dispatcher.settler.wait(claimed, due) is Transition.ABANDONED
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "cancelled", None, False, False)
    ]
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_wait_on_an_ended_run_leaves_the_run_as_it_ended(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'failed', ended_at = {kit.ns}.now() WHERE id = $1",
        claimed.run_id,
    )
    assert claimed.now is not None
    due = claimed.now + timedelta(hours=1)
    assert await dispatcher.settler.wait(claimed, due) is Transition.WRITTEN
    assert await run_row(kit, claimed.run_id) == ("failed", None, None, None)


async def test_wait_writes_nothing_without_the_lease(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.step SET lease_owner = 'another-dispatcher'")
    before = await everything(kit, claimed.run_id)
    assert claimed.now is not None
    due = claimed.now + timedelta(hours=1)
    assert await dispatcher.settler.wait(claimed, due) is Transition.LEASE_LOST
    assert await everything(kit, claimed.run_id) == before


# ---------------------------------------------------------------------- step_plan_check

MATCH = bytes(range(32))


async def as_wait_for(kit: DispatchKit, run_id: str) -> None:
    """Make the run's claimed call step a wait-for step, as the plan statement meets it."""
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET step_type = 'wait-for' WHERE run_id = $1", run_id
    )


async def test_plan_check_written_keeps_the_lease_and_the_run_waits(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await as_wait_for(kit, claimed.run_id)
    outcome = await dispatcher.settler.plan_check(
        claimed, match=MATCH, timeout_seconds=3600.0, delay=60.0, entering=True
    )
    assert outcome is Transition.WRITTEN
    step = await kit.step(claimed.run_id, "send")
    assert (step["state"], step["wait_match"], step["lease_owner"]) == (
        "waiting",
        MATCH,
        dispatcher.owner,
    )
    spans = await kit.db.fetchrow(
        f"SELECT extract(epoch FROM timeout_at - {kit.ns}.now()) AS timeout, "
        f"extract(epoch FROM next_check_at - {kit.ns}.now()) AS check "
        f"FROM {kit.ns}.step WHERE run_id = $1",
        claimed.run_id,
    )
    assert 3599 < float(spans["timeout"]) <= 3600 and 59 < float(spans["check"]) <= 60
    assert await run_row(kit, claimed.run_id) == ("waiting", None, None, None)


async def test_plan_check_keeps_a_timeout_set_and_leaves_the_run_when_not_entering(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await as_wait_for(kit, claimed.run_id)
    assert claimed.now is not None
    timeout = claimed.now + timedelta(minutes=5)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET timeout_at = $2 WHERE run_id = $1", claimed.run_id, timeout
    )
    outcome = await dispatcher.settler.plan_check(
        claimed, match=MATCH, timeout_seconds=3600.0, delay=60.0, entering=False
    )
    assert outcome is Transition.WRITTEN
    assert (await kit.step(claimed.run_id, "send"))["timeout_at"] == timeout
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)


async def test_plan_check_abandoned_reads_nothing_and_ends_the_step_cancelled(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await as_wait_for(kit, claimed.run_id)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    outcome = await dispatcher.settler.plan_check(
        claimed, match=MATCH, timeout_seconds=None, delay=60.0, entering=True
    )
    assert outcome is Transition.ABANDONED
    assert (await kit.step(claimed.run_id, "send"))["state"] == "cancelled"
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_plan_check_writes_nothing_without_the_lease(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await as_wait_for(kit, claimed.run_id)
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET epoch = epoch + 1")
    before = await everything(kit, claimed.run_id)
    outcome = await dispatcher.settler.plan_check(
        claimed, match=MATCH, timeout_seconds=None, delay=60.0, entering=True
    )
    assert outcome is Transition.RESTORE_HELD
    assert await everything(kit, claimed.run_id) == before


# ---------------------------------------------------------------------- step_record_read

DECISION = Settlement.onward(THROUGH_TO_KEPT, keep={"wait-result": {"outcome": "approved"}})
TIMEOUT_WAY = Settlement.onward(Onward((), "check", "choose", None))


async def planned_read(kit: DispatchKit) -> tuple[Dispatcher, Claimed]:
    """A claimed step made a wait-for step whose read is planned: next check in 60 s, a
    timeout in an hour, the lease kept for the read."""
    dispatcher, claimed = await claimed_call(kit)
    await as_wait_for(kit, claimed.run_id)
    outcome = await dispatcher.settler.plan_check(
        claimed, match=MATCH, timeout_seconds=3600.0, delay=60.0, entering=True
    )
    assert outcome is Transition.WRITTEN
    return dispatcher, claimed


async def test_record_a_decision_ends_the_wait_and_the_run_moves_on(kit: DispatchKit) -> None:
    dispatcher, claimed = await planned_read(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET attention = true WHERE id = $1", claimed.run_id)
    outcome = await dispatcher.settler.record_read(
        claimed, ends=DECISION, on_timeout=TIMEOUT_WAY, attention=None
    )
    assert outcome is Transition.WRITTEN
    step = await kit.step(claimed.run_id, "send")
    assert (step["state"], step["checks"], step["next_check_at"]) == ("completed", 1, None)
    assert ("send", "wait-result") in await payloads(kit, claimed.run_id)
    assert await run_row(kit, claimed.run_id) == ("succeeded", "kept", None, None)
    assert not await attention(kit, claimed.run_id)
    assert dispatcher.settler.steps_done_inline == 2


async def test_record_after_the_timeout_takes_the_on_timeout_way(kit: DispatchKit) -> None:
    dispatcher, claimed = await planned_read(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET timeout_at = {kit.ns}.now() WHERE run_id = $1", claimed.run_id
    )
    outcome = await dispatcher.settler.record_read(
        claimed, ends=None, on_timeout=TIMEOUT_WAY, attention=True
    )
    assert outcome is Transition.WRITTEN
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "wait-for", "completed", None, False, False),
        ("check", 2, "choose", "ready", None, False, True),
    ]
    assert not await attention(kit, claimed.run_id)  # the wait is over: no mark stays


async def test_record_without_a_decision_schedules_the_next_check(kit: DispatchKit) -> None:
    dispatcher, claimed = await planned_read(kit)
    outcome = await dispatcher.settler.record_read(
        claimed, ends=None, on_timeout=TIMEOUT_WAY, attention=True
    )
    assert outcome is Transition.WRITTEN
    step = await kit.step(claimed.run_id, "send")
    assert (step["state"], step["checks"], step["lease_owner"]) == ("waiting", 1, None)
    assert step["due_at"] == step["next_check_at"]  # the check comes before the timeout
    assert await run_row(kit, claimed.run_id) == ("waiting", None, None, None)
    assert await attention(kit, claimed.run_id)  # refused: an operator should look


async def test_record_of_an_answered_read_clears_the_attention_unless_a_step_wants_it(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await planned_read(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET attention = true WHERE id = $1", claimed.run_id)
    assert (
        await dispatcher.settler.record_read(claimed, ends=None, on_timeout=None, attention=False)
        is Transition.WRITTEN
    )
    assert not await attention(kit, claimed.run_id)


async def test_record_abandoned_ends_the_step_cancelled(kit: DispatchKit) -> None:
    dispatcher, claimed = await planned_read(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    outcome = await dispatcher.settler.record_read(
        claimed, ends=DECISION, on_timeout=None, attention=None
    )
    assert outcome is Transition.ABANDONED
    assert (await kit.step(claimed.run_id, "send"))["state"] == "cancelled"
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_record_writes_nothing_without_the_lease(kit: DispatchKit) -> None:
    dispatcher, claimed = await planned_read(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.step SET lease_owner = 'another-dispatcher'")
    before = await everything(kit, claimed.run_id)
    outcome = await dispatcher.settler.record_read(
        claimed, ends=DECISION, on_timeout=None, attention=None
    )
    assert outcome is Transition.LEASE_LOST
    assert await everything(kit, claimed.run_id) == before


async def test_a_read_ends_its_wait_only_by_completing_the_step(kit: DispatchKit) -> None:
    dispatcher, claimed = await planned_read(kit)
    with pytest.raises(ValueError, match="completing the step"):
        await dispatcher.settler.record_read(
            claimed,
            ends=Settlement.failing(Failure("refused")),
            on_timeout=None,
            attention=None,
        )


# ------------------------------------------------------------------ step_make_uncertain


async def test_uncertain_written_holds_the_run_for_an_operator(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    outcome = await dispatcher.settler.uncertain(claimed, "status-5xx", 503)
    assert outcome is Transition.WRITTEN
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "uncertain", "unknown", False, False)
    ]
    step = await kit.step(claimed.run_id, "send")
    assert (step["cause"], step["cause_status"]) == ("status-5xx", 503)
    assert await run_row(kit, claimed.run_id) == ("held", None, None, None)
    assert await attention(kit, claimed.run_id)


async def test_uncertain_abandoned_ends_a_cancelled_run_keeping_the_attention(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    assert await dispatcher.settler.uncertain(claimed, "timeout-after-send") is (
        Transition.ABANDONED
    )
    # The step still waits for an operator: its effect is unknown whatever the cancel says.
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "uncertain", "unknown", False, False)
    ]
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)
    assert await attention(kit, claimed.run_id)


async def test_uncertain_abandoned_before_an_on_cancel_path_holds_the_run(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET cancelling = true, cancel_seq = 2 WHERE id = $1",
        claimed.run_id,
    )
    assert await dispatcher.settler.uncertain(claimed, "connection-lost") is (Transition.ABANDONED)
    assert await run_row(kit, claimed.run_id) == ("held", None, None, None)


async def test_uncertain_on_an_ended_run_records_the_step_alone(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'failed', ended_at = {kit.ns}.now() WHERE id = $1",
        claimed.run_id,
    )
    assert await dispatcher.settler.uncertain(claimed, "lease-expired") is Transition.RUN_ENDED
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "uncertain", "unknown", False, False)
    ]
    assert await run_row(kit, claimed.run_id) == ("failed", None, None, None)
    assert not await attention(kit, claimed.run_id)


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ("UPDATE {ns}.step SET lease_owner = 'another-dispatcher'", Transition.LEASE_LOST),
        ("UPDATE {ns}.hold SET epoch = epoch + 1", Transition.RESTORE_HELD),
    ],
)
async def test_uncertain_writes_nothing_without_the_lease(
    kit: DispatchKit, change: str, outcome: Transition
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(change.format(ns=kit.ns))
    before = (await everything(kit, claimed.run_id), await attention(kit, claimed.run_id))
    assert await dispatcher.settler.uncertain(claimed, "connection-lost") is outcome
    assert (await everything(kit, claimed.run_id), await attention(kit, claimed.run_id)) == before


async def test_uncertain_after_a_settle_writes_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.WRITTEN
    before = await everything(kit, claimed.run_id)
    assert await dispatcher.settler.uncertain(claimed, "connection-lost") is (
        Transition.ALREADY_SETTLED
    )
    assert await everything(kit, claimed.run_id) == before


# ------------------------------------------------------------------------ step_prepare


async def prepare(kit: DispatchKit, dispatcher: Dispatcher, claimed: Claimed) -> Any:
    return await dispatcher.settler.prepare(
        claimed,
        command=COMMAND,
        command_payload_id=claimed.command_payload_id,
        command_key=kit.key(claimed.run_id),
        deadline_seconds=DEADLINE_SECONDS,
    )


async def test_prepare_written_stores_the_command_and_counts_the_attempt(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    prepared = await prepare(kit, dispatcher, claimed)
    assert prepared is not None
    assert (prepared.attempts, prepared.first_of_run) == (1, True)
    assert 0 < prepared.deadline_in <= DEADLINE_SECONDS
    step = await kit.step(claimed.run_id, "send")
    assert (step["state"], step["command_key"], step["attempts"]) == (
        "prepared",
        kit.key(claimed.run_id),
        1,
    )
    assert await payloads(kit, claimed.run_id) == [(None, "input"), ("send", "command")]


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ("UPDATE {ns}.step SET lease_owner = 'another-dispatcher'", Transition.LEASE_LOST),
        ("UPDATE {ns}.hold SET epoch = epoch + 1", Transition.RESTORE_HELD),
        ("UPDATE {ns}.step SET state = 'prepared'", Transition.ALREADY_SETTLED),
    ],
)
async def test_prepare_writes_nothing_for_a_step_not_ours_to_send(
    kit: DispatchKit, change: str, outcome: Transition, caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(change.format(ns=kit.ns))
    before = await everything(kit, claimed.run_id)
    assert await prepare(kit, dispatcher, claimed) is None
    assert await everything(kit, claimed.run_id) == before
    assert f"step send of run {claimed.run_id}" in caplog.text


async def test_prepare_abandoned_ends_the_step_cancelled_and_sends_nothing(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    assert await prepare(kit, dispatcher, claimed) is None
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "cancelled", None, False, False)
    ]
    assert await payloads(kit, claimed.run_id) == [(None, "input")]
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_prepare_held_gives_the_step_back(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true")
    assert await prepare(kit, dispatcher, claimed) is None
    assert await steps(kit, claimed.run_id) == [("send", 1, "call", "ready", None, False, True)]
    assert await payloads(kit, claimed.run_id) == [(None, "input")]
    assert (await kit.step(claimed.run_id, "send"))["attempts"] == 0


async def test_prepare_on_an_ended_run_ends_the_step_cancelled(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'failed', ended_at = {kit.ns}.now() WHERE id = $1",
        claimed.run_id,
    )
    assert await prepare(kit, dispatcher, claimed) is None
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "cancelled", None, False, False)
    ]
    assert await payloads(kit, claimed.run_id) == [(None, "input")]
    assert await run_row(kit, claimed.run_id) == ("failed", None, None, None)


# ---------------------------------------------------- step_lease_end: release and expiry


async def prepared_call(kit: DispatchKit) -> tuple[Dispatcher, Claimed]:
    """A dispatcher, and a new run's first step claimed by it with its command prepared."""
    dispatcher, claimed = await claimed_call(kit)
    assert await prepare(kit, dispatcher, claimed) is not None
    return dispatcher, claimed


async def expire(kit: DispatchKit, dispatcher: Dispatcher, run_id: str) -> tuple[int, int]:
    """Let every lease of the run lapse, then sweep once: (released, uncertain)."""
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET lease_expires_at = {kit.ns}.now() - interval '1 second' "
        "WHERE run_id = $1 AND lease_owner IS NOT NULL",
        run_id,
    )
    found = await dispatcher.claimer.sweep()
    return found.released, found.uncertain


async def test_release_of_a_prepared_step_makes_it_uncertain_and_holds_the_run(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await prepared_call(kit)
    assert await dispatcher.settler.release(claimed) == StepState.UNCERTAIN
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "uncertain", "unknown", False, False)
    ]
    step = await kit.step(claimed.run_id, "send")
    assert (step["cause"], step["cause_status"]) == ("lease-expired", None)
    assert await run_row(kit, claimed.run_id) == ("held", None, None, None)
    assert await attention(kit, claimed.run_id)


async def test_release_of_a_step_not_prepared_makes_it_due_again_after_the_delay(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert await dispatcher.settler.release(claimed, delay=30.0) == StepState.READY
    assert await steps(kit, claimed.run_id) == [("send", 1, "call", "ready", None, False, True)]
    due_in = await kit.db.fetchval(
        f"SELECT extract(epoch FROM due_at - {kit.ns}.now()) FROM {kit.ns}.step WHERE run_id = $1",
        claimed.run_id,
    )
    assert 29.0 <= float(due_in) <= 30.0
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)
    assert not await attention(kit, claimed.run_id)


async def test_release_without_the_lease_writes_nothing(kit: DispatchKit) -> None:
    dispatcher, claimed = await prepared_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.step SET lease_owner = 'another-dispatcher'")
    before = (await everything(kit, claimed.run_id), await attention(kit, claimed.run_id))
    assert await dispatcher.settler.release(claimed) is None
    assert (await everything(kit, claimed.run_id), await attention(kit, claimed.run_id)) == before


async def test_an_expired_lease_on_a_prepared_step_ends_a_cancelled_run_keeping_attention(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await prepared_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", claimed.run_id)
    assert await expire(kit, dispatcher, claimed.run_id) == (1, 1)
    assert await steps(kit, claimed.run_id) == [
        ("send", 1, "call", "uncertain", "unknown", False, False)
    ]
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)
    assert await attention(kit, claimed.run_id)


async def test_an_expired_lease_on_a_step_not_prepared_keeps_when_it_was_due(
    kit: DispatchKit,
) -> None:
    dispatcher, claimed = await claimed_call(kit)
    due_before = (await kit.step(claimed.run_id, "send"))["due_at"]
    assert await expire(kit, dispatcher, claimed.run_id) == (1, 0)
    step = await kit.step(claimed.run_id, "send")
    assert (step["state"], step["lease_owner"], step["due_at"]) == ("ready", None, due_before)
    assert await run_row(kit, claimed.run_id) == ("running", None, None, None)


async def test_an_expired_lease_from_before_a_restore_hold_still_ends(kit: DispatchKit) -> None:
    # (Unlike a settle, the end of a lease does not ask which hold epoch it was taken in:
    # otherwise a lease taken before a restore-hold would stay forever.)
    dispatcher, claimed = await prepared_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET epoch = epoch + 1")
    assert await expire(kit, dispatcher, claimed.run_id) == (1, 1)
    assert await run_row(kit, claimed.run_id) == ("held", None, None, None)


async def test_an_expired_lease_on_an_ended_run_records_the_step_alone(kit: DispatchKit) -> None:
    dispatcher, claimed = await prepared_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'failed', ended_at = {kit.ns}.now() WHERE id = $1",
        claimed.run_id,
    )
    assert await expire(kit, dispatcher, claimed.run_id) == (1, 1)
    assert await run_row(kit, claimed.run_id) == ("failed", None, None, None)
    assert not await attention(kit, claimed.run_id)


# ---------------------------------------------------------------------- step_abandoned


@pytest.mark.parametrize(
    ("cancelling", "cancel_seq", "seq", "abandoned"),
    [
        (False, None, 1, False),
        (True, None, 1, True),
        (True, None, 7, True),
        (True, 3, 2, True),
        (True, 3, 3, False),
        (True, 3, 4, False),
    ],
)
async def test_which_steps_a_cancel_abandons(
    kit: DispatchKit, cancelling: bool, cancel_seq: int | None, seq: int, abandoned: bool
) -> None:
    answer = await kit.db.fetchval(
        f"SELECT {kit.ns}.step_abandoned($1, $2, $3)", cancelling, cancel_seq, seq
    )
    assert answer is abandoned


async def test_a_claim_says_whether_a_cancel_abandoned_the_step(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    kept = await kit.start("notice-checked", {"applicantRef": "applicant-1"})
    dropped = await kit.start("notice-checked", {"applicantRef": "applicant-2"})
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", dropped)
    claimed = {c.run_id: c.abandoned for c in await dispatcher.claimer.claim(10)}
    assert claimed == {kept: False, dropped: True}


# ---------------------------------------------------------------------- run_live_state


async def test_a_run_goes_on_held_while_one_of_its_steps_is_uncertain(kit: DispatchKit) -> None:
    run_id = await kit.start("notice-checked", {"applicantRef": "applicant-1"})

    async def live_state() -> str:
        return str(await kit.db.fetchval(f"SELECT {kit.ns}.run_live_state($1)", run_id))

    assert await live_state() == "running"
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET state = 'uncertain', due_at = NULL WHERE run_id = $1", run_id
    )
    assert await live_state() == "held"


# ------------------------------------------------------------------------ operator mode


async def uncertain_call(kit: DispatchKit, workflow: str = "notice-checked") -> tuple[str, str]:
    """A new run whose first call is uncertain, and that step's row version."""
    dispatcher, claimed = await claimed_call(kit, workflow)
    assert await prepare(kit, dispatcher, claimed) is not None
    assert await dispatcher.settler.uncertain(claimed, "timeout-after-send") is Transition.WRITTEN
    return claimed.run_id, await version(kit, claimed.run_id)


async def version(kit: DispatchKit, run_id: str, step_id: str = "send") -> str:
    return str(
        await kit.db.fetchval(
            f"SELECT xmin::text FROM {kit.ns}.step WHERE run_id = $1 AND step_id = $2",
            run_id,
            step_id,
        )
    )


async def operator_settle(kit: DispatchKit, run_id: str, row_version: str, **given: Any) -> Any:
    """step_operator_settle as reconcile calls it for an accepted receipt, with ``given``
    replacing any of its arguments."""
    arguments: dict[str, Any] = {
        "state": "completed",
        "effect": "accepted",
        "purposes": ["response"],
        "key_versions": [1],
        "nonces": [bytes(12)],
        "ciphertexts": [b"x"],
        "passed_ids": [],
        "passed_types": [],
        "next_step": "check",
        "next_type": "choose",
        "run_state": None,
        "outcome": None,
        "failure_kind": None,
        "failure_path": None,
    } | given
    return tuple(
        await kit.db.fetchrow(
            f"SELECT * FROM {kit.ns}.step_operator_settle($1, 'send', $2, $3)",
            run_id,
            row_version,
            SettleArgs(**arguments),
        )
    )


async def test_operator_settle_written_moves_the_run_on_as_a_dispatcher_would(
    kit: DispatchKit,
) -> None:
    run_id, row_version = await uncertain_call(kit)
    assert await attention(kit, run_id)
    assert await operator_settle(kit, run_id, row_version) == ("written", "running")
    assert await steps(kit, run_id) == [
        ("send", 1, "call", "completed", "accepted", False, False),
        ("check", 2, "choose", "ready", None, False, True),
    ]
    step = await kit.step(run_id, "send")
    assert (step["cause"], step["lease_owner"]) == (None, None)
    assert await payloads(kit, run_id) == [
        (None, "input"),
        ("send", "command"),
        ("send", "response"),
    ]
    assert await run_row(kit, run_id) == ("running", None, None, None)
    assert not await attention(kit, run_id)


async def test_operator_settle_fails_the_run_naming_the_step(kit: DispatchKit) -> None:
    run_id, row_version = await uncertain_call(kit)
    outcome = await operator_settle(
        kit,
        run_id,
        row_version,
        state="failed",
        next_step=None,
        next_type=None,
        run_state="failed",
        failure_kind="mapping-invalid",
        failure_path="/messageId",
    )
    assert outcome == ("written", "failed")
    assert await run_row(kit, run_id) == ("failed", None, "mapping-invalid", "send")
    assert not await attention(kit, run_id)


async def test_operator_settle_of_a_changed_step_writes_nothing(kit: DispatchKit) -> None:
    run_id, row_version = await uncertain_call(kit)
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET updated_at = updated_at WHERE run_id = $1", run_id
    )
    before = (await everything(kit, run_id), await attention(kit, run_id))
    assert await operator_settle(kit, run_id, row_version) == ("changed", None)
    assert (await everything(kit, run_id), await attention(kit, run_id)) == before


async def test_operator_settle_abandoned_records_the_step_and_ends_the_cancelled_run(
    kit: DispatchKit,
) -> None:
    run_id, _ = await uncertain_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", run_id)
    outcome = await operator_settle(kit, run_id, await version(kit, run_id))
    assert outcome == ("abandoned", "cancelled")
    assert await steps(kit, run_id) == [("send", 1, "call", "completed", "accepted", False, False)]
    assert not await attention(kit, run_id)


async def test_operator_settle_keeps_the_run_held_while_another_step_is_uncertain(
    kit: DispatchKit,
) -> None:
    run_id, row_version = await uncertain_call(kit)
    await kit.db.execute(
        f"INSERT INTO {kit.ns}.step (run_id, step_id, seq, step_type, state, effect, cause)"
        " VALUES ($1, 'other', 9, 'call', 'uncertain', 'unknown', 'connection-lost')",
        run_id,
    )
    assert await operator_settle(kit, run_id, row_version) == ("written", "held")
    assert await run_row(kit, run_id) == ("held", None, None, None)
    assert await attention(kit, run_id)


async def test_not_sent_written_leaves_the_run_held_for_an_operator(kit: DispatchKit) -> None:
    run_id, row_version = await uncertain_call(kit)
    row = await kit.db.fetchrow(
        f"SELECT * FROM {kit.ns}.step_operator_not_sent($1, 'send', $2)", run_id, row_version
    )
    assert tuple(row) == ("written", None)
    step = await kit.step(run_id, "send")
    assert (step["state"], step["effect"], step["cause"], step["due_at"]) == (
        "not-sent",
        None,
        None,
        None,
    )
    assert await run_row(kit, run_id) == ("held", None, None, None)
    assert await attention(kit, run_id)


async def test_not_sent_of_an_abandoned_step_ends_it_cancelled_with_no_effect(
    kit: DispatchKit,
) -> None:
    run_id, _ = await uncertain_call(kit)
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", run_id)
    row = await kit.db.fetchrow(
        f"SELECT * FROM {kit.ns}.step_operator_not_sent($1, 'send', $2)",
        run_id,
        await version(kit, run_id),
    )
    assert tuple(row) == ("abandoned", "cancelled")
    assert await steps(kit, run_id) == [("send", 1, "call", "cancelled", None, False, False)]
    assert not await attention(kit, run_id)


async def retry_same(kit: DispatchKit, run_id: str, row_version: str) -> tuple[Any, ...]:
    return tuple(
        await kit.db.fetchrow(
            f"SELECT * FROM {kit.ns}.step_retry_same($1, 'send', $2)", run_id, row_version
        )
    )


async def test_retry_same_written_makes_the_step_ready_with_its_command(kit: DispatchKit) -> None:
    run_id, row_version = await uncertain_call(kit)
    assert await retry_same(kit, run_id, row_version) == ("written", 1)
    step = await kit.step(run_id, "send")
    assert (step["state"], step["effect"], step["cause"]) == (
        "ready",
        "unknown",
        "timeout-after-send",
    )
    assert step["command_payload_id"] is not None and step["due_at"] is not None
    assert await run_row(kit, run_id) == ("running", None, None, None)
    assert not await attention(kit, run_id)


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ("UPDATE {ns}.hold SET execution_hold = true", "held"),
        ("UPDATE {ns}.run SET state = 'failed', ended_at = {ns}.now()", "run-ended"),
        ("UPDATE {ns}.run SET cancelling = true", "abandoned"),
        ("UPDATE {ns}.step SET attempts = attempts", "changed"),
    ],
)
async def test_retry_same_refused_writes_nothing(
    kit: DispatchKit, change: str, outcome: str
) -> None:
    run_id, _ = await uncertain_call(kit)
    row_version = await version(kit, run_id)
    await kit.db.execute(change.format(ns=kit.ns))
    before = (await everything(kit, run_id), await attention(kit, run_id))
    assert await retry_same(kit, run_id, row_version) == (outcome, None)
    assert (await everything(kit, run_id), await attention(kit, run_id)) == before


# --------------------------------------------------------------------------- run_cancel


async def cancel(kit: DispatchKit, run_id: str, on_cancel: str | None = None) -> tuple[Any, ...]:
    kind = None if on_cancel is None else "call"
    return tuple(
        await kit.db.fetchrow(
            f"SELECT * FROM {kit.ns}.run_cancel($1, $2, $3)", run_id, on_cancel, kind
        )
    )


async def test_cancel_ends_a_run_with_nothing_live(kit: DispatchKit) -> None:
    run_id = await kit.start("notice-checked", {"applicantRef": "applicant-1"})
    assert await cancel(kit, run_id) == ("written", "cancelled")
    assert await steps(kit, run_id) == [("send", 1, "call", "cancelled", None, False, False)]
    assert await run_row(kit, run_id) == ("cancelled", None, None, None)


async def test_cancel_leaves_a_leased_step_to_its_dispatcher(kit: DispatchKit) -> None:
    dispatcher, claimed = await claimed_call(kit)
    assert await cancel(kit, claimed.run_id) == ("written", "cancelling")
    assert await steps(kit, claimed.run_id) == [("send", 1, "call", "ready", None, True, True)]
    # The dispatcher finds it abandoned, and its settle ends the run (with no outcome:
    # nothing after the step ran).
    assert await dispatcher.settler.conclude(claimed, ACCEPTED) is Transition.ABANDONED
    assert await run_row(kit, claimed.run_id) == ("cancelled", None, None, None)


async def test_cancel_keeps_an_uncertain_step_and_the_attention(kit: DispatchKit) -> None:
    run_id, _ = await uncertain_call(kit)
    assert await cancel(kit, run_id) == ("written", "cancelled")
    assert await steps(kit, run_id) == [("send", 1, "call", "uncertain", "unknown", False, False)]
    assert await attention(kit, run_id)


async def test_cancel_with_an_on_cancel_step_runs_along_it(kit: DispatchKit) -> None:
    run_id = await kit.start("notice-checked", {"applicantRef": "applicant-1"})
    assert await cancel(kit, run_id, "apology") == ("written", "cancelling")
    assert await steps(kit, run_id) == [
        ("send", 1, "call", "cancelled", None, False, False),
        ("apology", 2, "call", "ready", None, False, True),
    ]
    run = await kit.run(run_id)
    assert (run["state"], run["cancelling"], run["cancel_seq"]) == ("running", True, 2)


async def test_cancel_of_an_ended_run_writes_nothing(kit: DispatchKit) -> None:
    run_id = await kit.start("notice-checked", {"applicantRef": "applicant-1"})
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'failed', ended_at = {kit.ns}.now() WHERE id = $1",
        run_id,
    )
    before = await everything(kit, run_id)
    assert await cancel(kit, run_id) == ("run-ended", None)
    assert await everything(kit, run_id) == before
