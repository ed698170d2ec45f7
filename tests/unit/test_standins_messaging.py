"""The Messaging stand-in, and through it what every stand-in shares: tokens, idempotency,
receipts, fault injection and the dev routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from devstack.issuer import DevIssuer, IssuerState
from devstack.products.common import StandInSettings
from devstack.products.faults import ConnectionDropped
from devstack.products.messaging import MessagingStandIn
from tests.helpers.devstack_kit import (
    ISSUER_URL,
    MESSAGING_URL,
    FakeClock,
    FakeSleep,
    HostRouter,
    make_issuer,
)

CLIENT = "coordinator-notices"
MESSAGES = "/v1/profiles/applicant-notices/messages"
COMMAND = {
    "template": "application-approved",
    "recipientRef": "applicant-17",
    "parameters": {"applicationId": "APP-0001"},
}


@dataclass
class Stack:
    clock: FakeClock
    sleep: FakeSleep
    issuer: DevIssuer
    router: HostRouter
    stand_in: MessagingStandIn
    client: httpx.AsyncClient

    def token(
        self,
        scope: str = "messages:send receipts:read",
        signer: IssuerState | None = None,
        **overrides: Any,
    ) -> str:
        """A token for the notices client, signed by the stack's issuer unless ``signer``."""
        fields: dict[str, Any] = {
            "client_id": CLIENT,
            "subject": CLIENT,
            "audience": MESSAGING_URL,
            "scope": scope,
            "lifetime_seconds": 300,
            "now": self.clock(),
        }
        fields.update(overrides)
        return (signer or self.issuer.state).mint(**fields)

    def headers(self, key: str | None = "key-1", token: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {token or self.token()}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    async def send(
        self, key: str = "key-1", body: Any = None, token: str | None = None
    ) -> httpx.Response:
        return await self.client.post(
            MESSAGES, json=COMMAND if body is None else body, headers=self.headers(key, token)
        )

    async def receipt(self, key: str, profile: str = "applicant-notices") -> httpx.Response:
        return await self.client.get(
            f"/v1/profiles/{profile}/receipts/{key}",
            headers={"Authorization": f"Bearer {self.token()}"},
        )

    async def fault(self, **body: Any) -> None:
        answer = await self.client.post("/dev/faults", json=body)
        assert answer.status_code == 200, answer.text

    async def processed(self) -> dict[str, int]:
        answer = await self.client.get("/dev/stats")
        stats: dict[str, int] = answer.json()["processed"]
        return stats


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    clock = FakeClock()
    sleep = FakeSleep()
    issuer = make_issuer(tmp_path / "issuer", [], clock)
    router = HostRouter({ISSUER_URL: issuer.app})
    http = httpx.AsyncClient(transport=router)
    stand_in = MessagingStandIn(
        StandInSettings(
            base_url=MESSAGING_URL, issuer=ISSUER_URL, allowed_clients=frozenset({CLIENT})
        ),
        http=http,
        clock=clock,
        sleep=sleep,
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=stand_in), base_url=MESSAGING_URL)
    try:
        yield Stack(clock, sleep, issuer, router, stand_in, client)
    finally:
        await client.aclose()
        await stand_in.aclose()
        await http.aclose()


def assert_problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = answer.json()
    assert body["code"] == code
    assert body["status"] == status
    assert body["type"].endswith("/" + code)
    return body


async def test_send_notice_is_accepted(stack: Stack) -> None:
    answer = await stack.send()
    assert answer.status_code == 202
    body = answer.json()
    assert body["messageId"].startswith("msg-")
    assert body["acceptedAt"] == "2027-01-15T08:00:00.000Z"
    assert stack.stand_in.messages[body["messageId"]]["recipientRef"] == "applicant-17"
    assert await stack.processed() == {"key-1": 1}


# -- tokens ----------------------------------------------------------------------------------


async def test_missing_token_is_refused(stack: Stack) -> None:
    answer = await stack.client.post(MESSAGES, json=COMMAND, headers={"Idempotency-Key": "k"})
    assert_problem(answer, 401, "authentication.refused")
    assert answer.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert await stack.processed() == {}


async def test_token_without_the_scope_is_forbidden(stack: Stack) -> None:
    answer = await stack.send(token=stack.token(scope="receipts:read"))
    assert_problem(answer, 403, "authorization.refused")
    assert 'error="insufficient_scope"' in answer.headers["www-authenticate"]
    assert await stack.processed() == {}


async def test_token_for_another_audience_is_refused(stack: Stack) -> None:
    answer = await stack.send(token=stack.token(audience="http://scheduling.test"))
    assert_problem(answer, 401, "authentication.refused")


async def test_audience_list_containing_the_base_url_is_accepted(stack: Stack) -> None:
    answer = await stack.send(token=stack.token(audience=["http://other.test", MESSAGING_URL]))
    assert answer.status_code == 202


async def test_expired_token_is_refused(stack: Stack) -> None:
    token = stack.token()
    stack.clock.advance(400)
    answer = await stack.send(token=token)
    assert_problem(answer, 401, "authentication.refused")


