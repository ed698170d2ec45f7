"""A call that keeps getting retryable answers is in sight (CONTRACT §8.4, §8.6; issue 41).

While a call waits for its next automatic attempt, inspection shows what its last attempt
met (``retry``: ``lastCause``, ``lastStatus``, ``lastAttemptAt``, ``nextAttemptAt``,
``deadlineAt``), every attempt moves the run's ``updatedAt``, and doctor counts it under
``state.retrying``. Once its unbroken series of retryable answers has lasted
``deployment.attention.retryingAfterSeconds`` (600 s here, the default), the step takes the
cause ``retrying`` and its run asks for attention — from the dispatcher's sweep, or from the
retry that finds the series long enough — until the step prepares again or ends.

The dispatcher runs against the real PostgreSQL server with the product scripted in-process,
a pinned test clock (moved, never slept on) and retry delays made exact: the first and
longest delay 60 s, no jitter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.clock import timestamp
from core.products.http import NEVER_CONNECTED, TLS_REFUSED
from core.runtime import Store
from devstack.postgres import DatabaseHandle
from dispatcher.engine import Dispatcher
from dispatcher.settings import DispatchSettings
from recovery import reads
from recovery.cancel import cancel as actions_cancel
from recovery.env import RecoveryEnv
from tests.helpers.base_kit import ISSUER
from tests.helpers.dispatching import (
    MESSAGING,
    WORKFLOWS,
    DispatchKit,
    ScriptedProduct,
    dispatch_kit,
    notice_call,
)
from tests.helpers.failing_http import FailingHttp
from tests.helpers.pinned_clock import T0

pytestmark = pytest.mark.postgres

WORKFLOW = "notice-long"
DEADLINE_SECONDS = 7200
"""Long enough to retry past the attention threshold (600 s by default)."""
THRESHOLD = 600
DELAY = 60.0
UNAVAILABLE = (503, {"type": "about:blank", "status": 503, "code": "service.unavailable"})
BUSY = (429, {"type": "about:blank", "status": 429, "code": "rate-limited"})
ACCEPTED = (201, {"messageId": "msg-retried", "acceptedAt": "2027-03-01T09:00:00.000Z"})


def _long_notice() -> bytes:
    document = yaml.safe_load(WORKFLOWS["notice"])
    document["id"] = WORKFLOW
    document["steps"]["send"]["call"] = {**notice_call(), "deadlineSeconds": DEADLINE_SECONDS}
    return yaml.safe_dump(document, sort_keys=False).encode()


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database, workflows={WORKFLOW: _long_notice()}) as made:
        yield made


@pytest.fixture
async def recovery(kit: DispatchKit) -> Store:
    store = Store(kit.runtime, "recovery")
    kit.stores.append(store)
    await store.open()
    await store.verify()
    return store


async def exact_dispatcher(kit: DispatchKit, *, sweep_limit: int = 100) -> Dispatcher:
    """A dispatcher whose retry delays are exactly :data:`DELAY` seconds (whose sweep finds
    nothing with ``sweep_limit`` 0)."""
    dispatcher = await kit.dispatcher(
        DispatchSettings(
            retry_first_seconds=DELAY, retry_cap_seconds=DELAY, sweep_limit=sweep_limit
        )
    )
    dispatcher.env = dataclasses.replace(dispatcher.env, jitter=lambda: 0.0)
    return dispatcher


async def send_step(recovery: Store, run_id: str) -> dict[str, Any]:
    """The call step as inspection shows it."""
    document = await reads.inspection(recovery, run_id)
    [step] = [s for s in document["steps"] if s["step"] == "send"]
    shown: dict[str, Any] = step
    return shown


async def doctor_retrying(recovery: Store) -> int:
    doctor = await reads.doctor(recovery, audit_ready=True, recovery_only=False)
    retrying: int = doctor["state"]["retrying"]
    return retrying


async def listed(
    recovery: Store, attention: str = "", cause: str = "", order: str = ""
) -> list[dict[str, Any]]:
    wanted = reads.ListFilter.build(
        workflows=(WORKFLOW,), attention=attention, cause=cause, order=order
    )
    runs: list[dict[str, Any]] = (await reads.list_runs(recovery, wanted))["runs"]
    return runs


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_a_product_answering_503_is_in_sight_and_asks_for_attention_past_the_threshold(
    kit: DispatchKit, recovery: Store, fake_clock: Callable[[datetime], None]
) -> None:
    product = ScriptedProduct(UNAVAILABLE)
    kit.product(product)
    dispatcher = await exact_dispatcher(kit)
    run_id = await kit.start(WORKFLOW, {"applicantRef": "applicant-1"})
    created = timestamp(T0)

    # The first attempt, five seconds after the start.
    fake_clock(at(5))
    assert await dispatcher.run_once() == 1
    step = await send_step(recovery, run_id)
    assert (step["state"], step["attempts"]) == ("ready", 1)
    assert "cause" not in step
    assert step["retry"] == {
        "lastCause": "status-503",
        "lastStatus": 503,
        "lastAttemptAt": timestamp(at(5)),
        "nextAttemptAt": timestamp(at(5 + DELAY)),
        "deadlineAt": timestamp(at(5 + DEADLINE_SECONDS)),
    }
    # (the members in the documented order: after the cause, before startedAt)
    assert list(step)[-2:] == ["retry", "startedAt"]
    status = await reads.status(recovery, run_id)
    assert (status["createdAt"], status["updatedAt"]) == (created, timestamp(at(5)))
    assert status["attention"] is False
    assert await doctor_retrying(recovery) == 1

    # Each attempt moves the run's updatedAt, and the record follows the last one.
    fake_clock(at(5 + DELAY))
    assert await dispatcher.run_once() == 1
    step = await send_step(recovery, run_id)
    assert step["attempts"] == 2
    assert step["retry"]["lastAttemptAt"] == timestamp(at(5 + DELAY))
    assert step["retry"]["nextAttemptAt"] == timestamp(at(5 + 2 * DELAY))
    assert step["retry"]["nextAttemptAt"] > step["retry"]["lastAttemptAt"]
    assert (await reads.status(recovery, run_id))["updatedAt"] == timestamp(at(5 + DELAY))
    assert len(product.requests) == 2

    # Just short of the threshold, counted from the first retryable answer: no attention.
    fake_clock(at(5 + THRESHOLD - 1))
    assert (await dispatcher.claimer.sweep()).flagged == 0
    assert (await reads.status(recovery, run_id))["attention"] is False
    assert await listed(recovery, attention="true") == []

    # Past it, the sweep flags the step without waiting for its next attempt.
    fake_clock(at(5 + THRESHOLD + 1))
    assert (await dispatcher.claimer.sweep()).flagged == 1
    status = await reads.status(recovery, run_id)
    assert (status["state"], status["attention"]) == ("running", True)
    assert status["updatedAt"] == timestamp(at(5 + THRESHOLD + 1))
    step = await send_step(recovery, run_id)
    assert step["cause"] == "retrying"
    assert step["retry"]["lastCause"] == "status-503"
    [entry] = await listed(recovery, attention="true")
    assert entry["attentionStep"] == {
        "step": "send",
        "cause": "retrying",
        "since": timestamp(at(5 + THRESHOLD + 1)),
    }
    assert [r["runId"] for r in await listed(recovery, cause="retrying")] == [run_id]
    assert [r["runId"] for r in await listed(recovery, cause="retrying", order="oldest")] == [
        run_id
    ]
    assert await doctor_retrying(recovery) == 1

    # The next attempt is answered 503 again: the series is still too long, so the retry
    # itself keeps the attention (the prepare before it had cleared it).
    assert await dispatcher.run_once() == 1
    assert len(product.requests) == 3
    status = await reads.status(recovery, run_id)
    assert status["attention"] is True
    assert status["updatedAt"] == timestamp(at(5 + THRESHOLD + 1))
    step = await send_step(recovery, run_id)
    assert (step["cause"], step["attempts"]) == ("retrying", 3)
    assert step["retry"]["lastAttemptAt"] == timestamp(at(5 + THRESHOLD + 1))
    [entry] = await listed(recovery, attention="true")
    assert entry["attentionStep"]["cause"] == "retrying"

    # The product takes the command: the step completes and every sign goes.
    product.answers.clear()
    product.answers.append(ACCEPTED)
    fake_clock(at(5 + THRESHOLD + 1 + DELAY))
    await dispatcher.drain()
    status = await reads.status(recovery, run_id)
    assert (status["state"], status["outcome"], status["attention"]) == (
        "succeeded",
        "sent",
        False,
    )
    step = await send_step(recovery, run_id)
    assert (step["state"], step["effect"], step["attempts"]) == ("completed", "accepted", 4)
    assert "retry" not in step and "cause" not in step
    assert await doctor_retrying(recovery) == 0
    assert await listed(recovery, attention="true") == []
    assert (await dispatcher.claimer.sweep()).flagged == 0


async def test_a_retry_that_finds_the_series_long_enough_asks_for_attention_itself(
    kit: DispatchKit, recovery: Store, fake_clock: Callable[[datetime], None]
) -> None:
    kit.product(ScriptedProduct(BUSY))
    # (a dispatcher whose sweep flags nothing: only the retry can)
    dispatcher = await exact_dispatcher(kit, sweep_limit=0)
    run_id = await kit.start(WORKFLOW, {"applicantRef": "applicant-2"})
    assert await dispatcher.run_once() == 1
    step = await send_step(recovery, run_id)
    assert (step["retry"]["lastCause"], step["retry"]["lastStatus"]) == ("status-429", 429)
    for attempt in range(1, THRESHOLD // int(DELAY)):
        fake_clock(at(attempt * DELAY))
        assert await dispatcher.run_once() == 1
        assert (await reads.status(recovery, run_id))["attention"] is False

    # The attempt at the threshold, counted from the first 429, is answered 429 again.
    fake_clock(at(THRESHOLD))
    assert await dispatcher.run_once() == 1
    status = await reads.status(recovery, run_id)
    assert (status["attention"], status["updatedAt"]) == (True, timestamp(at(THRESHOLD)))
    step = await send_step(recovery, run_id)
    assert (step["cause"], step["attempts"]) == ("retrying", THRESHOLD // int(DELAY) + 1)
    # (nothing left for a sweep to do)
    other = await exact_dispatcher(kit)
    assert (await other.claimer.sweep()).flagged == 0


async def test_a_product_that_cannot_be_reached_shows_never_connected(
    kit: DispatchKit, recovery: Store, fake_clock: Callable[[datetime], None]
) -> None:
    kit.http = FailingHttp(kit.http, lambda _m, url: url.startswith(MESSAGING), NEVER_CONNECTED)
    dispatcher = await exact_dispatcher(kit)
    run_id = await kit.start(WORKFLOW, {"applicantRef": "applicant-3"})
    assert await dispatcher.run_once() == 1
    step = await send_step(recovery, run_id)
    assert "cause" not in step
    assert step["retry"] == {
        "lastCause": "never-connected",
        "lastAttemptAt": timestamp(T0),
        "nextAttemptAt": timestamp(at(DELAY)),
        "deadlineAt": timestamp(at(DEADLINE_SECONDS)),
    }
    assert await doctor_retrying(recovery) == 1
    assert (await reads.status(recovery, run_id))["attention"] is False


async def test_a_product_failing_tls_verification_shows_it_with_its_own_cause(
    kit: DispatchKit, recovery: Store
) -> None:
    kit.http = FailingHttp(kit.http, lambda _m, url: url.startswith(MESSAGING), TLS_REFUSED)
    dispatcher = await exact_dispatcher(kit)
    run_id = await kit.start(WORKFLOW, {"applicantRef": "applicant-4"})
    assert await dispatcher.run_once() == 1
    step = await send_step(recovery, run_id)
    assert step["cause"] == "tls-refused"
    assert step["retry"]["lastCause"] == "tls-refused"
    assert "lastStatus" not in step["retry"]
    assert (await reads.status(recovery, run_id))["attention"] is True
    assert await doctor_retrying(recovery) == 1


def refusing_issuer() -> Starlette:
    """Discovery as the real issuer, and ``invalid_client`` for every token request."""

    async def discovery(request: Request) -> JSONResponse:
        return JSONResponse({"issuer": ISSUER, "token_endpoint": f"{ISSUER}/token"})

    async def token(request: Request) -> JSONResponse:
        return JSONResponse({"error": "invalid_client"}, status_code=401)

    return Starlette(
        routes=[
            Route("/.well-known/openid-configuration", discovery),
            Route("/token", token, methods=["POST"]),
        ]
    )


async def test_a_refused_token_shows_token_refused_and_moves_updated_at(
    kit: DispatchKit, recovery: Store, fake_clock: Callable[[datetime], None]
) -> None:
    kit.router.add(ISSUER, refusing_issuer())
    dispatcher = await kit.dispatcher(DispatchSettings(error_retry_seconds=DELAY))
    run_id = await kit.start(WORKFLOW, {"applicantRef": "applicant-7"})
    fake_clock(at(5))
    assert await dispatcher.run_once() == 1
    step = await send_step(recovery, run_id)
    # Nothing was sent (no attempt counted); the step says why, and when it tries again.
    assert (step["state"], step["attempts"], step["cause"]) == ("ready", 0, "token-refused")
    assert step["retry"] == {
        "lastCause": "token-refused",
        "lastAttemptAt": timestamp(at(5)),
        "nextAttemptAt": timestamp(at(5 + DELAY)),
        "deadlineAt": timestamp(at(5 + DEADLINE_SECONDS)),
    }
    status = await reads.status(recovery, run_id)
    assert (status["attention"], status["updatedAt"]) == (True, timestamp(at(5)))

    fake_clock(at(5 + DELAY))
    assert await dispatcher.run_once() == 1
    assert (await reads.status(recovery, run_id))["updatedAt"] == timestamp(at(5 + DELAY))
    assert (await send_step(recovery, run_id))["retry"]["lastAttemptAt"] == timestamp(at(5 + DELAY))
    assert await doctor_retrying(recovery) == 1


async def test_a_cancel_ends_a_retrying_call_with_its_attention(
    kit: DispatchKit, recovery: Store, fake_clock: Callable[[datetime], None]
) -> None:
    kit.product(ScriptedProduct(UNAVAILABLE))
    dispatcher = await exact_dispatcher(kit)
    run_id = await kit.start(WORKFLOW, {"applicantRef": "applicant-5"})
    assert await dispatcher.run_once() == 1
    fake_clock(at(THRESHOLD + 1))
    assert (await dispatcher.claimer.sweep()).flagged == 1
    assert (await reads.status(recovery, run_id))["attention"] is True

    env = RecoveryEnv.from_store(recovery, kit.http, recovery_only=False)
    assert (await actions_cancel(env, run_id, "INC-2027-0041"))["result"] == "cancelled"
    status = await reads.status(recovery, run_id)
    assert (status["state"], status["attention"]) == ("cancelled", False)
    step = await send_step(recovery, run_id)
    assert step["state"] == "cancelled"
    assert "retry" not in step and "cause" not in step
    assert await doctor_retrying(recovery) == 0


async def test_a_retrying_call_past_its_deadline_fails_the_run_without_attention(
    kit: DispatchKit, recovery: Store, fake_clock: Callable[[datetime], None]
) -> None:
    kit.product(ScriptedProduct(UNAVAILABLE))
    dispatcher = await exact_dispatcher(kit)
    run_id = await kit.start(WORKFLOW, {"applicantRef": "applicant-6"})
    assert await dispatcher.run_once() == 1
    fake_clock(at(THRESHOLD + 1))
    assert (await dispatcher.claimer.sweep()).flagged == 1

    fake_clock(at(DEADLINE_SECONDS + 1))
    await dispatcher.drain()
    status = await reads.status(recovery, run_id)
    assert (status["state"], status["failure"]["kind"], status["attention"]) == (
        "failed",
        "deadline-exceeded",
        False,
    )
    step = await send_step(recovery, run_id)
    assert "retry" not in step and "cause" not in step
    assert await doctor_retrying(recovery) == 0
