"""A Messaging outage holds hundreds of runs; one bulk retry-same settles them (CONTRACT
§8.7, §10.2): the whole stack as real processes, driven through ``coordinatorctl bulk``.
(tests/console/test_console_at_scale.py does the same with 1,000 runs from the console.)

During the outage the stand-in processed every notice and then answered 500, so each run
is held with its effect unknown. After it, the operator looks first (``--dry-run``), then
acts. The dry run must name exactly the runs the real call acts on. Each run's resend must
carry its original key, and the stand-in's ledger must show it received twice and processed
once. The journal must hold one ``retry-same`` record per run with the reason, plus the
bulk request's own records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from auditd.journal import keyed_ref
from devstack.postgres import PostgresCluster
from tests.helpers.recovery_kit import (
    MESSAGING,
    RecoveryStack,
    started_recovery_stack,
    wait_for,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HELD_RUNS = 300
REASON = "INC-2041-messaging-outage"
FILTERS = ("--attention", "true", "--cause", "status-5xx", "--limit", str(HELD_RUNS))


@pytest.fixture(scope="module")
def stack(postgres_server: PostgresCluster) -> Iterator[RecoveryStack]:
    with started_recovery_stack(postgres_server, "coordinator_bulk_outage") as running:
        yield running


def test_one_bulk_retry_same_settles_every_run_an_outage_held(stack: RecoveryStack) -> None:
    started = stack.held_by_outage(HELD_RUNS, "person")
    before = stack.stats_of(MESSAGING)
    assert stack.ledger(started) == {(1, 1)}

    dry = stack.ctl(
        "bulk", "retry-same", "--reason", REASON, *FILTERS, "--dry-run", "--output", "json"
    )
    assert dry.document["dryRun"] is True
    assert dry.document["matched"] == HELD_RUNS
    assert sorted(dry.document["runIds"]) == sorted(started)
    # The dry run resent nothing.
    assert stack.stats_of(MESSAGING)["received"] == before["received"]

    began = time.monotonic()
    real = stack.ctl(
        "bulk", "retry-same", "--reason", REASON, *FILTERS, "--output", "json", timeout=600
    )
    took = time.monotonic() - began
    assert real.returncode == 0, real.stderr
    results = real.document["results"]
    assert real.document["matched"] == HELD_RUNS
    # Exactly the runs the dry run named, in the same order (the runs held longest first).
    assert [entry["runId"] for entry in results] == dry.document["runIds"]
    verdicts = [entry.get("result") for entry in results]
    assert not [entry for entry in results if "code" in entry], results
    assert set(verdicts) <= {"accepted", "pending"}, set(verdicts)
    print(
        f"bulk retry-same of {HELD_RUNS} held runs: {took:.1f} s, "
        f"{verdicts.count('accepted')} accepted, {verdicts.count('pending')} pending"
    )

    wait_for(
        lambda: stack.total("state=succeeded") == HELD_RUNS,
        "every resent run finished",
        timeout=240,
    )
    assert stack.total("attention=true") == 0
    # One resend each, under the original key, answered from the stand-in's record.
    assert stack.ledger(started) == {(2, 1)}
    assert stack.twice() == []

    # The journal: each run's retry-same with the reason, and the two bulk requests.
    records = stack.audit_records()
    per_run = [r for r in records if r["action"] == "retry-same"]
    assert sorted(r["runRef"] for r in per_run) == sorted(
        keyed_ref(stack.audit_key, run_id) for run_id in started
    )
    assert {(r["outcome"], r["reason"]) for r in per_run} == {("ok", REASON)}
    bulk = [r for r in records if r["action"] == "bulk-retry-same"]
    assert [(r["outcome"], r["reason"]) for r in bulk] == [("ok", REASON), ("ok", REASON)]
    assert all("runRef" not in r or r["runRef"] is None for r in bulk)
    # The bulk request's record comes after every run's.
    assert records.index(bulk[-1]) > max(records.index(r) for r in per_run)
