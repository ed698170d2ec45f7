"""A cancel as the dispatcher honours it (CONTRACT §10.3), against the real PostgreSQL server
with the issuer, Messaging and Casework stand-ins in-process.

Recovery's side of a cancel is simulated here with exactly the writes the design gives it
(:func:`cancel`): the run marked cancelling, its unleased ready/waiting steps ended, and —
with an onCancel path — that path's first step inserted due now, its seq kept as the run's
cancel_seq. What is left to the dispatcher is a step it holds the lease of: its answer is
recorded as the step's own outcome, and leads nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from core import clock
from devstack.postgres import DatabaseHandle
from dispatcher.settings import DispatchSettings
from tests.helpers import dispatching
from tests.helpers.base_kit import ISSUER
from tests.helpers.dispatching import DispatchKit, dispatch_kit
from tests.helpers.pinned_clock import T0
from tests.helpers.review_kit import CASEWORK, WAIT, ReviewKit, review_kit

pytestmark = pytest.mark.postgres

CANCELLABLE = "notice-cancellable"
ON_CANCEL = "say-cancelled"


# call → finish, and an onCancel path that sends a notice of its own before it finishes
CANCELLABLE_SOURCE = yaml.safe_dump(
    {
        "format": dispatching.FORMAT,
        "id": CANCELLABLE,
        "version": "1.0.0",
        "description": "A dispatcher test workflow with an onCancel path.",
        "input": dispatching.INPUT_SCHEMA,
        "connections": {"notices": "messaging"},
        "outcomes": ["sent", "cancelled"],
        "start": "send",
        "onCancel": ON_CANCEL,
        "steps": {
            "send": {"call": dispatching.notice_call("test-notice"), "next": "sent"},
            "sent": {"finish": {"outcome": "sent"}},
            ON_CANCEL: {"call": dispatching.notice_call("test-cancelled"), "next": "cancelled"},
            "cancelled": {"finish": {"outcome": "cancelled"}},
        },
    },
    sort_keys=False,
).encode()


@pytest.fixture
async def kit(
    tmp_path: Path, database: DatabaseHandle, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[DispatchKit]:
    monkeypatch.setitem(dispatching.WORKFLOWS, CANCELLABLE, CANCELLABLE_SOURCE)
    async with dispatch_kit(tmp_path, database) as made:
        yield made


@pytest.fixture
async def review(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[ReviewKit]:
    # No completion block: only the test makes the wait due, so nothing races it.
    async with review_kit(tmp_path, database, completion=False) as made:
        yield made


async def cancel(
    db: asyncpg.Connection, ns: str, run_id: str, on_cancel: str | None = None
) -> int | None:
    """Recovery's cancel, as the design writes it; answers the run's cancel_seq.

    One transaction with the run locked: unleased ready/waiting/not-sent steps end
    cancelled; with ``on_cancel`` (a call step here) the run is cancelling from the next
    seq, where that step is inserted due now; without it the run is cancelling and ends at
    once unless a step is leased.
    """
    async with db.transaction():
        await clock.apply_to(db)
        await db.execute(f"SELECT 1 FROM {ns}.run WHERE id = $1 FOR UPDATE", run_id)
        await db.execute(
            f"UPDATE {ns}.step SET state = 'cancelled', ended_at = {ns}.now(), due_at = NULL, "
            f"updated_at = {ns}.now() WHERE run_id = $1 AND lease_owner IS NULL "
            "AND state IN ('ready', 'waiting', 'not-sent')",
            run_id,
        )
        if on_cancel is not None:
            seq = int(
                await db.fetchval(f"SELECT max(seq) + 1 FROM {ns}.step WHERE run_id = $1", run_id)
            )
            await db.execute(
                f"UPDATE {ns}.run SET cancelling = true, cancel_seq = $2, state = 'running', "
                f"updated_at = {ns}.now() WHERE id = $1",
                run_id,
                seq,
            )
            await db.execute(
                f"INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at) "
                f"VALUES ($1, $2, $3, 'call', 'ready', {ns}.now())",
                run_id,
                on_cancel,
                seq,
            )
            return seq
        await db.execute(
            f"UPDATE {ns}.run SET cancelling = true, updated_at = {ns}.now() WHERE id = $1",
            run_id,
        )
        leased = await db.fetchval(
            f"SELECT count(*) FROM {ns}.step WHERE run_id = $1 AND lease_owner IS NOT NULL",
            run_id,
        )
        if not leased:
            await db.execute(
                f"UPDATE {ns}.run SET state = 'cancelled', ended_at = {ns}.now(), "
                f"updated_at = {ns}.now() WHERE id = $1",
                run_id,
            )
        return None


class HeldProduct:
    """A product that holds each command until :attr:`opened`, then answers ``answer``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = json.dumps(body).encode()
        self.requests = 0
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        self.requests += 1
        self.entered.set()
        await self.opened.wait()
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": self.body})


