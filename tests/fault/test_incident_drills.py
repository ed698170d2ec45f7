"""Incident drills as tests (CONTRACT §9.3, §10.1, §10.5): kill -9, never a graceful stop.

(a) The dispatcher dies while the product holds the request: the call is uncertain within
    60 s of the coordinator's clock and reconcile settles it from the product's receipt.
(b) The database is backed up online while runs are mid-flight, the old deployment goes on
    and the product accepts more commands, then the old service is killed (fenced) and the
    backup restored into a fresh server. The operator runs the whole procedure with
    coordinatorctl — restore-hold, inspect, reconcile each held run,
    complete-execution-recovery, release-restore-hold, stop the recovery-only instance,
    start the ordinary one, retry-same or cancel what remains, release-admission-hold —
    and every run ends consistent with 0 commands processed twice. The Messaging stand-in
    is one process throughout, so its ledger remembers what the old deployment sent.
    An ordinary coordinator started before release-restore-hold dispatches nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.backup import BaseBackup, RestoredServer, backup, restore
from devstack.postgres import PostgresServer
from devstack.stack import wait_until
from tests.helpers.faults import CALL_STEP, LEASE_SECONDS, WAIT_SECONDS, kill, wait_exit
from tests.helpers.recovery_kit import (
    CANCEL_STEP,
    MESSAGING,
    NOTICE,
    WAIT_CANCEL,
    WAIT_PLAIN,
    WAIT_SECONDS_OF_PAUSE,
    RecoveryStack,
    recovery_stack,
    states,
    stays,
)

pytestmark = [pytest.mark.slow]

ABANDONED_WITHIN_SECONDS = 60
"""CONTRACT §9.3: after a kill -9 the abandoned step is uncertain within this."""
ATTESTED = ("--execution-history-complete", "--prior-deployment-fenced")


@pytest.fixture
def source() -> Iterator[PostgresServer]:
    """A server of its own: the drill backs up the whole cluster and restores it."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


def test_drill_dispatcher_killed_while_the_product_holds_the_request(
    source: PostgresServer,
) -> None:
    with recovery_stack(source.default) as stack:
        for component in ("auditd", "recovery", "admission", "gateway"):
            stack.start_component(component)
        dispatcher = stack.start_component("dispatcher", wait_ready=True)
        stack.fault_on(MESSAGING, "hang-after")
        run_id = stack.start_run()
        stack.wait_processed(run_id, 1)

        kill(dispatcher.pid)
        assert wait_exit(dispatcher, WAIT_SECONDS) == -9
        stack.stop(dispatcher)
        killed_at = stack.now
        stack.start_component("dispatcher")
        wait_until(stack.ready, "/ready with the new dispatcher", timeout=WAIT_SECONDS)
        stack.advance(LEASE_SECONDS + 1)
        stack.wait_held(run_id)
        assert (stack.now - killed_at).total_seconds() <= ABANDONED_WITHIN_SECONDS
        step = stack.step(run_id)
        assert (step["state"], step["effect"]) == ("uncertain", "unknown")
        assert run_id in stack.attention_ids()

        # The held answer goes to a dead socket; the product's receipt still tells.
        stack.clear_fault_on(MESSAGING)
        answer = stack.act("reconcile", run_id, "INC-DRILL-A").document

        assert answer["result"] == "accepted"
        final = stack.wait_ended(run_id)
        assert (final["state"], final.get("outcome")) == ("succeeded", "notified")
        assert stack.counts(run_id) == (1, 1)
        assert run_id not in stack.attention_ids()


# --------------------------------------------------------------------------------- drill (b)


