"""The Scheduling, BReg and Casework stand-ins: their routes, scopes and records."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.issuer import DevIssuer
from devstack.products.breg import BregStandIn
from devstack.products.casework import CaseworkStandIn, TrustedProducer
from devstack.products.common import StandIn, StandInSettings
from devstack.products.scheduling import SchedulingStandIn
from tests.helpers.devstack_kit import (
    BREG_URL,
    CASEWORK_URL,
    ISSUER_URL,
    SCHEDULING_URL,
    FakeClock,
    HostRouter,
    make_issuer,
)

CLIENT = "coordinator"


class Harness:
    """One stand-in behind an in-process client, and tokens for it."""

    def __init__(self, clock: FakeClock, issuer: DevIssuer, stand_in: StandIn, base_url: str):
        self.clock = clock
        self.issuer = issuer
        self.stand_in = stand_in
        self.base_url = base_url
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=stand_in), base_url=base_url
        )

    def token(self, scope: str, client_id: str = CLIENT) -> str:
        return self.issuer.state.mint(
            client_id=client_id,
            subject=client_id,
            audience=self.base_url,
            scope=scope,
            now=self.clock(),
        )

    async def post(
        self, path: str, body: Any, scope: str, key: str = "key-1", client_id: str = CLIENT
    ) -> httpx.Response:
        headers = {
            "Authorization": f"Bearer {self.token(scope, client_id)}",
            "Idempotency-Key": key,
        }
        return await self.client.post(path, json=body, headers=headers)

    async def get(self, path: str, scope: str) -> httpx.Response:
        return await self.client.get(path, headers={"Authorization": f"Bearer {self.token(scope)}"})

    async def processed(self) -> dict[str, int]:
        stats: dict[str, int] = (await self.client.get("/dev/stats")).json()["processed"]
        return stats


Factory = Callable[..., StandIn]


@pytest.fixture
async def build(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    clock = FakeClock()
    issuer = make_issuer(tmp_path / "issuer", [], clock)
    http = httpx.AsyncClient(transport=HostRouter({ISSUER_URL: issuer.app}))
    harnesses: list[Harness] = []

    def make(kind: Factory, base_url: str, **options: Any) -> Harness:
        settings = StandInSettings(
            base_url=base_url, issuer=ISSUER_URL, allowed_clients=frozenset({CLIENT, "other"})
        )
        harness = Harness(
            clock, issuer, kind(settings, http=http, clock=clock, **options), base_url
        )
        harnesses.append(harness)
        return harness

    yield make
    for harness in harnesses:
        await harness.client.aclose()
        await harness.stand_in.aclose()
    await http.aclose()


def code_of(answer: httpx.Response) -> str:
    assert answer.headers["content-type"] == "application/problem+json"
    code: str = answer.json()["code"]
    return code


# -- Scheduling ------------------------------------------------------------------------------

BOOKINGS = "/v1/profiles/clinic-a/bookings"
SLOT = {"slotRef": "slot-2027-02-01T09:00", "subjectRef": "patient-3"}


async def test_book_slot_and_its_receipt(build: Callable[..., Harness]) -> None:
    h = build(SchedulingStandIn, SCHEDULING_URL)
    booked = await h.post(BOOKINGS, SLOT, "bookings:write")
    assert booked.status_code == 201
    booking_id = booked.json()["bookingId"]
    assert booking_id.startswith("bkg-")
    receipt = await h.get("/v1/profiles/clinic-a/receipts/key-1", "receipts:read")
    assert receipt.status_code == 200
    assert receipt.json() == {"bookingId": booking_id, "acceptedAt": "2027-01-15T08:00:00.000Z"}
    assert (await h.post(BOOKINGS, SLOT, "bookings:write")).json() == booked.json()
    assert await h.processed() == {"key-1": 1}


async def test_booking_a_taken_slot_under_a_new_key_is_refused(
    build: Callable[..., Harness],
) -> None:
    h = build(SchedulingStandIn, SCHEDULING_URL)
    await h.post(BOOKINGS, SLOT, "bookings:write")
    again = await h.post(BOOKINGS, {**SLOT, "subjectRef": "patient-4"}, "bookings:write", key="k2")
    assert again.status_code == 409
    assert code_of(again) == "slot.taken"
    assert await h.processed() == {"key-1": 1}


async def test_booking_needs_the_booking_scope(build: Callable[..., Harness]) -> None:
    h = build(SchedulingStandIn, SCHEDULING_URL)
    answer = await h.post(BOOKINGS, SLOT, "receipts:read")
    assert answer.status_code == 403
    assert code_of(answer) == "authorization.refused"


async def test_scheduling_receipts_expire_after_seven_days(build: Callable[..., Harness]) -> None:
    h = build(SchedulingStandIn, SCHEDULING_URL)
    await h.post(BOOKINGS, SLOT, "bookings:write")
    h.clock.advance(7 * 86_400 + 1)
    answer = await h.get("/v1/profiles/clinic-a/receipts/key-1", "receipts:read")
    assert answer.status_code == 410
    assert code_of(answer) == "receipt.expired"


# -- BReg ------------------------------------------------------------------------------------

ACTIONS = "/v1/registers/vehicles/actions"
PROPOSALS = "/v1/registers/vehicles/proposals"
ACTION = {"actionType": "transfer", "subjectRef": "vehicle-9", "payload": {"to": "owner-2"}}
PROPOSAL = {"subjectRef": "vehicle-9", "changes": {"colour": "blue"}}


async def test_submit_action_and_create_proposal(build: Callable[..., Harness]) -> None:
    h = build(BregStandIn, BREG_URL)
    action = await h.post(ACTIONS, ACTION, "actions:write", key="a-1")
    proposal = await h.post(PROPOSALS, PROPOSAL, "proposals:write", key="p-1")
    assert action.status_code == proposal.status_code == 201
    assert action.json()["actionId"].startswith("act-")
    assert proposal.json()["proposalId"].startswith("prop-")
    stand_in = h.stand_in
    assert isinstance(stand_in, BregStandIn)
    assert stand_in.proposals[proposal.json()["proposalId"]]["state"] == "open"
    assert await h.processed() == {"a-1": 1, "p-1": 1}


async def test_breg_scopes_are_separate(build: Callable[..., Harness]) -> None:
    h = build(BregStandIn, BREG_URL)
    answer = await h.post(PROPOSALS, PROPOSAL, "actions:write")
    assert answer.status_code == 403


async def test_breg_keeps_no_receipts(build: Callable[..., Harness]) -> None:
    h = build(BregStandIn, BREG_URL)
    await h.post(ACTIONS, ACTION, "actions:write")
    answer = await h.get("/v1/registers/vehicles/receipts/key-1", "actions:write")
    assert answer.status_code == 404
    assert code_of(answer) == "not-found"


async def test_breg_key_reused_across_operations_is_a_conflict(
    build: Callable[..., Harness],
) -> None:
    h = build(BregStandIn, BREG_URL)
    await h.post(ACTIONS, ACTION, "actions:write", key="same")
    answer = await h.post(PROPOSALS, PROPOSAL, "proposals:write", key="same")
    assert answer.status_code == 409
    assert code_of(answer) == "idempotency.conflict"


async def test_breg_honours_repeated_keys_for_a_day(build: Callable[..., Harness]) -> None:
    h = build(BregStandIn, BREG_URL)
    first = await h.post(ACTIONS, ACTION, "actions:write")
    h.clock.advance(86_400 - 1)
    assert (await h.post(ACTIONS, ACTION, "actions:write")).json() == first.json()
    h.clock.advance(2)
    assert (await h.post(ACTIONS, ACTION, "actions:write")).json() != first.json()
    assert await h.processed() == {"key-1": 2}


# -- Casework --------------------------------------------------------------------------------

REVIEWS = "/v1/projects/licensing-reviews/review-requests"
REVIEW = {"producer": "coordinator", "subjectRef": "APP-0001", "summary": "Application APP-0001"}


async def test_review_request_pending_then_decided(build: Callable[..., Harness]) -> None:
    h = build(CaseworkStandIn, CASEWORK_URL)
    created = await h.post(REVIEWS, REVIEW, "review-requests:write")
    assert created.status_code == 201
    review_id = created.json()["reviewId"]
    pending = await h.get(f"{REVIEWS}/{review_id}", "review-requests:read")
    assert pending.json() == {"status": "pending"}

    listed = await h.client.get("/dev/projects/licensing-reviews/review-requests")
    assert [r["reviewId"] for r in listed.json()["reviews"]] == [review_id]
    assert listed.json()["reviews"][0]["subjectRef"] == "APP-0001"

    h.clock.advance(3600)
    decided = await h.client.post(
        f"/dev/projects/licensing-reviews/review-requests/{review_id}/decision",
        json={"outcome": "approved"},
    )
    assert decided.status_code == 200
    answer = await h.get(f"{REVIEWS}/{review_id}", "review-requests:read")
    assert answer.json() == {
        "status": "decided",
        "decision": {"outcome": "approved", "decidedAt": "2027-01-15T09:00:00.000Z"},
    }


async def test_review_read_needs_the_read_scope(build: Callable[..., Harness]) -> None:
    h = build(CaseworkStandIn, CASEWORK_URL)
    review_id = (await h.post(REVIEWS, REVIEW, "review-requests:write")).json()["reviewId"]
    answer = await h.get(f"{REVIEWS}/{review_id}", "review-requests:write")
    assert answer.status_code == 403


async def test_unknown_review_or_other_project_is_not_found(build: Callable[..., Harness]) -> None:
    h = build(CaseworkStandIn, CASEWORK_URL)
    review_id = (await h.post(REVIEWS, REVIEW, "review-requests:write")).json()["reviewId"]
    unknown = await h.get(f"{REVIEWS}/rev-unknown", "review-requests:read")
    elsewhere = await h.get(
        f"/v1/projects/other-project/review-requests/{review_id}", "review-requests:read"
    )
    assert code_of(unknown) == code_of(elsewhere) == "review.not-found"
    assert unknown.status_code == elsewhere.status_code == 404


async def test_review_is_decided_once(build: Callable[..., Harness]) -> None:
    h = build(CaseworkStandIn, CASEWORK_URL)
    review_id = (await h.post(REVIEWS, REVIEW, "review-requests:write")).json()["reviewId"]
    route = f"/dev/projects/licensing-reviews/review-requests/{review_id}/decision"
    assert (await h.client.post(route, json={"outcome": "approved"})).status_code == 200
    again = await h.client.post(route, json={"outcome": "rejected"})
    assert again.status_code == 409
    assert code_of(again) == "review.already-decided"
    bad = await h.client.post(route, json={"outcome": "Not A Word"})
    assert bad.status_code == 400


async def test_review_request_needs_a_producer(build: Callable[..., Harness]) -> None:
    h = build(CaseworkStandIn, CASEWORK_URL)
    answer = await h.post(
        REVIEWS, {"subjectRef": "APP-0001", "summary": "s"}, "review-requests:write"
    )
    assert answer.status_code == 422
    assert [e["pointer"] for e in answer.json()["errors"]] == ["/producer"]


async def test_only_trusted_producers_may_ask(build: Callable[..., Harness]) -> None:
    h = build(
        CaseworkStandIn,
        CASEWORK_URL,
        trusted_producers={"coordinator": TrustedProducer(client_id=CLIENT)},
    )
    stranger = await h.post(REVIEWS, {**REVIEW, "producer": "stranger"}, "review-requests:write")
    wrong_client = await h.post(
        REVIEWS, REVIEW, "review-requests:write", key="k2", client_id="other"
    )
    trusted = await h.post(REVIEWS, REVIEW, "review-requests:write", key="k3")
    assert code_of(stranger) == code_of(wrong_client) == "producer.untrusted"
    assert stranger.status_code == wrong_client.status_code == 403
    assert trusted.status_code == 201
    assert await h.processed() == {"k3": 1}


def test_stand_in_command_refuses_a_bad_settings_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devstack.products import messaging

    settings = tmp_path / "messaging.json"
    settings.write_text('{"baseUrl": "http://127.0.0.1:1"}')
    assert messaging.main(["--settings", str(settings)]) == 1
    assert "allowedClients" in capsys.readouterr().err