class Gate:
    """An ASGI wrapper that holds requests whose path passes ``holds`` until opened."""

    def __init__(self, app: Any, holds: Callable[[str], bool]) -> None:
        self.app = app
        self.holds = holds
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.holds(scope["path"]):
            self.entered.set()
            await self.opened.wait()
        await self.app(scope, receive, send)


async def out_and_cancelled(
    kit: DispatchKit, workflow: str, entered: Callable[[], Any], on_cancel: str | None = None
) -> tuple[str, asyncio.Task[int]]:
    """Start a run, let the dispatcher send its first call, and cancel while it is out."""
    dispatcher = await kit.dispatcher()
    run_id = await kit.start(workflow, {"applicantRef": "applicant-c"})
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await entered()
    assert await cancel(kit.db, kit.ns, run_id, on_cancel) == (None if on_cancel is None else 2)
    run = await kit.run(run_id)
    # The leased step is left to the dispatcher: the run is cancelling, not ended.
    assert (run["cancelling"], run["ended_at"]) == (True, None)
    assert (await kit.step(run_id, "send"))["state"] == "prepared"
    return run_id, working


# ------------------------------------------------------------- a call out at the cancel


async def test_without_on_cancel_the_answer_is_kept_and_the_run_ends_cancelled(
    kit: DispatchKit,
) -> None:
    await kit.fault(mode="hang-after", count=1)
    run_id, working = await out_and_cancelled(
        kit, "notice", lambda: kit.messaging.faults.wait_hanging(1)
    )
    kit.messaging.faults.release()
    assert await working == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["lease_owner"], send["due_at"]) == (
        "completed",
        "accepted",
        None,
        None,
    )
    [answer] = (await kit.stats())["answers"]
    assert await kit.payload(run_id, "send", "response") == answer["body"]
    assert await kit.payload(run_id, "send", "output") == {"messageId": answer["body"]["messageId"]}
    assert await kit.step_ids(run_id) == ["send"]  # "sent" was never made due
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["failure_kind"], run["attention"]) == (
        "cancelled",
        None,
        None,
        False,
    )
    assert run["ended_at"] is not None
    assert await (await kit.dispatcher()).drain() == 0
    assert (await kit.stats())["processed"] == {kit.key(run_id): 1}


async def test_with_on_cancel_the_answer_settles_and_the_cancel_path_runs_to_its_finish(
    kit: DispatchKit,
) -> None:
    await kit.fault(mode="hang-after", count=1)
    run_id, working = await out_and_cancelled(
        kit, CANCELLABLE, lambda: kit.messaging.faults.wait_hanging(1), ON_CANCEL
    )
    kit.messaging.faults.release()
    assert await working == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("completed", "accepted")
    assert await kit.payload(run_id, "send", "output") is not None
    # No normal next step; the cancel path's first step waits its turn.
    assert await kit.step_ids(run_id) == ["send", ON_CANCEL]
    run = await kit.run(run_id)
    assert (run["state"], run["cancelling"], run["ended_at"]) == ("running", True, None)

    assert await (await kit.dispatcher()).drain() == 2
    assert await kit.step_ids(run_id) == ["send", ON_CANCEL, "cancelled"]
    notice = await kit.step(run_id, ON_CANCEL)
    assert (notice["state"], notice["effect"], notice["seq"]) == ("completed", "accepted", 2)
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["failure_kind"]) == (
        "cancelled",
        "cancelled",
        None,
    )
    assert (await kit.stats())["processed"] == {
        kit.key(run_id): 1,
        kit.key(run_id, ON_CANCEL): 1,
    }


