"""Casework completion events: sent after a decision, retried with backoff, switchable off."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devstack.products.casework import (
    CaseworkStandIn,
    CompletionDestination,
    TrustedProducer,
    build,
)
from devstack.products.common import StandInSettings
from tests.helpers.devstack_kit import (
    CASEWORK_URL,
    COORDINATOR_URL,
    ISSUER_URL,
    FakeClock,
    FakeSleep,
    HostRouter,
    make_issuer,
)

CLIENT = "coordinator-review"
REVIEWS = "/v1/projects/licensing-reviews/review-requests"
COMPLETION_TOKEN = "completion-token-0123456789abcdef"
BINDING = "coordinator-v1"


@dataclass
class RecordingCoordinator:
    """A fake coordinator that answers ``statuses`` in turn, then 202, and keeps every call."""

    statuses: list[int] = field(default_factory=list)
    calls: list[tuple[dict[str, str], Any]] = field(default_factory=list)

    @property
    def app(self) -> Starlette:
        async def completions(request: Request) -> Response:
            self.calls.append((dict(request.headers), json.loads(await request.body())))
            status = self.statuses.pop(0) if self.statuses else 202
            return JSONResponse({}, status_code=status)

        return Starlette(routes=[Route("/v1/review-completions", completions, methods=["POST"])])


@dataclass
class Setup:
    stand_in: CaseworkStandIn
    client: httpx.AsyncClient
    router: HostRouter
    coordinator: RecordingCoordinator
    sleep: FakeSleep
    token: str

    async def decided_review(self, outcome: str = "approved") -> str:
        created = await self.client.post(
            REVIEWS,
            json={"producer": "coordinator", "subjectRef": "APP-1", "summary": "s"},
            headers={"Authorization": f"Bearer {self.token}", "Idempotency-Key": "k-1"},
        )
        review_id: str = created.json()["reviewId"]
        decided = await self.client.post(
            f"/dev/projects/licensing-reviews/review-requests/{review_id}/decision",
            json={"outcome": outcome},
        )
        assert decided.status_code == 200
        return review_id


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    clock = FakeClock()
    sleep = FakeSleep()
    issuer = make_issuer(tmp_path / "issuer", [], clock)
    coordinator = RecordingCoordinator()
    router = HostRouter({ISSUER_URL: issuer.app, COORDINATOR_URL: coordinator.app})
    http = httpx.AsyncClient(transport=router)
    destination = CompletionDestination(
        url=COORDINATOR_URL + "/v1/review-completions",
        token=COMPLETION_TOKEN,
        recipient_binding=BINDING,
    )
    stand_in = CaseworkStandIn(
        StandInSettings(
            base_url=CASEWORK_URL, issuer=ISSUER_URL, allowed_clients=frozenset({CLIENT})
        ),
        http=http,
        clock=clock,
        sleep=sleep,
        trusted_producers={
            "coordinator": TrustedProducer(client_id=CLIENT, completion=destination)
        },
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=stand_in), base_url=CASEWORK_URL)
    token = issuer.state.mint(
        client_id=CLIENT,
        subject=CLIENT,
        audience=CASEWORK_URL,
        scope="review-requests:write review-requests:read",
        now=clock(),
    )
    try:
        yield Setup(stand_in, client, router, coordinator, sleep, token)
    finally:
        await client.aclose()
        await stand_in.aclose()
        await http.aclose()


async def test_decision_sends_one_completion_event(setup: Setup) -> None:
    review_id = await setup.decided_review()
    await setup.stand_in.completions.drain()
    assert len(setup.coordinator.calls) == 1
    headers, body = setup.coordinator.calls[0]
    assert body == {"reviewId": review_id}
    assert headers["authorization"] == f"Bearer {COMPLETION_TOKEN}"
    assert headers["registry-recipient-binding"] == BINDING
    assert headers["content-type"] == "application/json"
    stats = (await setup.client.get("/dev/stats")).json()
    assert stats["completions"][review_id] == {
        "attempts": 1,
        "delivered": True,
        "gaveUp": False,
        "lastStatus": 202,
    }


async def test_completion_is_retried_with_backoff_while_the_coordinator_fails(
    setup: Setup,
) -> None:
    setup.coordinator.statuses = [503, 503, 500]
    review_id = await setup.decided_review()
    await setup.stand_in.completions.drain()
    assert [body for _, body in setup.coordinator.calls] == [{"reviewId": review_id}] * 4
    assert setup.sleep.calls == [0.5, 1.0, 2.0]
    assert setup.stand_in.completions.deliveries[review_id].delivered


async def test_completion_is_retried_while_the_coordinator_is_down(setup: Setup) -> None:
    coordinator_app = setup.coordinator.app
    setup.router.remove(COORDINATOR_URL)
    failures = 0

    async def sleep_then_restore(seconds: float) -> None:
        # The coordinator comes back after the third failed connection.
        nonlocal failures
        failures += 1
        if failures == 3:
            setup.router.add(COORDINATOR_URL, coordinator_app)

    setup.stand_in.completions.sleep = sleep_then_restore
    review_id = await setup.decided_review()
    await setup.stand_in.completions.drain()
    delivery = setup.stand_in.completions.deliveries[review_id]
    assert delivery.attempts == 4
    assert delivery.delivered
    assert len(setup.coordinator.calls) == 1


async def test_backoff_is_capped_and_delivery_gives_up(setup: Setup) -> None:
    setup.stand_in.completions.max_attempts = 9
    setup.coordinator.statuses = [503] * 20
    review_id = await setup.decided_review()
    await setup.stand_in.completions.drain()
    assert setup.sleep.calls == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    delivery = setup.stand_in.completions.deliveries[review_id]
    assert delivery.gave_up and not delivery.delivered
    assert len(setup.coordinator.calls) == 9


async def test_refused_completion_is_not_retried(setup: Setup) -> None:
    setup.coordinator.statuses = [401]
    review_id = await setup.decided_review()
    await setup.stand_in.completions.drain()
    delivery = setup.stand_in.completions.deliveries[review_id]
    assert (delivery.attempts, delivery.gave_up, delivery.last_status) == (1, True, 401)
    assert setup.sleep.calls == []


async def test_completion_events_can_be_switched_off(setup: Setup) -> None:
    answer = await setup.client.post("/dev/completions", json={"enabled": False})
    assert answer.json() == {"enabled": False}
    review_id = await setup.decided_review()
    await setup.stand_in.completions.drain()
    assert setup.coordinator.calls == []
    stats = (await setup.client.get("/dev/stats")).json()
    assert stats["completionsEnabled"] is False
    assert review_id not in stats["completions"]
    # The decision itself is still readable by the producer.
    read = await setup.client.get(
        f"{REVIEWS}/{review_id}", headers={"Authorization": f"Bearer {setup.token}"}
    )
    assert read.json()["status"] == "decided"


async def test_completion_token_stays_out_of_repr(setup: Setup) -> None:
    assert setup.stand_in.trusted_producers is not None
    assert COMPLETION_TOKEN not in repr(setup.stand_in.trusted_producers)


def test_settings_file_reads_the_destination_token_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "completion-token").write_text(COMPLETION_TOKEN + "\n")
    document = {
        "baseUrl": CASEWORK_URL,
        "issuer": ISSUER_URL,
        "allowedClients": [CLIENT],
        "completionEvents": False,
        "trustedProducers": {
            "coordinator": {
                "clientId": CLIENT,
                "completion": {
                    "url": COORDINATOR_URL + "/v1/review-completions",
                    "recipientBinding": BINDING,
                    "tokenFile": "completion-token",
                },
            }
        },
    }
    stand_in = build(document, tmp_path)
    assert stand_in.trusted_producers is not None
    destination = stand_in.trusted_producers["coordinator"].completion
    assert destination is not None
    assert destination.token == COMPLETION_TOKEN
    assert destination.recipient_binding == BINDING
    assert stand_in.completions.enabled is False
    assert stand_in.settings.allowed_clients == frozenset({CLIENT})


def test_settings_file_without_required_keys_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowedClients"):
        build({"baseUrl": CASEWORK_URL, "issuer": ISSUER_URL}, tmp_path)
