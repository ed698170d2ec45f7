"""A call whose access token the issuer refuses sends nothing and says so (CONTRACT §8.4).

The issuer is replaced by a small app that serves discovery and refuses every token request
(``invalid_client``), or grants fewer scopes than the connection asks for. Either way the
product sees no request, the run stays ``running`` with ``attention: true``, the step shows
``cause: token-refused``, doctor names the connection with the issuer's error code only, and
the dispatcher counts the refusal. Once the issuer gives tokens again, the same step is sent
once and the signs go away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.runtime import Store
from devstack.postgres import DatabaseHandle
from dispatcher.settings import DispatchSettings
from recovery import reads
from tests.helpers.base_kit import ISSUER
from tests.helpers.dispatching import DispatchKit, dispatch_kit, token_refusals

pytestmark = pytest.mark.postgres


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


def misbehaving_issuer(token_answer: tuple[int, dict[str, Any]]) -> Starlette:
    """Discovery as the real one, and one fixed answer to every token request."""
    requests: list[str] = []

    async def discovery(request: Request) -> JSONResponse:
        return JSONResponse({"issuer": ISSUER, "token_endpoint": f"{ISSUER}/token"})

    async def token(request: Request) -> JSONResponse:
        requests.append((await request.body()).decode())
        status, body = token_answer
        return JSONResponse(body, status_code=status)

    app = Starlette(
        routes=[
            Route("/.well-known/openid-configuration", discovery),
            Route("/token", token, methods=["POST"]),
        ]
    )
    app.state.requests = requests
    return app


REFUSALS: dict[str, tuple[int, dict[str, Any]]] = {
    "invalid_client": (401, {"error": "invalid_client"}),
    "scope-narrowed": (
        200,
        {
            "access_token": "header.payload.signature",
            "token_type": "Bearer",
            "expires_in": 300,
            "scope": "receipts:read",  # the connection asks for messages:send
        },
    ),
}


async def received(kit: DispatchKit) -> int:
    """Commands the Messaging stand-in received, resends included."""
    return sum((await kit.stats())["received"].values())


async def recovery_store(kit: DispatchKit) -> Store:
    store = Store(kit.runtime, "recovery")
    kit.stores.append(store)
    await store.open()
    return store


@pytest.mark.parametrize("error", sorted(REFUSALS))
async def test_a_refused_token_sends_nothing_and_holds_attention_until_a_token_comes(
    kit: DispatchKit, error: str
) -> None:
    real_issuer = kit.issuer.app
    issuer = misbehaving_issuer(REFUSALS[error])
    kit.router.add(ISSUER, issuer)
    dispatcher = await kit.dispatcher(DispatchSettings(error_retry_seconds=0))
    recovery = await recovery_store(kit)
    run_id = await kit.start("notice", {"applicantRef": "applicant-1"})

    assert await dispatcher.run_once() == 1

    # Nothing reached the product; the issuer was asked once.
    assert await received(kit) == 0
    assert len(issuer.state.requests) == 1
    status = await reads.status(recovery, run_id)
    assert (status["state"], status["attention"]) == ("running", True)
    [step] = (await reads.inspection(recovery, run_id))["steps"]
    assert (step["step"], step["state"], step["cause"]) == ("send", "ready", "token-refused")
    assert "effect" not in step and "causeStatus" not in step
    doctor = await reads.doctor(recovery, audit_ready=True, recovery_only=False)
    assert doctor["tokenRefusals"] == [{"connection": "notices", "error": error}]
    assert token_refusals(dispatcher.metrics, "messaging") == 1
    assert dispatcher.metrics.calls("messaging", "accepted") == 0
    assert 'coordinator_token_refusals_total{connection_type="messaging"} 1.0' in (
        dispatcher.metrics.render()
    )

    # The issuer is mended: the same step goes out once, and the signs go away.
    kit.router.add(ISSUER, real_issuer)
    await dispatcher.drain()
    assert await received(kit) == 1
    status = await reads.status(recovery, run_id)
    assert (status["state"], status["outcome"], status["attention"]) == (
        "succeeded",
        "sent",
        False,
    )
    [step] = [s for s in (await reads.inspection(recovery, run_id))["steps"] if s["step"] == "send"]
    assert "cause" not in step and step["effect"] == "accepted"
    doctor = await reads.doctor(recovery, audit_ready=True, recovery_only=False)
    assert doctor["tokenRefusals"] == []


async def test_a_refused_token_past_the_deadline_fails_the_run_deadline_exceeded(
    kit: DispatchKit,
) -> None:
    kit.router.add(ISSUER, misbehaving_issuer(REFUSALS["invalid_client"]))
    dispatcher = await kit.dispatcher(DispatchSettings(error_retry_seconds=0))
    recovery = await recovery_store(kit)
    run_id = await kit.start("notice", {"applicantRef": "applicant-1"})
    assert await dispatcher.run_once() == 1
    # The deadline (300 s from the first attempt) passes while the issuer still refuses.
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET deadline_at = now() - interval '1 second' WHERE run_id = $1",
        run_id,
    )
    await dispatcher.drain()
    status = await reads.status(recovery, run_id)
    assert status["state"] == "failed"
    assert status["failure"]["kind"] == "deadline-exceeded"
    assert await received(kit) == 0
