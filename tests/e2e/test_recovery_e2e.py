"""Operator recovery end to end (CONTRACT §10, §11): real coordinator processes, the TLS
PostgreSQL server, the dev issuer and the Messaging and Casework stand-ins, driven through
``coordinatorctl`` and HTTP.

One stack serves the whole module, so each test leaves nothing in flight and installs its
fault for exactly the one command it is about. The stand-ins' own counters are the witness
of what reached a product: ``received`` counts every request with a key, ``processed``
counts the first processing, so a resend the stand-in answered from its idempotency record
shows as ``received == 2, processed == 1``. The tests that move the clocks far ahead (the
retention cut-off, an expired receipt) come last, for the same reason.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest

from core.clock import format_instant
from devstack.postgres import PostgresCluster
from tests.helpers.faults import CALL_STEP
from tests.helpers.recovery_kit import (
    CANCEL_STEP,
    CASEWORK,
    DECISION_STEP,
    MESSAGING,
    NOTICE,
    REVIEW,
    REVIEW_STEP,
    WAIT_CANCEL,
    WAIT_PLAIN,
    WAIT_SECONDS_OF_PAUSE,
    WAIT_STEP,
    RecoveryStack,
    started_recovery_stack,
    wait_for,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

DAY = 86_400


@pytest.fixture(scope="module")
def stack(postgres_server: PostgresCluster) -> Iterator[RecoveryStack]:
    with started_recovery_stack(postgres_server, "coordinator_e2e_recovery") as running:
        yield running


def _held_after_processing(stack: RecoveryStack, workflow: str = NOTICE) -> str:
    """A run whose first call the product processed and then answered 500: held."""
    return stack.held_after_processing(workflow=workflow)


def _one_record(stack: RecoveryStack, action: str, run_id: str) -> dict[str, object]:
    records = stack.audited(action, run_id)
    assert len(records) == 1, records
    return records[0]


# ------------------------------------------------------------------------------ searches


def _subject_of(token: str) -> str:
    """The ``sub`` claim of a JWT (read, not verified: the test's own token)."""
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sub"])


def test_an_operator_finds_a_run_by_its_start_key_or_the_start_of_its_id(
    stack: RecoveryStack,
) -> None:
    key = f"order-{uuid.uuid4().hex[:8]}"
    answer = stack.post_start("person-search", key=key)
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["runId"]
    client = _subject_of(stack.producer_token)

    def found(*args: str) -> list[str]:
        document = stack.ctl("list", *args, "--output", "json").document
        assert document["nextCursor"] is None
        assert document["total"] == len(document["runs"])
        return [run["runId"] for run in document["runs"]]

    by_key = ("--workflow", NOTICE, "--start-key", key)
    assert found(*by_key, "--start-sub", client) == [run_id]
    # Without --start-sub the key is the caller's own: the operator did not start the run.
    # Nor did the key start a run of another workflow.
    assert found(*by_key) == []
    assert found("--workflow", REVIEW, "--start-key", key, "--start-sub", client) == []
    assert run_id in found("--id-prefix", run_id[:6].upper())
    assert found("--id-prefix", run_id) == [run_id]
    refused = stack.ctl("list", "--id-prefix", run_id[:8], "--state", "held")
    assert refused.code == "request.invalid" and "state:" in refused.stderr


# ------------------------------------------------------------------------------ reconcile


def test_a_processed_command_reconciles_to_accepted_and_the_run_continues(
    stack: RecoveryStack,
) -> None:
    run_id = _held_after_processing(stack)
    step = stack.step(run_id)
    assert (step["state"], step["effect"]) == ("uncertain", "unknown")
    assert run_id in stack.attention_ids()

    answer = stack.act("reconcile", run_id, "INC-101").document

    assert answer["runId"] == run_id
    assert answer["result"] == "accepted"
    final = stack.wait_ended(run_id)
    assert (final["state"], final.get("outcome"), final["attention"]) == (
        "succeeded",
        "notified",
        False,
    )
    step = stack.step(run_id)
    assert (step["state"], step["effect"]) == ("completed", "accepted")
    # The run continued past the reconciled call; the product saw the command once.
    assert stack.step(run_id, "done")["state"] == "completed"
    assert stack.counts(run_id) == (1, 1)
    assert run_id not in stack.attention_ids()
    record = _one_record(stack, "reconcile", run_id)
    assert (record["outcome"], record["reason"]) == ("ok", "INC-101")
    actions = stack.inspection(run_id)["lastOperatorActions"]
    assert [(a["kind"], a["reason"]) for a in actions] == [("reconcile", "INC-101")]


def test_a_command_never_processed_returns_to_not_sent_and_retry_same_resends_its_key(
    stack: RecoveryStack,
) -> None:
    keys_before = set(stack.stats_of(MESSAGING)["received"])
    # The connection drops before the stand-in looks at the command: the coordinator cannot
    # tell this from a lost answer, so the run is held.
    stack.fault_on(MESSAGING, "drop-before")
    run_id = stack.start_run()
    stack.wait_held(run_id)
    assert stack.counts(run_id) == (0, 0)

    reconciled = stack.act("reconcile", run_id, "INC-102").document

    assert reconciled["result"] == "not-sent"
    assert (reconciled["state"], reconciled["attention"]) == ("held", True)
    step = stack.step(run_id)
    assert step["state"] == "not-sent"
    assert "effect" not in step
    assert run_id in stack.attention_ids()

    retried = stack.act("retry-same", run_id, "INC-102").document

    assert retried["result"] == "accepted", retried
    final = stack.wait_ended(run_id)
    assert (final["state"], final["attention"]) == ("succeeded", False)
    # Exactly one new key reached the product, the one the first attempt carried.
    assert set(stack.stats_of(MESSAGING)["received"]) - keys_before == {stack.key_of(run_id)}
    assert stack.counts(run_id) == (1, 1)
    assert run_id not in stack.attention_ids()
    assert _one_record(stack, "reconcile", run_id)["reason"] == "INC-102"
    assert _one_record(stack, "retry-same", run_id)["outcome"] == "ok"


def test_retry_same_of_a_processed_command_is_answered_from_the_products_record(
    stack: RecoveryStack,
) -> None:
    run_id = _held_after_processing(stack)
    assert stack.counts(run_id) == (1, 1)

    retried = stack.act("retry-same", run_id, "INC-103").document

    assert retried["result"] == "accepted", retried
    assert stack.wait_ended(run_id)["state"] == "succeeded"
    # Sent twice under one key, processed once.
    assert stack.counts(run_id) == (2, 1)
    assert stack.twice() == []


def test_a_casework_request_cannot_be_reconciled_but_may_be_retried(
    stack: RecoveryStack,
) -> None:
    run_id = _held_after_processing(stack, REVIEW)

    refused = stack.act("reconcile", run_id, "INC-104")

    assert refused.code == "reconcile.unsupported"
    held = stack.status(run_id)
    assert (held["state"], held["attention"]) == ("held", True)
    assert stack.step(run_id, REVIEW_STEP)["state"] == "uncertain"
    record = _one_record(stack, "reconcile", run_id)
    assert (record["outcome"], record["reason"]) == ("conflict", "INC-104")

    retried = stack.act("retry-same", run_id, "INC-104").document

    assert retried["result"] == "accepted", retried
    stack.wait_state(run_id, ("waiting",), "the run waiting for the reviewer")
    assert stack.counts(run_id, REVIEW_STEP, CASEWORK) == (2, 1)
    assert stack.twice(CASEWORK) == []

    # A run waiting for a product result is cancelled at once, its wait abandoned.
    cancelled = stack.act("cancel", run_id, "INC-104").document
    assert (cancelled["result"], cancelled["state"]) == ("cancelled", "cancelled")
    assert stack.step(run_id, DECISION_STEP)["state"] == "cancelled"


def test_only_an_uncertain_step_can_be_reconciled_and_only_a_held_call_resent(
    stack: RecoveryStack,
) -> None:
    run_id = stack.start_run()
    assert stack.wait_ended(run_id)["state"] == "succeeded"

    assert stack.act("reconcile", run_id, "INC-105").code == "reconcile.refused"
    assert stack.act("retry-same", run_id, "INC-105").code == "retry.refused"
    assert stack.act("cancel", run_id, "INC-105").code == "cancel.refused"
    assert stack.counts(run_id) == (1, 1)
    for action in ("reconcile", "retry-same", "cancel"):
        record = _one_record(stack, action, run_id)
        assert (record["outcome"], record["reason"]) == ("conflict", "INC-105")


def test_a_reason_that_is_not_a_reference_is_refused_by_the_cli_and_the_server(
    stack: RecoveryStack,
) -> None:
    run_id = _held_after_processing(stack)
    local = stack.act("reconcile", run_id, "has spaces")
    assert local.code == "request.invalid"
    answer = httpx.post(
        f"{stack.local.url}/v1/runs/{run_id}/reconcile",
        json={"reason": "x" * 129},
        headers={"Authorization": f"Bearer {stack.operator_token}"},
        timeout=10.0,
    )
    assert (answer.status_code, answer.json()["code"]) == (400, "request.invalid")
    assert stack.status(run_id)["state"] == "held"
    # Settle it so that nothing stays held for the later tests.
    assert stack.act("reconcile", run_id, "INC-106").document["result"] == "accepted"
    assert stack.wait_ended(run_id)["state"] == "succeeded"


# --------------------------------------------------------------------------------- cancel


def test_cancel_with_on_cancel_abandons_the_wait_and_runs_the_cancel_path(
    stack: RecoveryStack,
) -> None:
    run_id = stack.start_run(workflow=WAIT_CANCEL)
    stack.wait_state(run_id, ("waiting",), "the run waiting")
    # The cancel path's own call is held by the product, so "cancelling" can be seen.
    stack.fault_on(MESSAGING, "hang-after")

    answer = stack.act("cancel", run_id, "INC-107").document

    assert answer["result"] == "cancelling"
    assert answer.get("cancelling") is True
    wait_for(lambda: stack.counts(run_id, CANCEL_STEP)[1] == 1, "the cancel notice processed")
    meanwhile = stack.status(run_id)
    assert meanwhile["state"] == "running"
    assert meanwhile.get("cancelling") is True
    assert stack.step(run_id, WAIT_STEP)["state"] == "cancelled"

    stack.clear_fault_on(MESSAGING)
    final = stack.wait_ended(run_id)
    assert (final["state"], final.get("outcome")) == ("cancelled", "cancelled")
    assert stack.step(run_id, CANCEL_STEP)["effect"] == "accepted"
    # The waited-for notice is never sent, now or when its hour would have passed.
    stack.advance(WAIT_SECONDS_OF_PAUSE + 1)
    barrier = stack.start_run()
    assert stack.wait_ended(barrier)["state"] == "succeeded"
    assert stack.counts(run_id, CALL_STEP) == (0, 0)
    assert stack.counts(run_id, CANCEL_STEP) == (1, 1)
    assert _one_record(stack, "cancel", run_id)["reason"] == "INC-107"


def test_cancel_without_on_cancel_ends_a_waiting_run_at_once(stack: RecoveryStack) -> None:
    run_id = stack.start_run(workflow=WAIT_PLAIN)
    stack.wait_state(run_id, ("waiting",), "the run waiting")

    answer = stack.act("cancel", run_id, "INC-108").document

    assert answer["result"] == "cancelled"
    assert answer["state"] == "cancelled"
    assert "outcome" not in answer
    assert stack.step(run_id, WAIT_STEP)["state"] == "cancelled"
    stack.advance(WAIT_SECONDS_OF_PAUSE + 1)
    barrier = stack.start_run()
    assert stack.wait_ended(barrier)["state"] == "succeeded"
    assert stack.counts(run_id) == (0, 0)
    assert stack.status(run_id)["state"] == "cancelled"
    # Cancelling it again: it has ended.
    assert stack.act("cancel", run_id, "INC-108").code == "cancel.refused"


def test_cancel_of_a_held_run_keeps_its_uncertain_step_unknown(stack: RecoveryStack) -> None:
    run_id = _held_after_processing(stack)

    answer = stack.act("cancel", run_id, "INC-109").document

    assert answer["result"] == "cancelled"
    assert answer["state"] == "cancelled"
    step = stack.step(run_id)
    assert (step["state"], step["effect"]) == ("uncertain", "unknown")
    assert run_id in stack.attention_ids()

    # A receipt still settles the step, but the cancelled run does not go on.
    reconciled = stack.act("reconcile", run_id, "INC-109").document
    assert reconciled["result"] == "accepted"
    assert (reconciled["state"], reconciled["attention"]) == ("cancelled", False)
    assert [s["step"] for s in stack.inspection(run_id)["steps"]] == [CALL_STEP]
    assert run_id not in stack.attention_ids()
    assert stack.counts(run_id) == (1, 1)


# --------------------------------------------------------------------------- restore holds


def _holds_metric(stack: RecoveryStack) -> dict[str, int]:
    """``coordinator_holds{hold}`` from the metrics listener."""
    text = httpx.get(stack.local.metrics_url + "/metrics", timeout=10.0).text
    found: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("coordinator_holds{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('"')[1]] = int(float(value))
    return found


def test_restore_holds_on_an_ordinary_instance_stop_dispatch_until_released(
    stack: RecoveryStack,
) -> None:
    run_id = _held_after_processing(stack)

    held = stack.ctl("restore-hold", "--reason", "DRILL-1", "--output", "json").document

    assert held["holds"] == {"execution": True, "admission": True}
    assert held["snapshot"]["runs"] >= 1
    assert _holds_metric(stack) == {"execution": 1, "admission": 1}
    assert stack.post_start().json()["code"] == "admission.held"
    assert stack.act("retry-same", run_id, "DRILL-1").code == "execution.held"
    unresolved = stack.ctl("release-restore-hold", "--reason", "DRILL-1")
    assert unresolved.code == "restore.unresolved"
    early = stack.ctl(
        "release-admission-hold",
        "--recovery-reference",
        "DRILL-1",
        "--admission-history-complete",
        "--prior-deployment-fenced",
    )
    assert early.code == "restore.hold-required"

    # Reconcile only reads a receipt: allowed under the hold, and the run's next step waits.
    assert stack.act("reconcile", run_id, "DRILL-1").document["result"] == "accepted"
    assert stack.status(run_id)["state"] == "running"
    assert stack.ctl("release-restore-hold", "--reason", "DRILL-1").code == (
        "restore.review-required"
    )
    recovered = stack.ctl(
        "complete-execution-recovery",
        "--recovery-reference",
        "DRILL-1",
        "--execution-history-complete",
        "--prior-deployment-fenced",
        "--output",
        "json",
    ).document
    assert recovered["holds"]["execution"] is True
    assert stack.status(run_id)["state"] == "running"

    released = stack.ctl("release-restore-hold", "--reason", "DRILL-1", "--output", "json")
    assert released.document["holds"] == {"execution": False, "admission": True}
    assert stack.wait_ended(run_id)["state"] == "succeeded"
    admitted = stack.ctl(
        "release-admission-hold",
        "--recovery-reference",
        "DRILL-1",
        "--admission-history-complete",
        "--prior-deployment-fenced",
        "--output",
        "json",
    ).document
    assert admitted["holds"] == {"execution": False, "admission": False}
    assert stack.wait_ended(stack.start_run())["state"] == "succeeded"
    assert stack.counts(run_id) == (1, 1)
    doctor = stack.ctl("doctor", "--output", "json").document
    assert doctor["holds"] == {"execution": False, "admission": False}
    assert _holds_metric(stack) == {"execution": 0, "admission": 0}
    for action in (
        "restore-hold",
        "complete-execution-recovery",
        "release-restore-hold",
        "release-admission-hold",
    ):
        assert any(r["reason"] == "DRILL-1" for r in stack.audited(action)), action


# ------------------------------------------------------------------------------ retention


def test_retention_erases_the_payloads_of_ended_runs_and_keeps_tombstones(
    stack: RecoveryStack,
) -> None:
    key = "retention-start-1"
    started = stack.post_start("person-erased", key=key)
    assert started.status_code == 201, started.text
    run_id = str(started.json()["runId"])
    assert stack.wait_ended(run_id)["state"] == "succeeded"
    live = stack.start_run(workflow=WAIT_PLAIN)
    stack.wait_state(live, ("waiting",), "a live run")
    payloads = "SELECT count(*) AS n FROM {ns}.payload WHERE run_id = $1"
    assert stack.owner_fetch(payloads, run_id)[0]["n"] > 0

    # The run ended at the pinned instant: a cutoff just after it, once the clock has moved
    # past the cutoff (a cutoff later than now is refused). The coordinator's pinned clock
    # may run ahead of this machine's, which coordinatorctl compares --before with, so the
    # API is called directly here.
    cutoff = format_instant(stack.now + timedelta(milliseconds=1))
    ahead = stack.post("/v1/operator/retain", {"before": cutoff, "limit": 100, "dryRun": True})
    assert ahead.status_code == 400 and ahead.json()["code"] == "request.invalid"
    stack.advance(1)
    looked = stack.post("/v1/operator/retain", {"before": cutoff, "limit": 100, "dryRun": True})
    assert looked.status_code == 200, looked.text
    assert run_id in looked.json()["runIds"] and looked.json()["erased"] == 0
    assert stack.owner_fetch(payloads, run_id)[0]["n"] > 0
    answer = stack.post("/v1/operator/retain", {"before": cutoff, "limit": 100})
    assert answer.status_code == 200, answer.text
    erased = answer.json()
    assert erased["runIds"] == looked.json()["runIds"]

    assert run_id in erased["runIds"]
    assert live not in erased["runIds"]
    assert stack.owner_fetch(payloads, run_id)[0]["n"] == 0
    assert stack.owner_fetch(payloads, live)[0]["n"] > 0
    tombstones = stack.owner_fetch(
        "SELECT kind, value FROM {ns}.tombstone WHERE run_id = $1", run_id
    )
    assert {row["kind"] for row in tombstones} == {"start-identity", "command-key"}
    assert ("command-key", stack.key_of(run_id)) in {(r["kind"], r["value"]) for r in tombstones}
    again = stack.post_start("person-erased", key=key)
    assert (again.status_code, again.json()["code"]) == (409, "run.payload-erased")
    status = stack.status(run_id)
    assert (status["state"], status.get("outcome")) == ("succeeded", "notified")
    assert stack.inspection(run_id)["steps"]
    assert stack.act("reconcile", run_id, "INC-110").code == "run.payload-erased"
    assert stack.act("retry-same", run_id, "INC-110").code == "run.payload-erased"
    assert stack.act("cancel", live, "INC-110").document["result"] == "cancelled"


# ------------------------------------------------------------------- receipt windows (last)


def test_an_expired_receipt_is_refused_and_the_run_stays_held(stack: RecoveryStack) -> None:
    run_id = _held_after_processing(stack)
    # Eight days on the product's clock: past its seven-day receipt window.
    stack.advance_product_clock(MESSAGING, 8 * DAY)

    refused = stack.act("reconcile", run_id, "INC-111")

    assert refused.code == "receipt.expired"
    held = stack.status(run_id)
    assert (held["state"], held["attention"]) == ("held", True)
    step = stack.step(run_id)
    assert (step["state"], step["effect"]) == ("uncertain", "unknown")
    assert run_id in stack.attention_ids()
    # Nor may the command be resent once the product's idempotency window is over.
    stack.advance(8 * DAY)
    assert stack.act("retry-same", run_id, "INC-111").code == "retry.refused"
    assert stack.counts(run_id) == (1, 1)
    assert stack.status(run_id)["state"] == "held"
