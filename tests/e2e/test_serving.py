"""The serving core end to end: real processes, real gRPC, TLS PostgreSQL, honest stand-ins."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from core.audit.verify import verify_file
from core.db.connect import connect
from devstack.stack import wait_until
from tests.e2e.conftest import Running

BOOKING = "appointment-booking"


def start(
    running: Running,
    document: dict[str, Any],
    *,
    key: str | None = None,
    token: str | None = None,
    workflow: str = BOOKING,
) -> httpx.Response:
    headers = running.auth(token or running.producer_token)
    headers["Idempotency-Key"] = key or f"e2e-{uuid.uuid4()}"
    return httpx.post(
        f"{running.stack.url}/v1/workflows/{workflow}/runs",
        json={"input": document},
        headers=headers,
        timeout=10.0,
    )


def status(running: Running, run_id: str, token: str | None = None) -> dict[str, Any]:
    answer = httpx.get(
        f"{running.stack.url}/v1/runs/{run_id}",
        headers=running.auth(token or running.producer_token),
        timeout=10.0,
    )
    document: dict[str, Any] = answer.json()
    return document


def inspection(running: Running, run_id: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{running.stack.url}/v1/runs/{run_id}/inspection",
        headers=running.auth(running.operator_token),
        timeout=10.0,
    )
    assert answer.status_code == 200
    document: dict[str, Any] = answer.json()
    return document


def wait_for_state(running: Running, run_id: str, *states: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def reached() -> bool:
        nonlocal found
        found = status(running, run_id)
        return found.get("state") in states

    wait_until(reached, f"run {run_id} in {states}", timeout=30.0)
    return found


def stand_in_stats(running: Running, kind: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(
        running.stack.product_urls[kind] + "/dev/stats", timeout=5.0
    ).json()
    return stats


def booking_input(slot: str, **extra: Any) -> dict[str, Any]:
    return {"slotRef": slot, "subjectRef": "APP-1", "recipientRef": "person-1", **extra}


def test_a_call_workflow_runs_to_its_outcome_and_each_command_is_processed_once(
    running_stack: Running,
) -> None:
    answer = start(running_stack, booking_input("slot-a"))
    assert answer.status_code == 201
    run_id = answer.json()["runId"]
    final = wait_for_state(running_stack, run_id, "succeeded", "failed", "held")
    assert final["state"] == "succeeded"
    assert final["outcome"] == "booked"
    steps = inspection(running_stack, run_id)["steps"]
    assert [(s["step"], s["state"]) for s in steps] == [
        ("book", "completed"),
        ("confirm", "completed"),
        ("reminder-wanted", "completed"),
        ("booked", "completed"),
    ]
    assert [s.get("effect") for s in steps] == ["accepted", "accepted", None, None]
    for kind in ("scheduling", "messaging"):
        processed = stand_in_stats(running_stack, kind)["processed"]
        assert processed and max(processed.values()) == 1


def test_choose_follows_the_predicate_and_wait_until_wakes_when_time_moves(
    running_stack: Running,
) -> None:
    now = datetime.fromisoformat(running_stack.clock_file.read_text().strip())
    reminder = now + timedelta(days=3)
    answer = start(
        running_stack,
        booking_input("slot-b", reminderAt=reminder.isoformat().replace("+00:00", "Z")),
    )
    run_id = answer.json()["runId"]
    waiting = wait_for_state(running_stack, run_id, "waiting", "succeeded", "failed")
    assert waiting["state"] == "waiting"
    steps = inspection(running_stack, run_id)["steps"]
    assert steps[-1]["step"] == "wait-for-reminder"
    assert datetime.fromisoformat(steps[-1]["wait"]["dueAt"]) == reminder
    running_stack.move_clock(reminder + timedelta(seconds=1))
    final = wait_for_state(running_stack, run_id, "succeeded", "failed", "held")
    assert final["state"] == "succeeded"
    taken = [s["step"] for s in inspection(running_stack, run_id)["steps"]]
    assert taken == ["book", "confirm", "reminder-wanted", "wait-for-reminder", "remind", "booked"]


def test_start_is_idempotent_per_key_and_input(running_stack: Running) -> None:
    key = f"e2e-idem-{uuid.uuid4()}"
    first = start(running_stack, booking_input("slot-c"), key=key)
    again = start(running_stack, booking_input("slot-c"), key=key)
    other = start(running_stack, booking_input("slot-other"), key=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["runId"] == again.json()["runId"]
    assert other.status_code == 409
    assert other.headers["content-type"].startswith("application/problem+json")
    assert other.json()["code"] == "start.conflict"
    assert "slot-other" not in other.text


def test_invalid_input_is_refused_with_pointers_and_no_values(running_stack: Running) -> None:
    answer = start(running_stack, {"slotRef": "", "subjectRef": "APP-1", "secretThing": "x9z"})
    assert answer.status_code == 422
    problem = answer.json()
    assert problem["code"] == "input.invalid"
    pointers = {error["pointer"] for error in problem["errors"]}
    assert "/slotRef" in pointers
    assert "x9z" not in answer.text


def test_authentication_and_ownership_on_the_real_stack(running_stack: Running) -> None:
    url = running_stack.stack.url
    missing = httpx.get(f"{url}/v1/runs", timeout=5.0)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    forged = running_stack.producer_token[:-4] + "AAAA"
    refused = httpx.get(f"{url}/v1/runs", headers=running_stack.auth(forged), timeout=5.0)
    assert refused.status_code == 401
    assert forged not in refused.text
    run_id = start(running_stack, booking_input("slot-d")).json()["runId"]
    assert status(running_stack, run_id, running_stack.other_producer_token)["code"] == (
        "run.not-found"
    )
    assert status(running_stack, run_id, running_stack.operator_token)["runId"] == run_id
    # listing is the inspect action, which the producers' policy does not grant
    listing = httpx.get(
        f"{url}/v1/runs", headers=running_stack.auth(running_stack.producer_token), timeout=5.0
    )
    assert listing.status_code == 403
    assert listing.json()["code"] == "authorization.refused"


def test_stored_payloads_are_ciphertext(running_stack: Running) -> None:
    marker = f"person-{uuid.uuid4().hex}"
    run_id = start(running_stack, {**booking_input("slot-e"), "recipientRef": marker}).json()[
        "runId"
    ]
    wait_for_state(running_stack, run_id, "succeeded", "failed", "held")

    async def every_row_as_text() -> list[str]:
        conn = await connect(running_stack.database.migration_url, running_stack.database.ca_pem)
        try:
            namespace = running_stack.stack.summary["namespace"]
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                namespace,
            )
            texts: list[str] = []
            for row in tables:
                rows = await conn.fetch(
                    f'SELECT t::text AS line FROM "{namespace}"."{row["table_name"]}" t'
                )
                texts.extend(str(r["line"]) for r in rows)
            return texts
        finally:
            await conn.close()

    rows = asyncio.run(every_row_as_text())
    assert any(run_id in line for line in rows)  # the search does see the run's rows
    assert not any(marker in line for line in rows)
    assert not any(marker.encode().hex() in line for line in rows)


def test_the_audit_journal_chain_verifies_and_an_edit_breaks_it(
    running_stack: Running, tmp_path: Any
) -> None:
    start(running_stack, booking_input("slot-f"))
    journal = running_stack.stack.root / "deployment" / "audit.jsonl"
    result = verify_file(journal)
    assert result.line is None and result.records >= 2
    lines = journal.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[1])
    assert set(record) >= {"seq", "at", "action", "outcome", "principalRef", "clientRef", "prev"}
    assert "alice" not in journal.read_text()
    tampered = tmp_path / "audit.jsonl"
    # The first record changed: the second (there are at least two) no longer vouches for it.
    lines[0] = lines[0].replace(b'"outcome":"', b'"outcome":"x', 1)
    tampered.write_bytes(b"".join(lines))
    assert verify_file(tampered).line == 2


def test_metrics_live_on_the_metrics_listener_only(running_stack: Running) -> None:
    main = httpx.get(running_stack.stack.url + "/metrics", timeout=5.0)
    assert main.status_code == 404
    assert main.json()["code"] == "not-found"
    text = httpx.get(running_stack.stack.metrics_url + "/metrics", timeout=5.0).text
    for series in (
        "coordinator_dispatch_jobs ",
        'coordinator_runs{state="succeeded"}',
        "coordinator_uncertain_steps",
        "coordinator_retrying_steps",
        "coordinator_calls_total{",
        "coordinator_store_available",
        "coordinator_audit_ready",
        "coordinator_http_requests_total{",
        "coordinator_admission_to_dispatch_seconds",
    ):
        assert series in text, series
    assert "workflow=" not in text and "run" + "_id" not in text and "principal" not in text


@pytest.mark.parametrize("path", ["/ready"])
def test_ready_answers_true(running_stack: Running, path: str) -> None:
    answer = httpx.get(running_stack.stack.url + path, timeout=5.0)
    assert answer.status_code == 200
    assert answer.json() == {"ready": True}


def test_the_coordinators_connections_are_tls_and_within_budget(
    running_stack: Running, postgres_server: Any
) -> None:
    if not hasattr(postgres_server, "superuser_connect"):
        pytest.fail("this check needs the harness's own server (superuser)")

    async def ssl_rows() -> list[asyncpg.Record]:
        conn = await postgres_server.superuser_connect()
        try:
            return list(
                await conn.fetch(
                    "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
                    " WHERE a.usename = 'coordinator_runtime' AND a.datname = $1",
                    running_stack.database.database,
                )
            )
        finally:
            await conn.close()

    rows = asyncio.run(ssl_rows())
    assert rows and all(row["ssl"] for row in rows)
    assert len(rows) <= 32
