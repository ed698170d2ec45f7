"""The dispatcher executing workflows against the real TLS PostgreSQL server, a development
issuer and the Messaging stand-in (in-process): calls, choices, timers and the four ways a
product can answer a command (CONTRACT §9.2–§9.4)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from core.codes import Code
from core.errors import CoordinatorError
from devstack.postgres import DatabaseHandle
from dispatcher.claim import Claimed
from dispatcher.metrics import DispatchMetrics
from dispatcher.settings import DispatchSettings
from dispatcher.steps.base import Flight
from tests.helpers.dispatching import (
    IN_PROCESS,
    LOOPBACK,
    MESSAGING,
    DispatchKit,
    ScriptedProduct,
    dispatch_kit,
    first_dispatches,
    read_body,
    running,
    send_answer,
    until,
)
from tests.helpers.pinned_clock import T0

pytestmark = pytest.mark.postgres

ACCEPTED_BODY = {"messageId": "msg-scripted", "acceptedAt": "2027-03-01T08:00:00.000Z"}


@pytest.fixture(params=[IN_PROCESS, LOOPBACK])
async def kit(
    tmp_path: Path, database: DatabaseHandle, request: pytest.FixtureRequest
) -> AsyncIterator[DispatchKit]:
    # Every test twice: the stand-ins called in-process, and over real loopback sockets
    # with the coordinator's own HTTP client on the path.
    async with dispatch_kit(tmp_path, database, wire=request.param) as made:
        yield made


def product_posts(kit: DispatchKit) -> list[dict[str, object]]:
    return [
        {"headers": dict(r.headers), "body": json.loads(r.content)}
        for r in kit.router.requests
        if r.url.host == "messaging.internal.example.org"
        and r.method == "POST"
        and r.url.path.startswith("/v1/")
    ]


def accepted_calls(metrics: DispatchMetrics, result: str = "accepted") -> float:
    return metrics.calls("messaging", result)


async def test_a_call_workflow_runs_to_succeeded_woken_by_a_notification(
    kit: DispatchKit,
) -> None:
    # With an idle wait of a minute, only the NOTIFY of the new step can wake it in time.
    dispatcher = await kit.dispatcher(DispatchSettings(idle_cap_seconds=60))
    async with running(dispatcher):
        run_id = await kit.start("notice", {"applicantRef": "applicant-17"})

        async def ended() -> bool:
            return (await kit.run(run_id))["ended_at"] is not None

        await until(ended, dispatcher)

    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["attention"]) == ("succeeded", "sent", False)
    assert await kit.step_ids(run_id) == ["send", "sent"]
    send = await kit.step(run_id, "send")
    key = kit.key(run_id)
    assert (send["state"], send["effect"], send["attempts"]) == ("completed", "accepted", 1)
    assert send["command_key"] == key
    assert send["lease_owner"] is None and send["ended_at"] is not None

    stats = await kit.stats()
    assert stats["processed"] == {key: 1}
    [post] = product_posts(kit)
    headers = post["headers"]
    assert isinstance(headers, dict)
    assert headers["idempotency-key"] == key
    assert headers["authorization"].startswith("Bearer ")
    assert headers["content-type"] == "application/json"
    command = {
        "template": "test-notice",
        "recipientRef": "applicant-17",
        "parameters": {"run": run_id},
    }
    assert post["body"] == command
    assert await kit.payload(run_id, "send", "command") == command
    [message_id] = kit.messaging.messages
    assert await kit.payload(run_id, "send", "output") == {"messageId": message_id}
    response = await kit.payload(run_id, "send", "response")
    assert response["messageId"] == message_id

    assert accepted_calls(dispatcher.metrics) == 1
    assert first_dispatches(dispatcher.metrics) == 1
    # The token asked for the connection's audience as its one resource.
    assert [claims["aud"] for claims in kit.issuer.issued] == [MESSAGING]


async def test_a_call_after_a_call_is_prepared_by_the_first_ones_settle_and_sent_once(
    kit: DispatchKit,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice-twice", {"applicantRef": "applicant-2"})
    claims = 0
    claim = dispatcher.claimer.claim

    async def counted(limit: int) -> list[Claimed]:
        nonlocal claims
        found = await claim(limit)
        claims += len(found)
        return found

    dispatcher.claimer.claim = counted  # type: ignore[method-assign]
    # One claim, of the first call: its settle records the choose and prepares the second
    # call, which the same execution sends and settles with the finish.
    assert await dispatcher.run_once() == 4
    assert claims == 1 and dispatcher.settler.calls_chained == 1
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["attention"]) == ("succeeded", "sent-twice", False)
    assert await kit.step_ids(run_id) == ["send", "check", "again", "sent-twice"]
    again = await kit.step(run_id, "again")
    assert (again["state"], again["effect"], again["attempts"]) == ("completed", "accepted", 1)
    assert again["command_key"] == kit.key(run_id, "again") and again["lease_owner"] is None
    # Each command once, under its own key; the second carries the first's kept value.
    stats = await kit.stats()
    assert stats["processed"] == {kit.key(run_id): 1, kit.key(run_id, "again"): 1}
    first, second = kit.messaging.messages
    command = {
        "template": "test-notice-again",
        "recipientRef": first,
        "parameters": {"run": run_id},
    }
    assert [post["body"] for post in product_posts(kit)][1] == command
    assert await kit.payload(run_id, "again", "command") == command
    assert await kit.payload(run_id, "again", "output") == {"messageId": second}


async def test_a_call_after_a_call_is_claimed_when_the_token_is_not_in_hand(
    kit: DispatchKit,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice-twice", {"applicantRef": "applicant-3"})
    [claimed] = await dispatcher.claimer.claim(10)
    # The first call's token is forgotten as soon as it is sent: the settle may not wait for
    # the issuer, so the second call is made due for a claim instead.
    exchange = dispatcher.env.http.exchange

    async def forgetting(*args: Any, **kwargs: Any) -> Any:
        answer = await exchange(*args, **kwargs)
        dispatcher.env.tokens.invalidate("notices")
        return answer

    dispatcher.env.http.exchange = forgetting  # type: ignore[method-assign]
    await dispatcher._execute(claimed, Flight())
    assert dispatcher.settler.calls_chained == 0
    again = await kit.step(run_id, "again")
    assert (again["state"], again["lease_owner"], again["attempts"]) == ("ready", None, 0)
    assert again["due_at"] is not None
    dispatcher.env.http.exchange = exchange  # type: ignore[method-assign]
    assert await dispatcher.run_once() == 2
    assert (await kit.run(run_id))["outcome"] == "sent-twice"
    assert (await kit.stats())["processed"] == {kit.key(run_id): 1, kit.key(run_id, "again"): 1}


async def test_a_next_call_that_cannot_be_made_with_the_settle_is_claimed_and_the_answer_kept(
    kit: DispatchKit,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice-twice", {"applicantRef": "applicant-4"})
    trust = dispatcher.env.calls.tls
    asked = 0

    def second_fails(connection: str) -> Any:
        nonlocal asked
        asked += 1
        if asked == 2:  # while the first call's answer is being settled
            raise RuntimeError("the trust store could not be read")
        return trust(connection)

    dispatcher.env.calls.tls = second_fails  # type: ignore[method-assign]
    # The first call's answer is recorded all the same; the second call is made due.
    assert await dispatcher.run_once() == 2
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("completed", "accepted")
    again = await kit.step(run_id, "again")
    assert (again["state"], again["lease_owner"], again["due_at"] is not None) == (
        "ready",
        None,
        True,
    )
    assert dispatcher.settler.calls_chained == 0
    assert await dispatcher.run_once() == 2
    assert (await kit.run(run_id))["outcome"] == "sent-twice"
    assert (await kit.stats())["processed"] == {kit.key(run_id): 1, kit.key(run_id, "again"): 1}


async def test_choose_takes_the_first_branch_that_holds(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    runs = {kind: await kit.start("route", {"kind": kind}) for kind in ("a", "c", "zzz")}
    runs["none"] = await kit.start("route", {})
    assert await dispatcher.drain() == 8  # a choose and a finish per run

    outcomes = {kind: (await kit.run(run_id))["outcome"] for kind, run_id in runs.items()}
    assert outcomes == {"a": "a", "c": "b-or-c", "zzz": "other", "none": "other"}
    assert await kit.step_ids(runs["c"]) == ["decide", "went-bc"]
    assert (await kit.step(runs["a"], "decide"))["state"] == "completed"


async def test_later_steps_read_the_values_a_call_kept(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice-checked", {"applicantRef": "applicant-3"})
    await dispatcher.drain()
    assert (await kit.run(run_id))["outcome"] == "kept"
    assert await kit.step_ids(run_id) == ["send", "check", "kept"]


async def test_a_calls_settle_records_the_choose_and_finish_after_it(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice-checked", {"applicantRef": "applicant-4"})

    # One claim (the call); its settling statement decides the choose and ends the run.
    assert await dispatcher.run_once() == 3
    assert dispatcher.settler.steps_done_inline == 2
    assert await dispatcher.claimer.claim(8) == []
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("succeeded", "kept")
    rows = [await kit.step(run_id, step_id) for step_id in ("send", "check", "kept")]
    assert [(r["seq"], r["step_type"], r["state"]) for r in rows] == [
        (1, "call", "completed"),
        (2, "choose", "completed"),
        (3, "finish", "completed"),
    ]
    # Written as the steps would have been on their own: ended, never due, never leased.
    assert all(r["ended_at"] == run["ended_at"] for r in rows)
    assert all((r["due_at"], r["lease_owner"]) == (None, None) for r in rows)
    assert (rows[1]["attempts"], rows[2]["effect"]) == (0, None)


async def test_wait_until_wakes_when_the_clock_reaches_its_instant(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("pause", {})
    assert await dispatcher.drain() == 1

    nap = await kit.step(run_id, "nap")
    due = T0 + timedelta(seconds=3600)
    assert (nap["state"], nap["due_at"]) == ("waiting", due)
    assert (await kit.run(run_id))["state"] == "waiting"

    fake_clock(due - timedelta(seconds=1))
    assert await dispatcher.run_once() == 0
    # The idle loop would sleep exactly until the instant, not a fixed poll interval.
    wake = await dispatcher.claimer.next_wake()
    assert wake.due_in == pytest.approx(1.0)
    assert wake.delay(5.0) == pytest.approx(1.0)

    fake_clock(due + timedelta(milliseconds=500))
    assert await dispatcher.drain() == 2
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("succeeded", "woke")
    assert run["ended_at"] - due < timedelta(seconds=1)


async def test_wait_until_an_instant_in_the_past_is_due_at_once(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    dispatcher = await kit.dispatcher()
    past = await kit.start("pause-at", {"when": "2027-02-28T08:00:00Z"})
    future = await kit.start("pause-at", {"when": "2027-03-01T08:00:10+00:00"})
    await dispatcher.drain()

    assert (await kit.run(past))["state"] == "succeeded"
    assert (await kit.step(past, "nap"))["state"] == "completed"
    nap = await kit.step(future, "nap")
    assert (nap["state"], nap["due_at"]) == ("waiting", T0 + timedelta(seconds=10))


async def test_an_invalid_command_fails_the_run_and_sends_nothing(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice-optional", {"applicantRef": "applicant-1"})
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["failure_kind"]) == ("failed", "invalid-command")
    assert (run["failure_path"], run["failure_step"]) == ("/recipientRef", "send")
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["command_key"]) == ("failed", None, None)
    assert await kit.payload(run_id, "send", "command") is None
    assert (await kit.stats())["received"] == {}
    # Not even a token was asked for.
    assert kit.issuer.issued == []


async def test_a_failed_output_mapping_keeps_the_accepted_effect(kit: DispatchKit) -> None:
    kit.product(ScriptedProduct((202, {"acceptedAt": "2027-03-01T08:00:00.000Z"})))
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-2"})
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["failure_kind"], run["failure_path"]) == (
        "failed",
        "mapping-invalid",
        "/messageId",
    )
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("failed", "accepted")
    assert await kit.payload(run_id, "send", "response") == {
        "acceptedAt": "2027-03-01T08:00:00.000Z"
    }
    assert await kit.payload(run_id, "send", "output") is None


async def test_a_retryable_answer_is_retried_by_itself_and_processed_once(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    await kit.fault(mode="fail-before", count=1)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-4"})
    key = kit.key(run_id)
    await dispatcher.drain()

    send = await kit.step(run_id, "send")
    assert (send["state"], send["attempts"], send["command_key"]) == ("ready", 1, key)
    delay = (send["due_at"] - T0).total_seconds()
    assert 1.0 <= delay <= 1.25
    assert send["deadline_at"] == T0 + timedelta(seconds=60)
    assert await dispatcher.run_once() == 0  # not before its time

    fake_clock(T0 + timedelta(seconds=2))
    await dispatcher.drain()
    run = await kit.run(run_id)
    assert run["state"] == "succeeded"
    stats = await kit.stats()
    assert stats["processed"] == {key: 1}
    assert stats["received"] == {key: 1}  # the 503 came before the ledger
    posts = product_posts(kit)
    assert [p["headers"]["idempotency-key"] for p in posts] == [key, key]  # type: ignore[index]
    assert posts[0]["body"] == posts[1]["body"]
    assert accepted_calls(dispatcher.metrics, "retryable") == 1
    assert accepted_calls(dispatcher.metrics) == 1
    assert (await kit.step(run_id, "send"))["attempts"] == 2


async def test_a_retry_waits_as_long_as_the_products_retry_after_asks_up_to_the_cap(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    busy = {"code": "service.unavailable"}
    product = ScriptedProduct(
        (503, busy, {"Retry-After": "20"}),
        (429, {}, {"Retry-After": "3600"}),
        (202, {"messageId": "m-1", "acceptedAt": "2027-03-01T08:00:00.000Z"}),
    )
    kit.product(product)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-4"})
    await dispatcher.drain()
    send = await kit.step(run_id, "send")
    # 20 s, not the 1-1.25 s of the first backoff.
    assert (send["state"], (send["due_at"] - T0).total_seconds()) == ("ready", 20.0)

    fake_clock(T0 + timedelta(seconds=20))
    await dispatcher.drain()
    send = await kit.step(run_id, "send")
    # An hour asked, the five-minute cap kept; the deadline (60 s) then fails the run.
    assert (send["state"], len(product.requests)) == ("failed", 2)
    assert (await kit.run(run_id))["failure_kind"] == "deadline-exceeded"


async def test_retries_end_at_the_deadline(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    await kit.fault(mode="fail-before")
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-5"})
    now = T0
    for _ in range(10):
        await dispatcher.drain()
        if (await kit.run(run_id))["ended_at"] is not None:
            break
        now = (await kit.step(run_id, "send"))["due_at"]
        fake_clock(now)
    run = await kit.run(run_id)
    assert (run["state"], run["failure_kind"], run["failure_step"]) == (
        "failed",
        "deadline-exceeded",
        "send",
    )
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("failed", None)
    assert (await kit.stats())["processed"] == {}
    # 1 + 2 + 4 + 8 + 16 (+ jitter) fits in 60 s; the next doubling does not.
    assert send["attempts"] == 6


async def test_an_answer_after_processing_holds_the_run_and_is_never_resent(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    await kit.fault(mode="fail-after", count=1)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-6"})
    key = kit.key(run_id)
    await dispatcher.drain()

    run = await kit.run(run_id)
    assert (run["state"], run["attention"], run["ended_at"]) == ("held", True, None)
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["due_at"]) == ("uncertain", "unknown", None)

    fake_clock(T0 + timedelta(days=1))
    assert await dispatcher.drain() == 0
    stats = await kit.stats()
    assert stats["processed"] == {key: 1}
    assert stats["received"] == {key: 1}
    assert accepted_calls(dispatcher.metrics, "uncertain") == 1


@pytest.mark.parametrize(
    ("status", "body"),
    [(500, {"code": "internal-error"}), (502, b""), (202, b"not json"), (503, {"code": "x"})],
)
async def test_uncertain_answers_hold_the_run(
    kit: DispatchKit, status: int, body: bytes | dict[str, str]
) -> None:
    product = ScriptedProduct((status, body))
    kit.product(product)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-7"})
    await dispatcher.drain()
    assert (await kit.run(run_id))["state"] == "held"
    assert (await kit.step(run_id, "send"))["effect"] == "unknown"
    assert len(product.requests) == 1


async def test_a_refusal_takes_on_refused_or_fails_the_run(kit: DispatchKit) -> None:
    product = ScriptedProduct((409, {"code": "idempotency.conflict"}))
    kit.product(product)
    dispatcher = await kit.dispatcher()
    with_path = await kit.start("notice-refusable", {"applicantRef": "applicant-8"})
    without = await kit.start("notice", {"applicantRef": "applicant-9"})
    await dispatcher.drain()

    run = await kit.run(with_path)
    assert (run["state"], run["outcome"]) == ("succeeded", "turned-down")
    assert await kit.step_ids(with_path) == ["send", "turned-down"]
    assert (await kit.step(with_path, "send"))["state"] == "refused"
    run = await kit.run(without)
    assert (run["state"], run["failure_kind"], run["failure_step"]) == ("failed", "refused", "send")
    assert (await kit.step(without, "send"))["effect"] is None
    assert len(product.requests) == 2


async def test_a_401_is_resent_once_with_a_fresh_token(kit: DispatchKit) -> None:
    product = ScriptedProduct((401, {"code": "authentication.refused"}), (202, ACCEPTED_BODY))
    kit.product(product)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-10"})
    await dispatcher.drain()

    assert (await kit.run(run_id))["state"] == "succeeded"
    assert [r["headers"]["idempotency-key"] for r in product.requests] == [kit.key(run_id)] * 2
    first, second = (r["headers"]["authorization"] for r in product.requests)
    assert first != second
    assert len(kit.issuer.issued) == 2
    assert (await kit.step(run_id, "send"))["attempts"] == 1


async def test_a_second_401_is_a_refusal(kit: DispatchKit) -> None:
    product = ScriptedProduct((401, {"code": "authentication.refused"}))
    kit.product(product)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-11"})
    await dispatcher.drain()
    assert (await kit.run(run_id))["failure_kind"] == "refused"
    assert len(product.requests) == 2


async def test_a_stored_command_that_is_not_the_runs_command_is_never_sent(
    kit: DispatchKit, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = await kit.start("notice", {"applicantRef": "applicant-31"})
    # The step names the run's input as its stored command: read with the run, refused.
    await kit.db.execute(
        f"UPDATE {kit.ns}.step s SET command_payload_id = p.id "
        f"FROM {kit.ns}.payload p "
        "WHERE s.run_id = $1 AND s.step_id = 'send' AND p.run_id = $1 AND p.purpose = 'input'",
        run_id,
    )
    dispatcher = await kit.dispatcher()
    assert await dispatcher.run_once() == 1

    assert product_posts(kit) == []
    send = await kit.step(run_id, "send")
    assert (send["state"], send["attempts"], send["lease_owner"]) == ("ready", 0, None)
    assert "failed unexpectedly (CoordinatorError: the step's command payload is missing)" in (
        caplog.text
    )


async def test_a_step_paused_by_the_database_going_away_is_a_warning_not_an_error(
    kit: DispatchKit, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = await kit.start("notice", {"applicantRef": "applicant-32"})
    dispatcher = await kit.dispatcher()

    async def database_away(*_args: object) -> None:
        raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database cannot be reached")

    monkeypatch.setattr(dispatcher, "_run_step", database_away)
    assert await dispatcher.run_once() == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["lease_owner"]) == ("ready", None)
    # The store reports the outage itself (store-unavailable); the step is only paused.
    paused = [r for r in caplog.records if "paused: the database cannot be reached" in r.message]
    assert [r.levelname for r in paused] == ["WARNING"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class AnswerByRecipient:
    """A Messaging stand-in that answers each command by the recipient it names, whatever
    order concurrent requests arrive in; every other recipient is accepted."""

    ANSWERS: ClassVar[dict[str, tuple[int, dict[str, str]]]] = {
        # accepted, but without the messageId the output mapping needs
        "applicant-unmappable": (202, {"acceptedAt": "2027-03-01T08:00:00.000Z"}),
        "applicant-refused": (409, {"code": "idempotency.conflict"}),
        "applicant-uncertain": (500, {"code": "internal-error"}),
    }

    def __init__(self) -> None:
        self.recipients: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        recipient = str(json.loads(await read_body(receive))["recipientRef"])
        self.recipients.append(recipient)
        status, content = self.ANSWERS.get(recipient, (202, ACCEPTED_BODY))
        await send_answer(send, status, content)


async def test_one_steps_failure_in_a_claimed_batch_stays_in_its_own_run(
    kit: DispatchKit,
) -> None:
    product = AnswerByRecipient()
    kit.product(product)
    dispatcher = await kit.dispatcher(DispatchSettings(concurrency=16))
    recipients = [
        "applicant-ok-1",
        "applicant-unmappable",
        "applicant-ok-2",
        "applicant-refused",
        "applicant-ok-3",
        "applicant-uncertain",
        "applicant-ok-4",
    ]
    runs = {r: await kit.start("notice", {"applicantRef": r}) for r in recipients}

    # One claim leases every run's first step; they run side by side and settle apart.
    # The four accepted calls' settling statements also run the finish after them.
    assert await dispatcher.run_once() == len(recipients) + 4
    assert sorted(product.recipients) == sorted(recipients)
    await dispatcher.drain()

    for recipient, run_id in runs.items():
        run = await kit.run(run_id)
        send = await kit.step(run_id, "send")
        if recipient == "applicant-unmappable":
            assert (run["state"], run["failure_kind"], run["failure_path"]) == (
                "failed",
                "mapping-invalid",
                "/messageId",
            )
            assert (send["state"], send["effect"]) == ("failed", "accepted")
            assert await kit.payload(run_id, "send", "output") is None
        elif recipient == "applicant-refused":
            assert (run["state"], run["failure_kind"], run["failure_step"]) == (
                "failed",
                "refused",
                "send",
            )
            assert (send["state"], send["effect"]) == ("refused", None)
        elif recipient == "applicant-uncertain":
            assert (run["state"], run["attention"], run["ended_at"]) == ("held", True, None)
            assert (send["state"], send["effect"]) == ("uncertain", "unknown")
        else:
            assert (run["state"], run["outcome"], run["attention"]) == ("succeeded", "sent", False)
            assert run["failure_kind"] is None
            assert (send["state"], send["effect"]) == ("completed", "accepted")
            assert await kit.payload(run_id, "send", "output") == {"messageId": "msg-scripted"}
            assert await kit.step_ids(run_id) == ["send", "sent"]
    # Each command went out once: nothing of a failed neighbour was sent again.
    assert sorted(product.recipients) == sorted(recipients)