async def test_token_from_a_client_not_allowed_is_forbidden(stack: Stack) -> None:
    answer = await stack.send(token=stack.token(client_id="someone-else"))
    assert_problem(answer, 403, "authorization.refused")


async def test_token_signed_by_another_key_is_refused(stack: Stack, tmp_path: Path) -> None:
    # Same issuer URL and the same kid, but another private key: only the signature differs.
    other = IssuerState.create(tmp_path / "other", ISSUER_URL)
    forged_state = IssuerState(
        other.folder, ISSUER_URL, {**other.signing_jwk, "kid": stack.issuer.state.kid}
    )
    token = stack.token("messages:send", signer=forged_state)
    assert_problem(await stack.send(token=token), 401, "authentication.refused")


async def test_token_that_is_not_an_access_token_is_refused(stack: Stack) -> None:
    state = stack.issuer.state
    claims = jwt.decode(stack.token(), options={"verify_signature": False})
    id_token_like = jwt.encode(
        claims,
        jwt.PyJWK(dict(state.signing_jwk)).key,
        algorithm=state.alg,
        headers={"kid": state.kid, "typ": "JWT"},
    )
    assert_problem(await stack.send(token=id_token_like), 401, "authentication.refused")


async def test_token_from_another_issuer_is_refused(stack: Stack) -> None:
    state = stack.issuer.state
    impostor = IssuerState(state.folder, "http://impostor.test", state.signing_jwk)
    token = stack.token("messages:send", signer=impostor)
    assert_problem(await stack.send(token=token), 401, "authentication.refused")


async def test_unreachable_issuer_makes_the_verifier_unavailable(stack: Stack) -> None:
    stack.router.remove(ISSUER_URL)
    answer = await stack.send()
    assert_problem(answer, 503, "service.unavailable")
    assert await stack.processed() == {}


# -- request shape ---------------------------------------------------------------------------


async def test_idempotency_key_is_required(stack: Stack) -> None:
    answer = await stack.client.post(MESSAGES, json=COMMAND, headers=stack.headers(key=None))
    assert_problem(answer, 400, "request.invalid")


