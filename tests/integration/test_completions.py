"""``POST /v1/review-completions`` (CONTRACT §9.5): what is refused, what is accepted, and
that neither answer tells whether a run was waiting; plus the whole gateway → gRPC →
admission path for both producer routes."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from admission.service import serve as serve_admission
from core.rpc.transport import unix_endpoints
from core.runtime import Runtime
from devstack.postgres import DatabaseHandle
from gateway.app import create_app
from gateway.auth import StaticJwksSource, TokenVerifier
from gateway.completions import AdmissionProducers, CompletionHandler, load_credentials
from gateway.events import EventHandler, load_sources, sign
from gateway.routes import GatewayContext
from tests.helpers.pinned_clock import T0
from tests.helpers.review_kit import (
    BINDING,
    EVENT_SOURCE,
    INPUT,
    WAIT,
    AuditLog,
    ReviewKit,
    review_kit,
)
from tests.helpers.serving import serving

pytestmark = pytest.mark.postgres


@pytest.fixture
async def kit(
    tmp_path: Path, database: DatabaseHandle, fake_clock: Callable[[datetime], None]
) -> AsyncIterator[ReviewKit]:
    async with review_kit(tmp_path, database) as made:
        yield made


async def waiting_run(kit: ReviewKit) -> tuple[str, str]:
    """A run waiting for its review decision: (run id, review id)."""
    dispatcher = await kit.dispatcher()
    run_id = await kit.start()
    await dispatcher.drain()
    wait = await kit.step(run_id)
    assert wait is not None and wait["state"] == "waiting"
    return run_id, await kit.review_id(run_id)


async def runs_snapshot(kit: ReviewKit) -> list[tuple[Any, ...]]:
    rows = await kit.db.fetch(f"SELECT id, state, attention, updated_at FROM {kit.ns}.run")
    return [tuple(row) for row in rows]


def refused(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "authentication.refused"
    assert "Bearer" not in problem["detail"] and BINDING not in problem["detail"]


REFUSALS: dict[str, Callable[[str], dict[str, str]]] = {
    "no-headers": lambda token: {},
    "no-authorization": lambda token: {"registry-recipient-binding": BINDING},
    "no-binding": lambda token: {"Authorization": f"Bearer {token}"},
    "wrong-token": lambda token: {
        "Authorization": f"Bearer {token[:-4]}abcd",
        "registry-recipient-binding": BINDING,
    },
    "wrong-binding": lambda token: {
        "Authorization": f"Bearer {token}",
        "registry-recipient-binding": "coordinator-v2",
    },
    "not-bearer": lambda token: {
        "Authorization": f"Basic {token}",
        "registry-recipient-binding": BINDING,
    },
    "empty-binding": lambda token: {
        "Authorization": f"Bearer {token}",
        "registry-recipient-binding": "",
    },
}


async def test_every_refusal_is_401_and_touches_no_run(kit: ReviewKit) -> None:
    _run_id, review_id = await waiting_run(kit)
    steps, runs = await kit.steps_snapshot(), await runs_snapshot(kit)

    for case, headers in sorted(REFUSALS.items()):
        response = await kit.coordinator.post(
            "/v1/review-completions",
            json={"reviewId": review_id},
            headers=headers(kit.completion_token),
        )
        assert response.status_code == 401, case
        refused(response)

    assert kit.waker.calls == []
    assert kit.audits.records == []
    assert await kit.steps_snapshot() == steps
    assert await runs_snapshot(kit) == runs


async def test_a_repeated_binding_header_is_refused(kit: ReviewKit) -> None:
    _run_id, review_id = await waiting_run(kit)
    steps = await kit.steps_snapshot()
    response = await kit.coordinator.post(
        "/v1/review-completions",
        json={"reviewId": review_id},
        headers=[
            ("Authorization", f"Bearer {kit.completion_token}"),
            ("registry-recipient-binding", BINDING),
            ("registry-recipient-binding", BINDING),
        ],
    )
    refused(response)
    assert kit.waker.calls == [] and await kit.steps_snapshot() == steps


async def test_without_a_completion_block_every_event_is_refused(
    tmp_path: Path, database: DatabaseHandle, fake_clock: Callable[[datetime], None]
) -> None:
    async with review_kit(tmp_path, database, completion=False) as kit:
        _run_id, review_id = await waiting_run(kit)
        steps = await kit.steps_snapshot()
        # The token file is still there; without the block nothing is compared with it.
        response = await kit.complete(review_id, token=kit.completion_token)
        refused(response)
        assert kit.waker.calls == [] and await kit.steps_snapshot() == steps


async def test_an_event_for_an_unknown_review_is_accepted_and_changes_nothing(
    kit: ReviewKit,
) -> None:
    await waiting_run(kit)
    steps, runs = await kit.steps_snapshot(), await runs_snapshot(kit)

    response = await kit.complete("rev-nobody-asked-for", token=kit.completion_token)

    assert response.status_code == 202
    assert response.content == b""
    assert kit.waker.calls == [("review", "rev-nobody-asked-for")]
    assert await kit.steps_snapshot() == steps
    assert await runs_snapshot(kit) == runs
    assert [(r.action, r.outcome) for r in kit.audits.records] == [("review-completion", "ok")]


async def test_an_event_brings_the_waiting_runs_next_read_forward_to_now(
    kit: ReviewKit, fake_clock: Callable[[datetime], None]
) -> None:
    run_id, review_id = await waiting_run(kit)
    before = await kit.step(run_id)
    assert before is not None and before["due_at"] > T0
    moment = datetime(2027, 3, 1, 9, 30, tzinfo=UTC)
    fake_clock(moment)

    response = await kit.complete(review_id, token=kit.completion_token)
    again = await kit.complete(review_id, token=kit.completion_token)

    assert (response.status_code, again.status_code) == (202, 202)
    after = await kit.step(run_id)
    assert after is not None
    assert (after["state"], after["due_at"], after["next_check_at"]) == ("waiting", moment, moment)
    assert (after["checks"], after["timeout_at"]) == (before["checks"], before["timeout_at"])
    # The event carried no decision: the run still waits until a read finds one.
    assert (await kit.run(run_id))["state"] == "waiting"
    assert await kit.payload(run_id, WAIT, "wait-result") is None


async def test_a_malformed_body_with_good_credentials_is_400(kit: ReviewKit) -> None:
    bodies: list[dict[str, Any]] = [
        {"reviewId": 7},
        {"reviewId": ""},
        {"reviewId": "r", "outcome": "approved"},
        {},
    ]
    for body in bodies:
        response = await kit.coordinator.post(
            "/v1/review-completions",
            json=body,
            headers={
                "Authorization": f"Bearer {kit.completion_token}",
                "registry-recipient-binding": BINDING,
            },
        )
        assert response.status_code == 400, body
        assert response.json()["code"] == "request.invalid"
    assert kit.waker.calls == []
    # Authenticated, so each refusal is an audited action all the same (CONTRACT §12).
    outcomes = [(r.action, r.outcome, r.principal) for r in kit.audits.records]
    assert outcomes == [("review-completion", "invalid", None)] * len(bodies)


# ------------------------------------------------------------- through the real gRPC hop


@pytest.fixture
def sockets() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rcw-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def test_both_producer_routes_reach_admission_over_grpc(
    kit: ReviewKit, sockets: Path
) -> None:
    run_id, review_id = await waiting_run(kit)
    runtime = Runtime(
        kit.checked, kit.runtime.resolver, unix_endpoints(sockets), recovery_only=False
    )
    audits = AuditLog()
    async with serving(admission=lambda started: serve_admission(runtime, started)):
        producers = AdmissionProducers(runtime.endpoints)
        ctx = GatewayContext(
            backend=audits,  # type: ignore[arg-type]
            verifier=empty_verifier(),
            policies={},
            completions=CompletionHandler(
                load_credentials(kit.checked.config, runtime.resolver),
                producers.review_completion,
            ),
            events=EventHandler(
                load_sources(kit.checked.config, runtime.resolver), producers.start_from_event
            ),
        )
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(ctx)), base_url="http://gw"
            ) as client:
                woke = await client.post(
                    "/v1/review-completions",
                    json={"reviewId": review_id},
                    headers={
                        "Authorization": f"Bearer {kit.completion_token}",
                        "registry-recipient-binding": BINDING,
                    },
                )
                body = json.dumps(
                    {
                        "specversion": "1.0",
                        "id": "evt-1",
                        "source": EVENT_SOURCE,
                        "type": "org.example.application.submitted",
                        "data": {**INPUT, "applicationId": "APP-7777"},
                    }
                ).encode()
                # The gateway's clock is the test clock.
                signature = sign(kit.event_key, body, int(T0.timestamp()))
                started = await client.post(
                    "/v1/events",
                    content=body,
                    headers={"registry-event-signature": signature},
                )
        finally:
            await producers.close()

    assert woke.status_code == 202
    wait = await kit.step(run_id)
    assert wait is not None and wait["due_at"] == T0
    assert started.status_code == 201, started.text
    document = started.json()
    assert document["state"] == "running"
    assert started.headers["location"] == f"/v1/runs/{document['runId']}"
    assert [(r.action, r.outcome) for r in audits.records] == [
        ("review-completion", "ok"),
        ("event-start", "ok"),
    ]


def empty_verifier() -> TokenVerifier:
    """The producer routes never ask it: they carry no access token."""
    return TokenVerifier(
        issuer="https://issuer.example.org",
        audience="https://coordinator.example.org",
        algorithms=("ES256",),
        clock_skew_seconds=60,
        source=StaticJwksSource({"keys": []}),
    )
