"""Signed events that start runs (CONTRACT §9.6), through the gateway's real route into
admission on a real database: a valid event, a redelivery, and every refusal."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.postgres import DatabaseHandle
from gateway.events import sign
from tests.helpers.pinned_clock import T0
from tests.helpers.review_kit import EVENT_SOURCE, INPUT, WORKFLOW, ReviewKit, review_kit

pytestmark = pytest.mark.postgres

NOW = int(T0.timestamp())


@pytest.fixture
async def kit(
    tmp_path: Path, database: DatabaseHandle, fake_clock: Callable[[datetime], None]
) -> AsyncIterator[ReviewKit]:
    async with review_kit(tmp_path, database) as made:
        yield made


def event(event_id: str = "evt-0001", **changes: Any) -> bytes:
    document: dict[str, Any] = {
        "specversion": "1.0",
        "id": event_id,
        "source": EVENT_SOURCE,
        "type": "org.example.application.submitted",
        "time": "2027-03-01T07:59:58Z",
        "data": dict(INPUT),
    }
    document.update(changes)
    return json.dumps(document).encode()


async def post(kit: ReviewKit, body: bytes, signature: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers["registry-event-signature"] = signature
    return await kit.coordinator.post("/v1/events", content=body, headers=headers)


async def run_count(kit: ReviewKit) -> int:
    return int(await kit.db.fetchval(f"SELECT count(*) FROM {kit.ns}.run"))


async def test_a_valid_event_starts_the_sources_workflow_once(kit: ReviewKit) -> None:
    body = event()
    first = await post(kit, body, sign(kit.event_key, body, NOW))
    # Redelivered later with a fresh signature: the same run, not a second one.
    again = await post(kit, body, sign(kit.event_key, body, NOW + 120))

    assert first.status_code == 201, first.text
    status = first.json()
    run_id = status["runId"]
    assert first.headers["location"] == f"/v1/runs/{run_id}"
    assert (status["state"], status["workflow"]["id"]) == ("running", WORKFLOW)
    assert again.status_code == 200
    assert again.json()["runId"] == run_id
    assert await run_count(kit) == 1
    run = await kit.run(run_id)
    assert (run["principal_iss"], run["principal_sub"], run["client_id"]) == (
        "event-source",
        EVENT_SOURCE,
        None,
    )
    assert await kit.payload(run_id, None, "input") == INPUT
    first_step = await kit.step(run_id, "request-review")
    assert first_step is not None and first_step["due_at"] == T0
    records = [
        (r.action, r.outcome, r.principal, r.client_id, r.run_id) for r in kit.audits.records
    ]
    principal = ("event-source", EVENT_SOURCE)
    assert records == [
        ("event-start", "ok", principal, None, run_id),
        ("event-start", "ok", principal, None, run_id),
    ]


async def test_the_same_event_id_with_other_data_is_a_conflict(kit: ReviewKit) -> None:
    body = event()
    assert (await post(kit, body, sign(kit.event_key, body, NOW))).status_code == 201
    other = event(data={**INPUT, "applicantRef": "person-18"})
    response = await post(kit, other, sign(kit.event_key, other, NOW))
    assert response.status_code == 409
    assert response.json()["code"] == "start.conflict"
    assert await run_count(kit) == 1


async def test_every_unauthenticated_event_is_401_and_starts_nothing(kit: ReviewKit) -> None:
    body = event()
    good = sign(kit.event_key, body, NOW)
    other_source = event(source="https://intake.example.org/other")
    cases: dict[str, tuple[bytes, str | None]] = {
        "no signature": (body, None),
        "malformed signature": (body, "t=now,v1=abc"),
        "signature of another body": (body, sign(kit.event_key, event("evt-9"), NOW)),
        "another key": (body, sign(b"k" * 32, body, NOW)),
        "stale t": (body, sign(kit.event_key, body, NOW - 301)),
        "t from the future": (body, sign(kit.event_key, body, NOW + 301)),
        "unknown source": (other_source, sign(kit.event_key, other_source, NOW)),
        "body not JSON": (b"{not json", sign(kit.event_key, b"{not json", NOW)),
        "t changed after signing": (body, good.replace(f"t={NOW}", f"t={NOW + 1}")),
    }
    for case, (content, signature) in cases.items():
        response = await post(kit, content, signature)
        assert response.status_code == 401, case
        assert response.json()["code"] == "authentication.refused", case

    assert kit.starter.calls == 0
    assert kit.audits.records == []
    assert await run_count(kit) == 0


async def test_an_authenticated_event_is_judged_like_a_start(kit: ReviewKit) -> None:
    invalid = event("evt-2", data={"applicationId": "lower case", "applicantRef": "p"})
    malformed = event("evt-3", specversion="0.3")
    no_data = json.dumps(
        {"specversion": "1.0", "id": "evt-4", "source": EVENT_SOURCE, "type": "t"}
    ).encode()

    unfit = await post(kit, invalid, sign(kit.event_key, invalid, NOW))
    old_spec = await post(kit, malformed, sign(kit.event_key, malformed, NOW))
    missing = await post(kit, no_data, sign(kit.event_key, no_data, NOW))

    assert unfit.status_code == 422
    problem = unfit.json()
    assert problem["code"] == "input.invalid"
    assert [e["pointer"] for e in problem["errors"]] == ["/applicationId"]
    assert "lower case" not in unfit.text
    assert (old_spec.status_code, old_spec.json()["code"]) == (400, "request.invalid")
    assert (missing.status_code, missing.json()["code"]) == (400, "request.invalid")
    assert await run_count(kit) == 0
    assert [(r.action, r.outcome, r.client_id) for r in kit.audits.records] == [
        ("event-start", "invalid", None),
        ("event-start", "invalid", None),
        ("event-start", "invalid", None),
    ]