async def test_a_retryable_answer_on_an_abandoned_call_ends_it_without_a_resend(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    product = HeldProduct(503, {"code": "service.unavailable"})
    kit.product(product)
    run_id, working = await out_and_cancelled(kit, "notice", product.entered.wait)
    product.opened.set()
    assert await working == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["due_at"], send["attempts"]) == (
        "cancelled",
        None,
        None,
        1,
    )
    assert send["ended_at"] is not None
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("cancelled", None)
    # Long past any retry delay: nothing is due, nothing is sent again.
    fake_clock(T0 + timedelta(hours=1))
    assert await (await kit.dispatcher()).drain() == 0
    assert product.requests == 1


async def test_an_uncertain_answer_on_an_abandoned_call_stays_unknown_and_keeps_attention(
    kit: DispatchKit,
) -> None:
    product = HeldProduct(500, {"code": "internal-error"})
    kit.product(product)
    run_id, working = await out_and_cancelled(kit, "notice", product.entered.wait)
    product.opened.set()
    assert await working == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["due_at"], send["lease_owner"]) == (
        "uncertain",
        "unknown",
        None,
        None,
    )
    # An uncertain step keeps nothing live: the run ends cancelled, and still needs an
    # operator's look at the unknown effect.
    run = await kit.run(run_id)
    assert (run["state"], run["attention"], run["outcome"]) == ("cancelled", True, None)
    assert await (await kit.dispatcher()).drain() == 0
    assert product.requests == 1


async def test_a_refusal_on_an_abandoned_call_is_recorded_and_leads_nowhere(
    kit: DispatchKit,
) -> None:
    product = HeldProduct(422, {"code": "request.invalid"})
    kit.product(product)
    run_id, working = await out_and_cancelled(kit, "notice-refusable", product.entered.wait)
    product.opened.set()
    assert await working == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("refused", None)
    assert await kit.step_ids(run_id) == ["send"]  # not on to onRefused
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["failure_kind"]) == ("cancelled", None, None)


# ----------------------------------------------------------- claimed, not yet prepared


async def test_a_cancel_committed_before_the_command_is_prepared_stops_it(
    kit: DispatchKit,
) -> None:
    gate = Gate(kit.issuer.app, lambda path: path == "/token")
    kit.router.add(ISSUER, gate)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-p"})
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await gate.entered.wait()
    # The run was read before the cancel: only the locked prepare can notice it.
    assert await cancel(kit.db, kit.ns, run_id) is None
    assert (await kit.run(run_id))["ended_at"] is None
    gate.opened.set()
    assert await working == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["command_key"], send["prepared_at"], send["lease_owner"]) == (
        "cancelled",
        None,
        None,
        None,
    )
    assert await kit.payload(run_id, "send", "command") is None
    assert (await kit.run(run_id))["state"] == "cancelled"
    assert (await kit.stats())["received"] == {}


async def mark_cancelling(kit: DispatchKit, run_id: str) -> None:
    """A cancel whose step update missed a step (a claim racing it): only the run's flag."""
    await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", run_id)


