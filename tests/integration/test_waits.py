"""Casework review waits (CONTRACT §9.5) with the dispatcher against real PostgreSQL and the
Casework, Messaging and issuer stand-ins in-process: woken by a completion event, or by
polling alone; timeouts; reads that fail or are refused; an event racing a read."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from devstack.postgres import DatabaseHandle
from dispatcher.settings import DispatchSettings
from tests.helpers.dispatching import running, until
from tests.helpers.pinned_clock import T0
from tests.helpers.review_kit import CASEWORK, WAIT, ReviewKit, review_kit

pytestmark = pytest.mark.postgres

DAY = 86_400


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[ReviewKit]:
    async with review_kit(tmp_path, database) as made:
        yield made


@pytest.fixture
async def polling_kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[ReviewKit]:
    async with review_kit(tmp_path, database, completion=False) as made:
        yield made


def review_reads_answered(
    kit: ReviewKit, answer: Callable[[dict[str, Any], Any, Any, Any], Any]
) -> None:
    """Put ``answer(scope, receive, send, stand_in)`` in front of Casework's result reads."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and "/v1/" in scope["path"]:
            await answer(scope, receive, send, kit.casework)
        else:
            await kit.casework(scope, receive, send)

    kit.router.add(CASEWORK, app)


async def plain(status: int, scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


# ----------------------------------------------------------------------- woken or polled


async def test_a_completion_event_wakes_a_waiting_run_within_a_second(kit: ReviewKit) -> None:
    # Reads are a day apart and the dispatcher idles up to a minute: only the event, through
    # the gateway, admission and the step's NOTIFY, can wake the run in time.
    dispatcher = await kit.dispatcher(DispatchSettings(idle_cap_seconds=60))
    async with running(dispatcher):
        run_id = await kit.start()

        async def waiting() -> bool:
            step = await kit.step(run_id)
            return step is not None and step["checks"] == 1

        await until(waiting, dispatcher)
        assert (await kit.run(run_id))["state"] == "waiting"
        review_id = await kit.review_id(run_id)
        began = time.monotonic()
        await kit.decide(review_id, "approved")

        async def ended() -> bool:
            return (await kit.run(run_id))["ended_at"] is not None

        await until(ended, dispatcher)
        elapsed = time.monotonic() - began

    assert elapsed < 1.0, f"woke after {elapsed:.2f} s"
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["attention"]) == ("succeeded", "approved", False)
    assert await kit.step_ids(run_id) == [
        "request-review",
        WAIT,
        "decide",
        "send-approval",
        "approved",
    ]
    assert kit.waker.calls == [("review", review_id)]
    assert kit.casework.completions.deliveries[review_id].delivered
    # One read when the wait began, one after the event: never a read per tick.
    assert len(kit.reads()) == 2
    wait = await kit.step(run_id)
    assert wait is not None and (wait["state"], wait["checks"]) == ("completed", 2)
    decision = kit.casework.reviews[review_id].decision
    assert decision is not None
    kept = await kit.payload(run_id, WAIT, "wait-result")
    assert kept == {"outcome": "approved", "decidedAt": decision.decided_at}
    sealed = await kit.db.fetchval(
        f"SELECT ciphertext FROM {kit.ns}.payload WHERE run_id = $1 AND step_id = $2",
        run_id,
        WAIT,
    )
    assert b"approved" not in bytes(sealed)
    [notice] = kit.notices()
    assert notice["template"] == "application-approved"
    assert notice["recipientRef"] == "person-17"
    audit = kit.audits.records[-1]
    assert (audit.action, audit.outcome, audit.client_id, audit.principal) == (
        "review-completion",
        "ok",
        None,
        None,
    )


async def test_without_a_completion_block_the_run_progresses_by_polling_alone(
    polling_kit: ReviewKit, fake_clock: Callable[[datetime], None]
) -> None:
    kit = polling_kit
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    await dispatcher.drain()

    wait = await kit.step(run_id)
    assert wait is not None
    assert (wait["state"], wait["checks"]) == ("waiting", 1)
    assert (await kit.run(run_id))["state"] == "waiting"
    next_check: datetime = wait["next_check_at"]
    assert T0 + timedelta(seconds=0.9 * DAY) <= next_check <= T0 + timedelta(seconds=1.1 * DAY)
    assert wait["due_at"] == next_check
    assert wait["timeout_at"] == T0 + timedelta(days=14)

    await kit.decide(await kit.review_id(run_id), "approved")
    assert kit.casework.completions.deliveries == {}  # nothing tells the coordinator
    assert await dispatcher.run_once() == 0  # so nothing is due before the next check

    fake_clock(next_check - timedelta(seconds=1))
    assert await dispatcher.run_once() == 0
    fake_clock(next_check + timedelta(seconds=1))
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("succeeded", "approved")
    assert len(kit.reads()) == 2
    assert [n["template"] for n in kit.notices()] == ["application-approved"]


