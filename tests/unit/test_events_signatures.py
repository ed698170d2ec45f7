"""The producer routes' credentials, without a database: event signatures (CONTRACT §9.6)
and completion credentials (§9.5)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from core.errors import CoordinatorError
from core.runs import StartResult
from gateway.app import create_app
from gateway.auth import StaticJwksSource, TokenVerifier
from gateway.backend import AuditRecord
from gateway.completions import CompletionCredential, CompletionHandler, match, presented
from gateway.events import (
    TOLERANCE_SECONDS,
    EventHandler,
    EventSourceKey,
    authenticate,
    event_of,
    fresh,
    parse_signature,
    sign,
    signature_valid,
)
from gateway.routes import GatewayContext

KEY = bytes(range(32))
SOURCE = EventSourceKey(name="intake", source="urn:intake", key=KEY)
NOW = 1_800_000_000


def body(**changes: Any) -> bytes:
    document = {"specversion": "1.0", "id": "e-1", "source": "urn:intake", "type": "t", "data": {}}
    document.update(changes)
    return json.dumps(document).encode()


# ------------------------------------------------------------------------- signatures


def test_a_signature_is_the_hmac_of_t_dot_body() -> None:
    content = body()
    header = sign(KEY, content, NOW)
    expected = hmac.new(KEY, f"{NOW}.".encode() + content, hashlib.sha256).hexdigest()
    assert header == f"t={NOW},v1={expected}"
    parsed = parse_signature(header)
    assert parsed is not None and signature_valid(KEY, parsed, content)
    assert not signature_valid(KEY, parsed, content + b" ")
    assert not signature_valid(bytes(32), parsed, content)


def test_any_of_several_v1_values_may_match_and_unknown_schemes_are_ignored() -> None:
    content = body()
    good = sign(KEY, content, NOW).split(",")[1]
    parsed = parse_signature(f"t={NOW}, v0=whatever, v1={'0' * 64}, {good}")
    assert parsed is not None and len(parsed.macs) == 2
    assert signature_valid(KEY, parsed, content)


@pytest.mark.parametrize(
    "header",
    [
        "",
        "v1=" + "a" * 64,
        f"t={NOW}",
        f"t={NOW},v1=" + "A" * 64,
        f"t={NOW},v1=" + "a" * 63,
        f"t=-5,v1={'a' * 64}",
        f"t={NOW},t={NOW},v1={'a' * 64}",
        f"t={NOW};v1={'a' * 64}",
    ],
)
def test_malformed_signature_headers_are_not_signatures(header: str) -> None:
    assert parse_signature(header) is None


def test_t_must_lie_within_300_seconds_either_way() -> None:
    def at(t: int) -> Any:
        parsed = parse_signature(f"t={t},v1={'a' * 64}")
        assert parsed is not None
        return parsed

    assert fresh(at(NOW - TOLERANCE_SECONDS), NOW)
    assert fresh(at(NOW + TOLERANCE_SECONDS), NOW)
    assert not fresh(at(NOW - TOLERANCE_SECONDS - 1), NOW)
    assert not fresh(at(NOW + TOLERANCE_SECONDS + 1), NOW)


def test_authenticate_answers_the_source_and_refuses_alike() -> None:
    content = body()
    source, document = authenticate([SOURCE], [sign(KEY, content, NOW)], content, NOW)
    assert source == SOURCE and document["id"] == "e-1"
    refusals = [
        ([], content),  # no header
        ([sign(KEY, content, NOW), sign(KEY, content, NOW)], content),  # repeated header
        ([sign(KEY, content, NOW - 400)], content),
        ([sign(KEY, body(source="urn:other"), NOW)], body(source="urn:other")),
        ([sign(KEY, b"[1]", NOW)], b"[1]"),
    ]
    for headers, sent in refusals:
        with pytest.raises(CoordinatorError) as refused:
            authenticate([SOURCE], headers, sent, NOW)
        assert (refused.value.code, refused.value.detail) == (
            "authentication.refused",
            "the event is not accepted",
        )


def test_the_event_members_are_checked_after_authentication() -> None:
    assert event_of(json.loads(body(data={"a": 1}))).data_json == '{"a":1}'
    for changes in ({"specversion": "0.3"}, {"id": ""}, {"type": 5}, {"time": 7}):
        with pytest.raises(CoordinatorError) as invalid:
            event_of(json.loads(body(**changes)))
        assert invalid.value.code == "request.invalid"
    without_data = json.loads(body())
    del without_data["data"]
    with pytest.raises(CoordinatorError):
        event_of(without_data)


# ----------------------------------------------------------------- completion credentials

CREDENTIALS = (
    CompletionCredential("review", b"coordinator-v1", b"token-review"),
    CompletionCredential("escalation", b"coordinator-esc", b"token-esc"),
)


def test_a_completion_matches_only_both_credentials_of_one_connection() -> None:
    assert match(CREDENTIALS, b"token-review", b"coordinator-v1") == "review"
    assert match(CREDENTIALS, b"token-esc", b"coordinator-esc") == "escalation"
    assert match(CREDENTIALS, b"token-review", b"coordinator-esc") is None
    assert match(CREDENTIALS, b"token-esc", b"coordinator-v1") is None
    assert match(CREDENTIALS, b"token-revie", b"coordinator-v1") is None
    assert match((), b"token-review", b"coordinator-v1") is None


def _request(headers: list[tuple[bytes, bytes]]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


def test_presented_needs_exactly_one_bearer_and_one_binding() -> None:
    binding = (b"registry-recipient-binding", b"coordinator-v1")
    assert presented(_request([(b"authorization", b"Bearer abc"), binding])) == (
        b"abc",
        b"coordinator-v1",
    )
    assert presented(_request([(b"authorization", b"bearer abc"), binding])) is not None
    assert presented(_request([binding])) is None
    assert presented(_request([(b"authorization", b"Bearer abc")])) is None
    assert presented(_request([(b"authorization", b"Basic abc"), binding])) is None
    assert presented(_request([(b"authorization", b"Bearer "), binding])) is None
    assert presented(_request([(b"authorization", b"Bearer a"), binding, binding])) is None


# ------------------------------------------------------------------ recovery-only instances


class Audits:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    async def append_audit(self, records: Sequence[AuditRecord]) -> None:
        self.records.extend(records)


def _context(**hooks: Any) -> GatewayContext:
    verifier = TokenVerifier(
        issuer="https://issuer.example.org",
        audience="https://coordinator.example.org",
        algorithms=("ES256",),
        clock_skew_seconds=60,
        source=StaticJwksSource({"keys": []}),
    )
    return GatewayContext(Audits(), verifier, {}, **hooks)  # type: ignore[arg-type]


async def test_a_recovery_only_instance_authenticates_then_refuses_to_admit() -> None:
    started: list[str] = []
    woken: list[str] = []

    async def start(source: str, event_id: str, data: str) -> StartResult:
        started.append(event_id)
        raise AssertionError("a recovery-only instance starts nothing")

    async def wake(connection: str, review_id: str) -> None:
        woken.append(review_id)

    ctx = _context(
        events=EventHandler([SOURCE], start, recovery_only=True, now=lambda: NOW),
        completions=CompletionHandler(CREDENTIALS, wake, recovery_only=True),
    )
    content = body()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(ctx)), base_url="http://gw"
    ) as client:
        forged = await client.post(
            "/v1/events",
            content=content,
            headers={"registry-event-signature": "t=1,v1=" + "0" * 64},
        )
        signed = await client.post(
            "/v1/events",
            content=content,
            headers={"registry-event-signature": sign(KEY, content, NOW)},
        )
        completion = await client.post(
            "/v1/review-completions",
            json={"reviewId": "r-1"},
            headers={
                "Authorization": "Bearer token-review",
                "registry-recipient-binding": "coordinator-v1",
            },
        )

    assert (forged.status_code, forged.json()["code"]) == (401, "authentication.refused")
    assert (signed.status_code, signed.json()["code"]) == (409, "admission.recovery-only")
    # Casework retries a 503, so the event reaches the ordinary instance once it is back.
    assert (completion.status_code, completion.json()["code"]) == (503, "service.unavailable")
    assert started == [] and woken == []
    audits = ctx.backend.records  # type: ignore[attr-defined]
    # Both producers authenticated, so both refusals are audited actions (CONTRACT §12).
    assert [(r.action, r.outcome, r.principal) for r in audits] == [
        ("event-start", "conflict", ("event-source", "urn:intake")),
        ("review-completion", "unavailable", None),
    ]