async def test_json_content_type_is_required(stack: Stack) -> None:
    answer = await stack.client.post(
        MESSAGES,
        content=b"template=x",
        headers={**stack.headers(), "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert_problem(answer, 415, "request.unsupported-media-type")


async def test_command_must_fit_the_catalogue(stack: Stack) -> None:
    answer = await stack.send(body={"template": "t", "recipientRef": 5, "extra": True})
    body = assert_problem(answer, 422, "command.invalid")
    pointers = {e["pointer"] for e in body["errors"]}
    assert pointers == {"/parameters", "/recipientRef", "/extra"}
    assert await stack.processed() == {}


async def test_unknown_route_and_wrong_method_are_problems(stack: Stack) -> None:
    assert_problem(await stack.client.get("/v1/nothing"), 404, "not-found")
    assert_problem(await stack.client.get(MESSAGES), 405, "method-not-allowed")


# -- idempotency -----------------------------------------------------------------------------


async def test_repeated_key_replays_the_original_answer(stack: Stack) -> None:
    first = await stack.send()
    stack.clock.advance(60)
    again = await stack.send()
    assert again.status_code == first.status_code == 202
    assert again.json() == first.json()
    assert await stack.processed() == {"key-1": 1}
    stats = (await stack.client.get("/dev/stats")).json()
    assert stats["received"] == {"key-1": 2}


async def test_equal_json_in_another_member_order_is_the_same_request(stack: Stack) -> None:
    first = await stack.send()
    reordered = dict(reversed(list(COMMAND.items())))
    again = await stack.send(body=reordered)
    assert again.json() == first.json()


async def test_repeated_key_with_another_body_is_a_conflict(stack: Stack) -> None:
    await stack.send()
    answer = await stack.send(body={**COMMAND, "recipientRef": "applicant-18"})
    body = assert_problem(answer, 409, "idempotency.conflict")
    assert "applicant-18" not in answer.text and "key-1" not in body["detail"]
    assert await stack.processed() == {"key-1": 1}


async def test_key_past_the_idempotency_window_is_processed_anew(stack: Stack) -> None:
    first = await stack.send()
    stack.clock.advance(8 * 86_400)
    again = await stack.send()
    assert again.json()["messageId"] != first.json()["messageId"]
    assert await stack.processed() == {"key-1": 2}


# -- receipts --------------------------------------------------------------------------------


async def test_receipt_of_a_processed_key(stack: Stack) -> None:
    sent = await stack.send()
    answer = await stack.receipt("key-1")
    assert answer.status_code == 200
    assert answer.json() == sent.json()


async def test_receipt_of_an_unknown_key_or_profile_is_not_found(stack: Stack) -> None:
    await stack.send()
    assert_problem(await stack.receipt("never-sent"), 404, "receipt.not-found")
    assert_problem(await stack.receipt("key-1", profile="other-profile"), 404, "receipt.not-found")


async def test_receipt_older_than_the_window_has_expired(stack: Stack) -> None:
    await stack.send()
    stack.clock.advance(7 * 86_400 - 1)
    assert (await stack.receipt("key-1")).status_code == 200
    stack.clock.advance(2)
    assert_problem(await stack.receipt("key-1"), 410, "receipt.expired")


async def test_dev_clock_moves_the_receipt_window(stack: Stack) -> None:
    await stack.send()
    answer = await stack.client.post("/dev/clock", json={"advanceSeconds": 8 * 86_400})
    assert answer.json()["now"] == "2027-01-23T08:00:00.000Z"
    assert_problem(await stack.receipt("key-1"), 410, "receipt.expired")


async def test_receipts_need_their_own_scope(stack: Stack) -> None:
    await stack.send()
    answer = await stack.client.get(
        "/v1/profiles/applicant-notices/receipts/key-1",
        headers={"Authorization": f"Bearer {stack.token(scope='messages:send')}"},
    )
    assert_problem(answer, 403, "authorization.refused")


# -- faults ----------------------------------------------------------------------------------


async def test_delay_waits_then_answers(stack: Stack) -> None:
    await stack.fault(mode="delay", seconds=2.5, count=1)
    answer = await stack.send()
    assert answer.status_code == 202
    assert stack.sleep.calls == [2.5]


async def test_fail_before_processing_is_retryable_unavailable(stack: Stack) -> None:
    await stack.fault(mode="fail-before", count=1)
    assert_problem(await stack.send(), 503, "service.unavailable")
    assert await stack.processed() == {}
    answer = await stack.send()
    assert answer.status_code == 202
    assert await stack.processed() == {"key-1": 1}


async def test_fail_after_processing_keeps_the_effect(stack: Stack) -> None:
    await stack.fault(mode="fail-after", count=1)
    assert_problem(await stack.send(), 500, "internal-error")
    assert await stack.processed() == {"key-1": 1}
    receipt = await stack.receipt("key-1")
    resent = await stack.send()
    assert resent.status_code == 202
    assert resent.json() == receipt.json()
    assert await stack.processed() == {"key-1": 1}


async def test_hang_after_processing_answers_only_when_released(stack: Stack) -> None:
    await stack.fault(mode="hang-after")
    pending = asyncio.ensure_future(stack.send())
    await stack.stand_in.faults.wait_hanging(1)
    assert not pending.done()
    assert await stack.processed() == {"key-1": 1}
    released = await stack.client.post("/dev/faults/release")
    assert released.json() == {"released": 1}
    answer = await pending
    assert answer.status_code == 202


async def test_clearing_faults_releases_held_requests(stack: Stack) -> None:
    await stack.fault(mode="hang-after")
    pending = asyncio.ensure_future(stack.send())
    await stack.stand_in.faults.wait_hanging(1)
    cleared = await stack.client.delete("/dev/faults")
    assert cleared.json() == {"fault": None}
    assert (await pending).status_code == 202
    assert (await stack.send(key="key-2")).status_code == 202


async def test_drop_after_processing_in_process(stack: Stack) -> None:
    # In-process there is no socket; the stand-in raises instead, so the client gets no
    # answer at all, not a 500 (a real server drops the connection: test_standins_server.py).
    await stack.fault(mode="drop-after", count=1)
    with pytest.raises(ConnectionDropped):
        await stack.send()
    assert await stack.processed() == {"key-1": 1}
    # The record was kept: the receipt and a repeat of the key answer from it.
    receipt = await stack.receipt("key-1")
    assert receipt.status_code == 200
    resent = await stack.send()
    assert (resent.status_code, resent.json()) == (202, receipt.json())
    assert await stack.processed() == {"key-1": 1}


async def test_drop_before_processing_in_process(stack: Stack) -> None:
    await stack.fault(mode="drop-before", count=1)
    with pytest.raises(ConnectionDropped):
        await stack.send()
    assert await stack.processed() == {}
    assert_problem(await stack.receipt("key-1"), 404, "receipt.not-found")


async def test_fault_count_limits_how_often_it_applies(stack: Stack) -> None:
    await stack.fault(mode="fail-before", count=2)
    assert (await stack.send()).status_code == 503
    assert (await stack.send()).status_code == 503
    assert (await stack.send()).status_code == 202
    assert (await stack.client.get("/dev/faults")).json() == {"fault": None}


async def test_faults_can_target_reads(stack: Stack) -> None:
    await stack.send()
    await stack.fault(mode="fail-before", target="reads", count=1)
    assert (await stack.send(key="key-2")).status_code == 202
    assert_problem(await stack.receipt("key-1"), 503, "service.unavailable")
    assert (await stack.receipt("key-1")).status_code == 200


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"mode": "explode"}, "/mode"),
        ({"mode": "delay", "seconds": -1}, "/seconds"),
        ({"mode": "delay", "count": 0}, "/count"),
        ({"mode": "delay", "target": "writes"}, "/target"),
        ({"mode": "delay", "colour": "red"}, "/colour"),
    ],
)
async def test_invalid_fault_is_refused(stack: Stack, body: dict[str, Any], pointer: str) -> None:
    answer = await stack.client.post("/dev/faults", json=body)
    problem = assert_problem(answer, 400, "request.invalid")
    assert problem["detail"].startswith(pointer)
    assert stack.stand_in.faults.active is None