async def test_a_rejection_takes_the_other_branch_with_the_decision_time(
    kit: ReviewKit,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    await dispatcher.drain()
    review_id = await kit.review_id(run_id)
    await kit.decide(review_id, "rejected")
    await kit.casework.completions.drain()
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("succeeded", "rejected")
    decision = kit.casework.reviews[review_id].decision
    assert decision is not None
    [notice] = kit.notices()
    assert notice["template"] == "application-rejected"
    assert notice["parameters"] == {
        "applicationId": "APP-2041",
        "decidedAt": decision.decided_at,
    }


async def test_the_wait_times_out_at_its_onTimeout_step(
    polling_kit: ReviewKit, fake_clock: Callable[[datetime], None]
) -> None:
    kit = polling_kit
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    await dispatcher.drain()
    fake_clock(T0 + timedelta(days=14, seconds=1))
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("succeeded", "expired")
    assert await kit.step_ids(run_id) == ["request-review", WAIT, "expired"]
    wait = await kit.step(run_id)
    assert wait is not None and (wait["state"], wait["checks"]) == ("completed", 2)
    assert await kit.payload(run_id, WAIT, "wait-result") is None
    assert kit.notices() == []


# ---------------------------------------------------------------- reads that do not answer


async def test_a_failed_read_only_schedules_the_next_check(
    polling_kit: ReviewKit, fake_clock: Callable[[datetime], None]
) -> None:
    kit = polling_kit
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    await dispatcher.drain()
    first = await kit.step(run_id)
    assert first is not None
    kit.router.remove(CASEWORK)  # Casework is down: connections are refused
    later = first["next_check_at"] + timedelta(seconds=1)
    fake_clock(later)
    assert await dispatcher.run_once() == 1

    wait = await kit.step(run_id)
    run = await kit.run(run_id)
    assert wait is not None
    assert (wait["state"], wait["checks"], run["state"], run["attention"]) == (
        "waiting",
        2,
        "waiting",
        False,
    )
    assert wait["due_at"] == wait["next_check_at"]
    assert later + timedelta(seconds=0.9 * DAY) <= wait["due_at"]


@pytest.mark.parametrize("status", [403, 404])
async def test_a_refused_read_keeps_the_run_waiting_with_attention_until_answered(
    polling_kit: ReviewKit, fake_clock: Callable[[datetime], None], status: int
) -> None:
    kit = polling_kit

    async def refuse(scope: Any, receive: Any, send: Any, stand_in: Any) -> None:
        await plain(status, scope, receive, send)

    review_reads_answered(kit, refuse)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    await dispatcher.drain()

    run = await kit.run(run_id)
    wait = await kit.step(run_id)
    assert wait is not None
    assert (run["state"], run["attention"], wait["state"], wait["checks"]) == (
        "waiting",
        True,
        "waiting",
        1,
    )
    # The product's policy is repaired: the next read is answered and the mark goes.
    kit.router.add(CASEWORK, kit.casework)
    fake_clock(wait["next_check_at"] + timedelta(seconds=1))
    assert await dispatcher.run_once() == 1
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("waiting", False)


async def test_an_event_that_arrives_during_a_read_is_not_lost(kit: ReviewKit) -> None:
    # Casework answers the first read "pending" from just before the decision, and the
    # completion event reaches the coordinator while that answer is on its way back.
    kit.casework.completions.enabled = False
    raced: list[str] = []

    async def stale_pending(scope: Any, receive: Any, send: Any, stand_in: Any) -> None:
        answer: list[Any] = []

        async def keep(message: Any) -> None:
            answer.append(message)

        await stand_in(scope, receive, keep)
        if not raced:
            review_id = scope["path"].rsplit("/", 1)[1]
            raced.append(review_id)
            await kit.decide(review_id, "approved")
            completed = await kit.complete(review_id, token=kit.completion_token)
            assert completed.status_code == 202
        for message in answer:
            await send(message)

    review_reads_answered(kit, stale_pending)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    # No clock moves and the next planned read is a day away: only the raced event can
    # make the wait due again.
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("succeeded", "approved")
    assert raced and len(kit.reads()) == 2
    wait = await kit.step(run_id)
    assert wait is not None and wait["checks"] == 2


async def test_reads_of_runs_that_started_together_are_spread_out(
    polling_kit: ReviewKit, fake_clock: Callable[[datetime], None]
) -> None:
    kit = polling_kit
    dispatcher = await kit.dispatcher()
    runs = [
        await kit.start({"applicationId": f"APP-{n:04d}", "applicantRef": "p"}) for n in range(12)
    ]
    await dispatcher.drain()
    checks = [await kit.step(run_id) for run_id in runs]
    offsets = sorted((step["next_check_at"] - T0).total_seconds() for step in checks if step)
    assert len(offsets) == 12
    assert all(0.9 * DAY <= offset <= 1.1 * DAY for offset in offsets)
    # Random spread: twelve runs started in the same instant do not share one read instant.
    assert len(set(offsets)) == 12
    assert offsets[-1] - offsets[0] > 60