@pytest.mark.parametrize(
    ("workflow", "run_input", "first"),
    [
        ("notice", {"applicantRef": "applicant-r"}, "send"),
        ("route", {"kind": "a"}, "decide"),
        ("pause", {}, "nap"),
    ],
)
async def test_a_claimed_step_of_an_abandoned_kind_ends_cancelled_and_does_nothing(
    kit: DispatchKit, workflow: str, run_input: dict[str, Any], first: str
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start(workflow, run_input)
    await mark_cancelling(kit, run_id)
    assert await dispatcher.run_once() == 1

    step = await kit.step(run_id, first)
    assert (step["state"], step["due_at"], step["lease_owner"]) == ("cancelled", None, None)
    assert await kit.step_ids(run_id) == [first]
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("cancelled", None)
    assert (await kit.stats())["received"] == {}


class HoldingProduct:
    """Accepts each command after setting the execution hold, as an operator's hold landing
    while the command is out would: the answer is then settled by the locked transaction,
    which leaves the finish after the call due instead of running it (under the hold
    nothing is executed), so a cancel can still meet that finish."""

    def __init__(self, kit: DispatchKit) -> None:
        self.kit = kit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await dispatching.read_body(receive)
        await self.kit.db.execute(f"UPDATE {self.kit.ns}.hold SET execution_hold = true")
        body = {"messageId": "msg-held", "acceptedAt": "2027-03-01T08:00:00.000Z"}
        await dispatching.send_answer(send, 202, body)


async def test_a_finish_reached_by_an_abandoned_path_never_runs(kit: DispatchKit) -> None:
    kit.product(HoldingProduct(kit))
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-f"})
    assert await dispatcher.run_once() == 1  # the call; "sent" is now due, not run
    assert (await kit.step(run_id, "sent"))["state"] == "ready"
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = false")
    await mark_cancelling(kit, run_id)
    assert await dispatcher.run_once() == 1

    assert (await kit.step(run_id, "sent"))["state"] == "cancelled"
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("cancelled", None)


async def test_a_timer_that_comes_due_on_an_abandoned_step_ends_cancelled(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("pause", {})
    assert await dispatcher.run_once() == 1
    assert (await kit.step(run_id, "nap"))["state"] == "waiting"
    await mark_cancelling(kit, run_id)
    fake_clock(T0 + timedelta(hours=1))
    assert await dispatcher.run_once() == 1

    assert (await kit.step(run_id, "nap"))["state"] == "cancelled"
    assert await kit.step_ids(run_id) == ["nap"]
    assert (await kit.run(run_id))["state"] == "cancelled"


# ------------------------------------------------- a lease that ends without an answer


async def test_an_expired_lease_on_an_abandoned_prepared_call_ends_the_run(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    run_id = await kit.start("notice", {"applicantRef": "applicant-d"})
    # A replica prepared the command and vanished; the cancel left its leased step alone.
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET state = 'prepared', command_key = $2, attempts = 1, "
        "lease_owner = 'dead-replica', lease_expires_at = $3, lease_epoch = 0 "
        "WHERE run_id = $1 AND step_id = 'send'",
        run_id,
        kit.key(run_id),
        T0 + timedelta(seconds=30),
    )
    assert await cancel(kit.db, kit.ns, run_id) is None
    assert (await kit.run(run_id))["ended_at"] is None
    fake_clock(T0 + timedelta(seconds=31))
    assert await (await kit.dispatcher()).run_once() == 0

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["lease_owner"]) == ("uncertain", "unknown", None)
    run = await kit.run(run_id)
    assert (run["state"], run["attention"], run["outcome"]) == ("cancelled", True, None)
    assert run["ended_at"] is not None


async def test_a_stop_that_cuts_off_an_abandoned_call_ends_the_run(kit: DispatchKit) -> None:
    await kit.fault(mode="hang-after")
    dispatcher = await kit.dispatcher(DispatchSettings(shutdown_budget_seconds=0.2))
    task = asyncio.create_task(dispatcher.run())
    run_id = await kit.start("notice", {"applicantRef": "applicant-t"})
    async with asyncio.timeout(10):
        await kit.messaging.faults.wait_hanging(1)
    assert await cancel(kit.db, kit.ns, run_id) is None
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["lease_owner"]) == ("uncertain", "unknown", None)
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("cancelled", True)