class Runs:
    """The drill's runs, by what was happening to each when the backup was taken."""

    def __init__(self, stack: RecoveryStack) -> None:
        # Waits an hour from now: its notice goes out after the backup, in the old
        # deployment only.
        self.waiting = stack.start_run("waiting", workflow=WAIT_PLAIN)
        stack.wait_state(self.waiting, ("waiting",), "the waiting run")
        stack.advance(WAIT_SECONDS_OF_PAUSE / 2)
        # Waits on past the restore, and is cancelled there.
        self.to_cancel = stack.start_run("to-cancel", workflow=WAIT_CANCEL)
        stack.wait_state(self.to_cancel, ("waiting",), "the run to cancel")
        self.done = stack.start_run("done")
        assert stack.wait_ended(self.done)["state"] == "succeeded"
        # Processed, answer lost: held.
        stack.fault_on(MESSAGING, "fail-after")
        self.held = stack.start_run("held")
        stack.wait_held(self.held)
        # Never reached the product, but the coordinator cannot know: held.
        stack.fault_on(MESSAGING, "drop-before")
        self.never = stack.start_run("never")
        stack.wait_held(self.never)
        # Processed, and the product holds the answer while the backup is taken.
        stack.fault_on(MESSAGING, "hang-after")
        self.in_flight = stack.start_run("in-flight")
        stack.wait_processed(self.in_flight, 1)

    @property
    def all(self) -> list[str]:
        return [self.waiting, self.to_cancel, self.done, self.held, self.never, self.in_flight]


def _after_the_backup(stack: RecoveryStack, runs: Runs) -> None:
    """The old deployment goes on: the held answer arrives, the waiting run's notice goes."""
    stack.clear_fault_on(MESSAGING)
    assert stack.wait_ended(runs.in_flight)["state"] == "succeeded"
    stack.advance(WAIT_SECONDS_OF_PAUSE / 2 + 1)
    assert stack.wait_ended(runs.waiting)["state"] == "succeeded"
    assert stack.counts(runs.waiting) == (1, 1)
    assert stack.status(runs.to_cancel)["state"] == "waiting"


def _ordinary_under_the_hold_dispatches_nothing(stack: RecoveryStack, runs: Runs) -> None:
    ordinary = stack.start_instance()
    doctor = stack.ctl("doctor", "--output", "json").document
    assert doctor["mode"] == "ordinary"
    assert doctor["holds"] == {"execution": True, "admission": True}
    # The restored waiting run's instant has passed: it is due, and must stay unclaimed.
    assert doctor["state"]["dueJobs"] >= 1, doctor
    assert stack.status(runs.waiting)["state"] == "waiting"
    assert stack.post_start().json()["code"] == "admission.held"
    assert stack.act("retry-same", runs.never, "RESTORE-1").code == "execution.held"
    # Under the test clock an idle dispatcher looks for due work every 0.25 s, so the
    # window spans several looks; the same run is sent at once after the release.
    stays(
        lambda: (
            stack.counts(runs.waiting) == (1, 1)
            and stack.status(runs.waiting)["state"] == "waiting"
        ),
        "an ordinary coordinator dispatched under the execution hold",
    )
    assert stack.stop(ordinary) == 0


