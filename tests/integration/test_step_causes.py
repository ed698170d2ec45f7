"""Why a call step's effect is unknown, and why a call sent nothing (a token the issuer
refuses, a TLS verification that fails), on the real PostgreSQL server (CONTRACT §8.4, §8.6,
§9.3, §10.5).

Each cause is written by the statement that makes the step uncertain (a settle, a lease
found expired or given up, a restore-hold) and shown by inspection; a refused token or a
failed TLS verification makes the step wait with cause ``token-refused`` or ``tls-refused``
and the run ask for attention until the step prepares or ends (by its deadline or a
cancel), and doctor lists the connections whose token was refused. The dispatcher's own
writes are driven through its :class:`~dispatcher.settle.Settler`, so these tests do not
depend on how the call executor decides them.
"""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.runtime import Store
from core.states import SentNothing, Transition
from devstack.postgres import DatabaseHandle
from dispatcher.claim import Claimed
from dispatcher.engine import Dispatcher
from recovery import holds, reads
from recovery.cancel import cancel as actions_cancel
from recovery.env import RecoveryEnv
from tests.helpers.dispatching import DispatchKit, dispatch_kit
from tests.helpers.pinned_clock import T0

pytestmark = pytest.mark.postgres

DEADLINE_SECONDS = 60
# A command the dispatcher could have mapped; the tests that prepare it never send it.
COMMAND = {"template": "test-notice", "recipientRef": "applicant", "parameters": {}}


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


@pytest.fixture
async def recovery_store(kit: DispatchKit) -> Store:
    store = Store(kit.runtime, "recovery")
    kit.stores.append(store)
    await store.open()
    await store.verify()
    return store


async def claim(dispatcher: Dispatcher, run_id: str) -> Claimed:
    """Claim the run's due step (the only due work in these tests)."""
    claimed = await dispatcher.claimer.claim(10)
    assert [c.run_id for c in claimed] == [run_id]
    return claimed[0]


async def prepare(kit: DispatchKit, dispatcher: Dispatcher, claimed: Claimed) -> None:
    prepared = await dispatcher.settler.prepare(
        claimed,
        command=COMMAND,
        command_payload_id=claimed.command_payload_id,
        command_key=kit.key(claimed.run_id),
        deadline_seconds=DEADLINE_SECONDS,
    )
    assert prepared is not None


async def inspected_step(store: Store, run_id: str, step_id: str = "send") -> dict[str, Any]:
    document = await reads.inspection(store, run_id)
    steps: list[dict[str, Any]] = [s for s in document["steps"] if s["step"] == step_id]
    assert len(steps) == 1
    return steps[0]


async def doctor_refusals(store: Store) -> list[dict[str, str]]:
    document = await reads.doctor(store, audit_ready=True, recovery_only=False)
    refusals: list[dict[str, str]] = document["tokenRefusals"]
    return refusals


# ------------------------------------------------------------------- uncertain steps