async def test_a_stop_on_a_cancel_path_run_only_holds_it(kit: DispatchKit) -> None:
    # With an onCancel path still to run, the run is held for the uncertain step, not ended.
    await kit.fault(mode="hang-after")
    dispatcher = await kit.dispatcher(DispatchSettings(shutdown_budget_seconds=0.2))
    task = asyncio.create_task(dispatcher.run())
    run_id = await kit.start(CANCELLABLE, {"applicantRef": "applicant-u"})
    async with asyncio.timeout(10):
        await kit.messaging.faults.wait_hanging(1)
    await kit.db.execute(
        f"UPDATE {kit.ns}.hold SET execution_hold = true"
    )  # keep the cancel path from being claimed before the stop
    assert await cancel(kit.db, kit.ns, run_id, ON_CANCEL) == 2
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    assert (await kit.step(run_id, "send"))["state"] == "uncertain"
    assert (await kit.step(run_id, ON_CANCEL))["state"] == "ready"
    run = await kit.run(run_id)
    assert (run["state"], run["attention"], run["ended_at"]) == ("held", True, None)


# ----------------------------------------------------------------- the cancel path


async def test_steps_on_the_cancel_path_are_retried_as_usual(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start(CANCELLABLE, {"applicantRef": "applicant-x"})
    # Nothing is leased yet: the cancel ends the first step itself.
    assert await cancel(kit.db, kit.ns, run_id, ON_CANCEL) == 2
    assert (await kit.step(run_id, "send"))["state"] == "cancelled"
    await kit.fault(mode="fail-before", count=1)
    assert await dispatcher.run_once() == 1

    notice = await kit.step(run_id, ON_CANCEL)
    assert (notice["state"], notice["attempts"]) == ("ready", 1)
    assert notice["due_at"] > T0
    fake_clock(notice["due_at"])  # the first retry delay, well inside the deadline
    assert await dispatcher.drain() == 2

    assert await kit.step_ids(run_id) == ["send", ON_CANCEL, "cancelled"]
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("cancelled", "cancelled")
    assert (await kit.step(run_id, ON_CANCEL))["attempts"] == 2
    # (The refused first attempt never reached the stand-in's ledger.)
    assert (await kit.stats())["processed"] == {kit.key(run_id, ON_CANCEL): 1}


# ---------------------------------------------------------------- a wait being read


async def test_a_wait_read_during_a_cancel_ends_cancelled_and_keeps_no_decision(
    review: ReviewKit,
) -> None:
    kit = review
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    await dispatcher.drain()
    wait = await kit.step(run_id)
    assert wait is not None and (wait["state"], wait["checks"]) == ("waiting", 1)
    await kit.decide(await kit.review_id(run_id), "approved")

    gate = Gate(kit.casework, lambda path: "/review-requests/" in path)
    kit.router.add(CASEWORK, gate)
    # Due now, as a completion event would make it.
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET due_at = {kit.ns}.now(), next_check_at = {kit.ns}.now() "
        "WHERE run_id = $1 AND step_id = $2",
        run_id,
        WAIT,
    )
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await gate.entered.wait()
    assert await cancel(kit.db, kit.ns, run_id, "notify-cancelled") == 3
    wait = await kit.step(run_id)
    assert wait is not None and wait["state"] == "waiting"  # leased: left to the dispatcher
    gate.opened.set()
    assert await working == 1

    wait = await kit.step(run_id)
    assert wait is not None
    assert (wait["state"], wait["due_at"], wait["lease_owner"]) == ("cancelled", None, None)
    assert await kit.payload(run_id, WAIT, "wait-result") is None  # the decision leads nowhere
    await dispatcher.drain()
    assert await kit.step_ids(run_id) == ["request-review", WAIT, "notify-cancelled", "cancelled"]
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("cancelled", "cancelled")
    assert [notice["template"] for notice in kit.notices()] == ["application-cancelled"]
