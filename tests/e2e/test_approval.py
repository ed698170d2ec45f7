"""approval-notice end to end through real processes (CONTRACT §9.5, §9.6): PostgreSQL with
TLS, the issuer, the Casework and Messaging stand-ins and all five coordinator components.

Reads of the review result are an hour apart, so a run that finishes moments after the
reviewer's decision was woken by Casework's completion event travelling the real path:
Casework → gateway → admission (gRPC) → the step's NOTIFY → dispatcher → Casework read.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from core.config.check import check_runtime_file
from core.deploy import apply
from core.workflow.package import build_package
from devstack.postgres import PostgresCluster
from devstack.products.casework import decide
from devstack.stack import LocalStack, wait_until
from gateway.events import sign

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RESULT_CHECK_SECONDS = 3600
INPUT = {"applicationId": "APP-2041", "applicantRef": "person-17"}
_numbers = itertools.count(1)


@dataclass
class Approval:
    stack: LocalStack
    producer: str
    operator: str

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def status(self, run_id: str) -> dict[str, Any]:
        answer = httpx.get(f"{self.stack.url}/v1/runs/{run_id}", headers=self.auth(self.producer))
        document: dict[str, Any] = answer.json()
        return document

    def until_state(self, run_id: str, states: set[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal found
            found = self.status(run_id)
            return found.get("state") in states

        wait_until(reached, f"run {run_id} in {sorted(states)}", timeout=30)
        return found


@pytest.fixture(scope="module")
def approval(
    postgres_server: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Approval]:
    root = tmp_path_factory.mktemp("approval")
    name = f"coordinator_e2e_approval_{os.getpid()}_{next(_numbers)}"
    database = postgres_server.create_database(name)
    built = build_package(ROOT / "examples" / "approval-notice", root / "packages")
    stack = LocalStack.prepare(
        root / "stack",
        packages=[(built.path, built.digest)],
        database=database,
        result_check_seconds=RESULT_CHECK_SECONDS,
    )
    try:
        stack.start_products()
        asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
        # The most talkative level, so the last test can look for values in everything.
        stack.start_coordinator("--log-level", "debug")
        tokens = root / "tokens"
        tokens.mkdir(mode=0o700)
        yield Approval(
            stack=stack,
            producer=stack.mint("producer", "alice", tokens / "alice").read_text().strip(),
            operator=stack.mint("operator", "olga", tokens / "olga").read_text().strip(),
        )
    finally:
        stack.stop()
        postgres_server.drop_database(name)


def test_a_reviewers_decision_wakes_the_run_and_the_notice_goes_out(approval: Approval) -> None:
    stack = approval.stack
    casework = stack.product_urls["casework-review-producer"]
    project = stack.summary["completions"]["review"]["profile"]
    started = httpx.post(
        f"{stack.url}/v1/workflows/approval-notice/runs",
        json={"input": INPUT},
        headers={**approval.auth(approval.producer), "Idempotency-Key": "e2e-approval-1"},
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["runId"]
    approval.until_state(run_id, {"waiting"})

    listing = httpx.get(f"{casework}/dev/projects/{project}/review-requests").json()
    [review] = [r for r in listing["reviews"] if r["subjectRef"] == INPUT["applicationId"]]
    assert review["status"] == "pending"
    decide(casework, project, review["reviewId"], "approved")
    decided = time.monotonic()
    final = approval.until_state(run_id, {"succeeded", "failed", "held", "cancelled"})
    woke_in = time.monotonic() - decided

    print(f"\nthe run ended {woke_in:.2f} s after the decision")
    assert (final["state"], final["outcome"]) == ("succeeded", "approved")
    assert woke_in < 5.0  # the next read was an hour away
    delivery = httpx.get(f"{casework}/dev/stats").json()["completions"][review["reviewId"]]
    assert (delivery["delivered"], delivery["lastStatus"]) == (True, 202)
    messaging = httpx.get(stack.product_urls["messaging"] + "/dev/stats").json()
    [answer] = messaging["answers"]
    assert answer["status"] == 202 and answer["body"]["messageId"].startswith("msg-")
    inspection = httpx.get(
        f"{stack.url}/v1/runs/{run_id}/inspection", headers=approval.auth(approval.operator)
    ).json()
    [wait] = [step for step in inspection["steps"] if step["type"] == "wait-for"]
    assert (wait["state"], wait["wait"]["checks"]) == ("completed", 2)
    assert "bindingConflict" not in inspection


def test_a_signed_event_starts_one_run_and_is_audited_without_a_client(
    approval: Approval,
) -> None:
    stack = approval.stack
    source = stack.summary["eventSource"]
    key = Path(source["keyFile"]).read_bytes()
    body = json.dumps(
        {
            "specversion": "1.0",
            "id": "e2e-event-1",
            "source": source["source"],
            "type": "org.example.application.submitted",
            "data": {"applicationId": "APP-3003", "applicantRef": "person-3"},
        }
    ).encode()

    def post(signature: str) -> httpx.Response:
        return httpx.post(
            f"{stack.url}/v1/events",
            content=body,
            headers={"registry-event-signature": signature, "Content-Type": "application/json"},
        )

    forged = post(sign(b"x" * 32, body, int(time.time())))
    first = post(sign(key, body, int(time.time())))
    again = post(sign(key, body, int(time.time())))

    assert (forged.status_code, forged.json()["code"]) == (401, "authentication.refused")
    assert first.status_code == 201, first.text
    assert again.status_code == 200
    assert again.json()["runId"] == first.json()["runId"]
    journal = stack.root / "deployment" / "audit.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    events = [r for r in records if r["action"] == "event-start"]
    assert [r["outcome"] for r in events] == ["ok", "ok"]
    assert all(r["clientRef"] is None and r["principalRef"] for r in events)
    assert events[0]["principalRef"] == events[1]["principalRef"]


TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (\w+) ([A-Z]+) ")


def secret_forms(path: Path) -> set[str]:
    """The ways a secret file's value could show up in a log line."""
    data = path.read_bytes()
    text = data.decode(errors="replace").strip()
    forms = {data.hex(), base64.b64encode(data).decode().rstrip("=")}
    forms.add(base64.urlsafe_b64encode(data).decode().rstrip("="))
    try:
        # A JWK; a random key whose first byte happens to be "{" is not one.
        jwk = json.loads(text) if text.startswith("{") else None
    except ValueError:
        jwk = None
    if isinstance(jwk, dict):
        forms |= {str(jwk[member]) for member in ("d", "p", "q", "dp", "dq", "qi") if member in jwk}
    elif "://" in text:
        password = urlsplit(text).password
        if password:
            forms.add(password)
    elif text.isprintable():
        forms.add(text)
    return {form for form in forms if len(form) >= 12}


def test_the_logs_tell_what_happened_and_never_a_value(approval: Approval) -> None:
    """Runs last in this module: every test above wrote into the same debug-level log."""
    stack = approval.stack
    lines = stack.log_text("coordinator").splitlines()
    records = [match for line in lines if (match := TIMESTAMPED.match(line))]

    serving = [match for match in records if " serving on " in match.string]
    assert {match[1] for match in serving} == {
        "gateway",
        "admission",
        "dispatcher",
        "recovery",
        "auditd",
    }
    assert any(" step await-decision: waiting" in line for line in lines)
    assert any(" step send-approval: prepared" in line for line in lines)
    assert any("the run ended at its finish (outcome approved)" in line for line in lines)
    assert {match[2] for match in records} >= {"INFO", "NOTICE"}

    secrets_dir = Path(stack.summary["secretsDir"])
    values = {form for path in secrets_dir.iterdir() for form in secret_forms(path)}
    values |= {approval.producer, approval.operator}
    values |= {"APP-2041", "person-17", "APP-3003", "person-3"}
    log = "\n".join(lines)
    assert len(values) > 10
    leaked = sorted(value[:6] + "…" for value in values if value in log)
    assert leaked == []