async def test_a_settled_uncertain_answer_shows_its_cause_and_status(
    kit: DispatchKit, recovery_store: Store
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-1"})
    claimed = await claim(dispatcher, run_id)
    await prepare(kit, dispatcher, claimed)

    assert await dispatcher.settler.uncertain(claimed, "status-5xx", 502) is Transition.WRITTEN

    step = await inspected_step(recovery_store, run_id)
    assert list(step) == [
        "step",
        "type",
        "state",
        "attempts",
        "effect",
        "cause",
        "causeStatus",
        "startedAt",
    ]
    assert (step["state"], step["effect"], step["cause"], step["causeStatus"]) == (
        "uncertain",
        "unknown",
        "status-5xx",
        502,
    )
    assert (await kit.run(run_id))["state"] == "held"


async def test_an_uncertain_cause_must_be_one_the_dispatcher_gives(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-2"})
    claimed = await claim(dispatcher, run_id)
    await prepare(kit, dispatcher, claimed)

    for cause in ("restore-snapshot", "token-refused", "timeout"):
        with pytest.raises(ValueError, match="not a cause"):
            await dispatcher.settler.uncertain(claimed, cause)
    with pytest.raises(ValueError, match="status-5xx only"):
        await dispatcher.settler.uncertain(claimed, "connection-lost", 500)
    assert (await kit.step(run_id, "send"))["state"] == "prepared"  # nothing was written


async def test_an_expired_lease_on_a_prepared_command_shows_lease_expired(
    kit: DispatchKit, recovery_store: Store, fake_clock: Callable[[datetime], None]
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-3"})
    # A dead dispatcher's prepared command, leased until T0 + 30 s.
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET state = 'prepared', command_key = $2, attempts = 1, "
        "lease_owner = 'dead-replica', lease_expires_at = $3, lease_epoch = 0 "
        "WHERE run_id = $1 AND step_id = 'send'",
        run_id,
        kit.key(run_id),
        T0 + timedelta(seconds=30),
    )
    fake_clock(T0 + timedelta(seconds=31))
    assert await dispatcher.run_once() == 0

    step = await inspected_step(recovery_store, run_id)
    assert (step["state"], step["effect"], step["cause"]) == (
        "uncertain",
        "unknown",
        "lease-expired",
    )
    assert "causeStatus" not in step


async def test_a_prepared_step_given_up_shows_lease_expired(
    kit: DispatchKit, recovery_store: Store
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-4"})
    claimed = await claim(dispatcher, run_id)
    await prepare(kit, dispatcher, claimed)

    assert await dispatcher.settler.release(claimed) == "uncertain"

    step = await inspected_step(recovery_store, run_id)
    assert (step["state"], step["cause"]) == ("uncertain", "lease-expired")
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("held", True)


async def test_a_restore_hold_shows_restore_snapshot_and_keeps_an_earlier_cause(
    kit: DispatchKit, recovery_store: Store
) -> None:
    dispatcher = await kit.dispatcher()
    out = await kit.start("notice", {"applicantRef": "applicant-5"})
    answered = await kit.start("notice", {"applicantRef": "applicant-6"})
    claimed = {c.run_id: c for c in await dispatcher.claimer.claim(10)}
    for run_id in (out, answered):
        await prepare(kit, dispatcher, claimed[run_id])

    await dispatcher.settler.uncertain(claimed[answered], "connection-lost")

    env = RecoveryEnv.from_store(recovery_store, kit.http, recovery_only=False)
    snapshot = await holds.restore_hold(env, "INC-2027-0042")
    assert snapshot["snapshot"] == {"steps": 2, "runs": 2}

    step = await inspected_step(recovery_store, out)
    assert (step["state"], step["effect"], step["cause"]) == (
        "uncertain",
        "unknown",
        "restore-snapshot",
    )
    # Already uncertain for its own reason: that reason is the more useful one to show.
    assert (await inspected_step(recovery_store, answered))["cause"] == "connection-lost"


async def row_version(kit: DispatchKit, run_id: str) -> str:
    """The call step's row version, as an operator's action reads it before deciding."""
    return str(
        await kit.db.fetchval(
            f"SELECT xmin::text FROM {kit.ns}.step WHERE run_id = $1 AND step_id = 'send'", run_id
        )
    )


async def test_an_operator_keeps_the_cause_while_the_effect_is_unknown(
    kit: DispatchKit, recovery_store: Store
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-7"})
    claimed = await claim(dispatcher, run_id)
    await prepare(kit, dispatcher, claimed)
    await dispatcher.settler.uncertain(claimed, "timeout-after-send")

    # retry-same: ready again with its command and key, the effect still unknown.
    q = recovery_store.queries
    async with recovery_store.connection() as conn:
        version = await row_version(kit, run_id)
        made = await q.recovery_step_retry_same(
            conn, run_id=run_id, step_id="send", row_version=version
        )
        assert made is not None and made.outcome == "written"
    step = await inspected_step(recovery_store, run_id)
    assert (step["state"], step["effect"], step["cause"]) == (
        "ready",
        "unknown",
        "timeout-after-send",
    )

    # The dispatcher's answer replaces it: accepted, and no cause any more.
    await dispatcher.drain()
    step = await inspected_step(recovery_store, run_id)
    assert (step["state"], step["effect"]) == ("completed", "accepted")
    assert "cause" not in step
    assert (await kit.run(run_id))["state"] == "succeeded"


async def test_a_receipt_proving_the_command_never_arrived_clears_the_cause(
    kit: DispatchKit, recovery_store: Store
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-8"})
    claimed = await claim(dispatcher, run_id)
    await prepare(kit, dispatcher, claimed)
    await dispatcher.settler.uncertain(claimed, "status-5xx", 504)

    q = recovery_store.queries
    async with recovery_store.connection() as conn:
        version = await row_version(kit, run_id)
        made = await q.recovery_step_not_sent(
            conn, run_id=run_id, step_id="send", row_version=version
        )
        assert made is not None and made.outcome == "written"
    row = await kit.step(run_id, "send")
    assert (row["state"], row["effect"], row["cause"], row["cause_status"]) == (
        "not-sent",
        None,
        None,
        None,
    )


# ---------------------------------------------------- sent nothing: token-refused, tls-refused

SENT_NOTHING = pytest.mark.parametrize("cause", list(SentNothing))
"""Each cause of a call that sent nothing lives the same life (CONTRACT §8.4)."""


async def sent_nothing(
    dispatcher: Dispatcher, claimed: Claimed, cause: SentNothing, *, delay: float
) -> None:
    await dispatcher.settler.sent_nothing(
        claimed, cause, delay=delay, deadline_seconds=DEADLINE_SECONDS
    )


async def cancel(recovery_store: Store, kit: DispatchKit, run_id: str) -> str:
    """Cancel the run as an operator does; answers the action's result."""
    env = RecoveryEnv.from_store(recovery_store, kit.http, recovery_only=False)
    answer = await actions_cancel(env, run_id, "INC-2027-0036")
    result: str = answer["result"]
    return result


@SENT_NOTHING
async def test_a_step_that_sent_nothing_waits_with_attention_until_a_prepare_clears_it(
    kit: DispatchKit,
    recovery_store: Store,
    fake_clock: Callable[[datetime], None],
    cause: SentNothing,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-9"})
    claimed = await claim(dispatcher, run_id)

    await sent_nothing(dispatcher, claimed, cause, delay=5.0)

    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"], row["effect"], row["lease_owner"]) == (
        "ready",
        cause,
        None,
        None,
    )
    assert (row["due_at"], row["first_attempt_at"], row["deadline_at"]) == (
        T0 + timedelta(seconds=5),
        T0,
        T0 + timedelta(seconds=DEADLINE_SECONDS),
    )
    assert (row["attempts"], row["command_key"]) == (0, None)  # nothing was prepared
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("running", True)
    document = await reads.inspection(recovery_store, run_id)
    assert document["attention"] is True
    (step,) = document["steps"]
    assert (step["state"], step["cause"]) == ("ready", cause)
    assert "effect" not in step and "causeStatus" not in step
    assert (await kit.stats())["received"] == {}

    # A later attempt that sends nothing keeps the deadline the first one set.
    fake_clock(T0 + timedelta(seconds=5))
    claimed = await claim(dispatcher, run_id)
    await sent_nothing(dispatcher, claimed, cause, delay=5.0)
    row = await kit.step(run_id, "send")
    assert (row["first_attempt_at"], row["deadline_at"]) == (
        T0,
        T0 + timedelta(seconds=DEADLINE_SECONDS),
    )

    # Mended: preparing the command clears the cause and attention.
    fake_clock(T0 + timedelta(seconds=10))
    claimed = await claim(dispatcher, run_id)
    assert not claimed.past_deadline
    prepared = await dispatcher.settler.prepare(
        claimed,
        command=COMMAND,
        command_payload_id=None,
        command_key=kit.key(run_id),
        deadline_seconds=DEADLINE_SECONDS,
    )
    assert prepared is not None
    # The run's first command is the first one prepared, attempts before it or not.
    assert (prepared.attempts, prepared.first_of_run) == (1, True)
    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"]) == ("prepared", None)
    assert row["deadline_at"] == T0 + timedelta(seconds=DEADLINE_SECONDS)
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("running", False)
    assert "cause" not in await inspected_step(recovery_store, run_id)


@SENT_NOTHING
async def test_a_prepare_keeps_the_attention_another_step_needs(
    kit: DispatchKit, cause: SentNothing
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-10"})
    # An earlier call of the same run (an onCancel path runs beside it) is uncertain.
    await kit.db.execute(
        f"INSERT INTO {kit.ns}.step (run_id, step_id, seq, step_type, state, effect, cause, "
        "ended_at) VALUES ($1, 'earlier', 9, 'call', 'uncertain', 'unknown', "
        "'connection-lost', NULL)",
        run_id,
    )
    claimed = await claim(dispatcher, run_id)
    await sent_nothing(dispatcher, claimed, cause, delay=0.0)
    assert (await kit.run(run_id))["attention"] is True

    claimed = await claim(dispatcher, run_id)
    await prepare(kit, dispatcher, claimed)
    assert (await kit.step(run_id, "send"))["cause"] is None
    assert (await kit.run(run_id))["attention"] is True


@SENT_NOTHING
async def test_both_prepares_clear_a_cause_of_sending_nothing(
    kit: DispatchKit, cause: SentNothing
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-11"})

    # A first attempt, storing the command.
    claimed = await claim(dispatcher, run_id)
    await sent_nothing(dispatcher, claimed, cause, delay=0.0)
    claimed = await claim(dispatcher, run_id)
    assert await dispatcher.settler.prepare(
        claimed,
        command=COMMAND,
        command_payload_id=None,
        command_key=kit.key(run_id),
        deadline_seconds=DEADLINE_SECONDS,
    )
    assert (await kit.step(run_id, "send"))["cause"] is None
    assert (await kit.run(run_id))["attention"] is False

    # A later attempt with the stored command.
    await dispatcher.settler.unprepare(claimed)
    claimed = await claim(dispatcher, run_id)
    assert claimed.command_payload_id is not None
    await sent_nothing(dispatcher, claimed, cause, delay=0.0)
    assert (await kit.run(run_id))["attention"] is True
    claimed = await claim(dispatcher, run_id)
    prepared = await dispatcher.settler.prepare(
        claimed,
        command=None,
        command_payload_id=claimed.command_payload_id,
        command_key=kit.key(run_id),
        deadline_seconds=DEADLINE_SECONDS,
    )
    assert prepared is not None and prepared.attempts == 2
    assert (await kit.step(run_id, "send"))["cause"] is None
    assert (await kit.run(run_id))["attention"] is False


@SENT_NOTHING
async def test_a_step_that_sent_nothing_past_its_deadline_fails_the_run_without_attention(
    kit: DispatchKit,
    recovery_store: Store,
    fake_clock: Callable[[datetime], None],
    cause: SentNothing,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-12"})
    claimed = await claim(dispatcher, run_id)
    # Due again no later than the deadline, however long the delay asked for.
    await sent_nothing(dispatcher, claimed, cause, delay=600.0)
    assert (await kit.step(run_id, "send"))["due_at"] == T0 + timedelta(seconds=DEADLINE_SECONDS)
    assert (await kit.run(run_id))["attention"] is True

    fake_clock(T0 + timedelta(seconds=DEADLINE_SECONDS))
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["failure_kind"], run["failure_step"]) == (
        "failed",
        "deadline-exceeded",
        "send",
    )
    # It ended without being prepared: it leaves no attention behind (CONTRACT §8.4).
    assert run["attention"] is False
    assert (await reads.status(recovery_store, run_id))["attention"] is False
    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"]) == ("failed", None)
    assert (await kit.stats())["received"] == {}


@SENT_NOTHING
async def test_a_step_that_sent_nothing_cancelled_unheld_leaves_no_cause_or_attention(
    kit: DispatchKit, recovery_store: Store, cause: SentNothing
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-14"})
    await sent_nothing(dispatcher, await claim(dispatcher, run_id), cause, delay=5.0)

    # No dispatcher holds the step: the cancel itself ends it, and the run with it.
    assert await cancel(recovery_store, kit, run_id) == "cancelled"

    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("cancelled", False)
    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"]) == ("cancelled", None)
    assert "cause" not in await inspected_step(recovery_store, run_id)


@SENT_NOTHING
async def test_a_step_that_sent_nothing_cancelled_while_held_leaves_no_attention(
    kit: DispatchKit, recovery_store: Store, cause: SentNothing
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-15"})
    await sent_nothing(dispatcher, await claim(dispatcher, run_id), cause, delay=0.0)
    # A dispatcher holds the step again (asking the issuer, say) when the cancel comes: the
    # cancel leaves the step to it, and the run waits for it, still asking for attention.
    claimed = await claim(dispatcher, run_id)
    assert await cancel(recovery_store, kit, run_id) == "cancelling"
    assert (await kit.run(run_id))["attention"] is True

    # The token comes: preparing finds the step abandoned, ends it and the run cancelled,
    # sending nothing.
    prepared = await dispatcher.settler.prepare(
        claimed,
        command=COMMAND,
        command_payload_id=None,
        command_key=kit.key(run_id),
        deadline_seconds=DEADLINE_SECONDS,
    )
    assert prepared is None
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("cancelled", False)
    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"], row["command_key"]) == ("cancelled", None, None)


@SENT_NOTHING
async def test_a_step_that_sent_nothing_again_after_a_cancel_ends_at_its_next_claim(
    kit: DispatchKit, recovery_store: Store, cause: SentNothing
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-16"})
    await sent_nothing(dispatcher, await claim(dispatcher, run_id), cause, delay=0.0)
    claimed = await claim(dispatcher, run_id)
    assert await cancel(recovery_store, kit, run_id) == "cancelling"

    # The holder still gets no token: the step is ready again, and the claim after that
    # ends it cancelled before anything is asked (the run is being cancelled).
    await sent_nothing(dispatcher, claimed, cause, delay=0.0)
    assert await dispatcher.run_once() == 1

    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("cancelled", False)
    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"]) == ("cancelled", None)
    assert (await kit.stats())["received"] == {}


@SENT_NOTHING
async def test_a_step_that_sent_nothing_for_a_lease_not_held_writes_nothing(
    kit: DispatchKit, cause: SentNothing
) -> None:
    dispatcher = await kit.dispatcher()
    other = await kit.dispatcher(owner="other-replica")
    run_id = await kit.start("notice", {"applicantRef": "applicant-13"})
    claimed = await claim(dispatcher, run_id)
    before = dict(await kit.step(run_id, "send"))

    await sent_nothing(other, claimed, cause, delay=0.0)

    assert dict(await kit.step(run_id, "send")) == before
    assert (await kit.run(run_id))["attention"] is False


async def test_only_a_cause_of_sending_nothing_is_recorded_for_a_step_that_sent_nothing(
    kit: DispatchKit,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-17"})
    claimed = await claim(dispatcher, run_id)
    with pytest.raises(ValueError, match="connection-lost"):
        await dispatcher.settler.sent_nothing(
            claimed,
            "connection-lost",  # type: ignore[arg-type]
            delay=0.0,
            deadline_seconds=DEADLINE_SECONDS,
        )
    # Even past the settler, the transition itself writes nothing for another cause.
    q = dispatcher.store.queries
    async with dispatcher.store.connection() as conn:
        due = await q.dispatcher_step_sent_nothing(
            conn,
            run_id=run_id,
            step_id="send",
            owner=dispatcher.settler.owner,
            cause="connection-lost",
            delay=0.0,
            deadline_seconds=DEADLINE_SECONDS,
        )
    assert due is None
    assert (await kit.step(run_id, "send"))["cause"] is None
    assert (await kit.run(run_id))["attention"] is False


# ------------------------------------------------------------------------------- doctor


async def test_doctor_lists_the_connections_whose_token_was_refused(
    kit: DispatchKit, recovery_store: Store
) -> None:
    settler = (await kit.dispatcher()).settler
    assert await doctor_refusals(recovery_store) == []

    await settler.record_token_refusal("notices", "invalid_client")
    await settler.record_token_refusal("alerts", "scope-narrowed")
    assert await doctor_refusals(recovery_store) == [
        {"connection": "alerts", "error": "scope-narrowed"},
        {"connection": "notices", "error": "invalid_client"},
    ]

    # The last refusal is the one shown.
    await settler.record_token_refusal("notices", "unauthorized_client")
    await settler.clear_token_refusal("alerts")
    assert await doctor_refusals(recovery_store) == [
        {"connection": "notices", "error": "unauthorized_client"}
    ]

    await settler.clear_token_refusal("notices")
    await settler.clear_token_refusal("notices")  # nothing left to clear: no error
    assert await doctor_refusals(recovery_store) == []