def _restore_procedure(stack: RecoveryStack, runs: Runs) -> None:
    """The operator's eight steps, with the refusals the order of things implies."""
    recovery = stack.start_instance(recovery_only=True)
    # 1. Hold execution and admissions; the snapshot marks what may have been sent.
    held = stack.ctl("restore-hold", "--reason", "RESTORE-1", "--output", "json").document
    assert held["holds"] == {"execution": True, "admission": True}
    assert held["snapshot"]["runs"] == 3, held
    # 2. Inspect what needs attention.
    attention = set(stack.attention_ids())
    assert attention == {runs.held, runs.never, runs.in_flight}
    for run_id in sorted(attention):
        step = stack.ctl("inspect", "--run", run_id, "--output", "json").document["steps"][-1]
        assert (step["step"], step["state"], step["effect"]) == (CALL_STEP, "uncertain", "unknown")
    assert stack.ctl("release-restore-hold", "--reason", "RESTORE-1").code == "restore.unresolved"
    assert stack.act("retry-same", runs.never, "RESTORE-1").code == "retry.refused"

    # An ordinary instance started now, before the release, sends nothing.
    assert stack.stop(recovery) == 0
    _ordinary_under_the_hold_dispatches_nothing(stack, runs)
    recovery = stack.start_instance(recovery_only=True)

    # 3. Reconcile each held run from the product's receipts.
    results = {
        run_id: stack.act("reconcile", run_id, "RESTORE-1").document["result"]
        for run_id in (runs.held, runs.never, runs.in_flight)
    }
    assert results == {runs.held: "accepted", runs.never: "not-sent", runs.in_flight: "accepted"}
    # Cancel writes only the database: allowed here, its onCancel path runs after release.
    assert stack.act("cancel", runs.to_cancel, "RESTORE-1").document["result"] == "cancelling"
    # 4. State that the execution history after the backup is established.
    early = stack.ctl("release-restore-hold", "--reason", "RESTORE-1")
    assert early.code == "restore.review-required"
    attested = stack.ctl(
        "complete-execution-recovery", "--recovery-reference", "RESTORE-1", *ATTESTED
    )
    assert attested.returncode == 0, attested.stderr
    # 5. Release the execution hold.
    released = stack.ctl("release-restore-hold", "--reason", "RESTORE-1", "--output", "json")
    assert released.document["holds"] == {"execution": False, "admission": True}
    # 6. Stop the recovery-only instance, 7. start the ordinary one and settle what remains.
    assert stack.stop(recovery) == 0
    stack.start_instance()
    retried = stack.act("retry-same", runs.never, "RESTORE-1").document
    assert retried["result"] == "accepted", retried
    # 8. Reopen admissions.
    admitted = stack.ctl(
        "release-admission-hold",
        "--recovery-reference",
        "RESTORE-1",
        "--admission-history-complete",
        "--prior-deployment-fenced",
        "--output",
        "json",
    ).document
    assert admitted["holds"] == {"execution": False, "admission": False}


# About 40 s on an idle machine (five coordinator starts); more room than the default.
@pytest.mark.timeout(240)
def test_drill_restore_from_a_backup_taken_mid_flight(source: PostgresServer) -> None:
    taken: BaseBackup | None = None
    restored: RestoredServer | None = None
    try:
        with recovery_stack(source.default) as stack:
            old = stack.start_instance()
            runs = Runs(stack)
            taken = backup(source, label="drill-b")
            _after_the_backup(stack, runs)
            # Fence the old service: kill -9, and its database is gone with it.
            stack.kill_instance(old)
            source.stop()

            restored = restore(taken)
            stack.use_database(restored.default)
            # The restore knows only what the backup held.
            assert set(stack.stored_run_ids()) == set(runs.all)
            assert stack.steps_of(runs.in_flight)[0]["state"] == "prepared"

            _restore_procedure(stack, runs)

            final = {run_id: stack.wait_ended(run_id) for run_id in runs.all}
            assert states(stack, runs.all) == {
                runs.waiting: "succeeded",
                runs.to_cancel: "cancelled",
                runs.done: "succeeded",
                runs.held: "succeeded",
                runs.never: "succeeded",
                runs.in_flight: "succeeded",
            }
            assert final[runs.to_cancel].get("outcome") == "cancelled"
            assert not any(status["attention"] for status in final.values())
            assert stack.attention_ids() == []
            # 0 commands processed twice; the restored deployment's resends were answered
            # from the product's records.
            assert stack.twice() == []
            assert stack.counts(runs.waiting) == (2, 1)
            assert stack.counts(runs.in_flight) == (1, 1)
            assert stack.counts(runs.held) == (1, 1)
            assert stack.counts(runs.never) == (1, 1)
            assert stack.counts(runs.to_cancel) == (0, 0)
            assert stack.counts(runs.to_cancel, CANCEL_STEP) == (1, 1)
            assert stack.wait_ended(stack.start_run(workflow=NOTICE))["state"] == "succeeded"
            kinds = [r["action"] for r in stack.audit_records() if r.get("reason") == "RESTORE-1"]
            for kind in (
                "restore-hold",
                "reconcile",
                "cancel",
                "complete-execution-recovery",
                "release-restore-hold",
                "retry-same",
                "release-admission-hold",
            ):
                assert kind in kinds, kind
    finally:
        if restored is not None:
            restored.stop()
        if taken is not None:
            taken.remove()
