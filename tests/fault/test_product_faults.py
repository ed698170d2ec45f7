"""A product that fails, answers badly or hangs, seen through real processes (CONTRACT
§2.1, §9.3): definite failures are retried by themselves, uncertain ones hold the run and
are never resent — not by the dispatcher, not after a restart, not after a SIGTERM.
"""

from __future__ import annotations

import signal
import time

import pytest

from devstack.postgres import DatabaseHandle
from tests.helpers.faults import (
    LEASE_SECONDS,
    STOP_BUDGET_SECONDS,
    fault_stack,
    wait_exit,
)

pytestmark = pytest.mark.slow


def test_unavailable_twice_then_success_is_retried_by_itself(database: DatabaseHandle) -> None:
    # The wall clock: the retry delays (about 1 s, then 2 s) really pass.
    with fault_stack(database, test_clock=False) as stack:
        stack.start()
        stack.fault("fail-before", count=2)
        run_id = stack.start_run()
        status = stack.wait_state(run_id, ("succeeded", "failed", "held"), "the retried run")
        assert status["state"] == "succeeded", status
        assert status["attention"] is False
        step = stack.call_step(run_id)
        assert step["attempts"] == 3
        assert step["effect"] == "accepted"
        # Two answers said "nothing processed"; the third attempt was processed, once.
        assert stack.processed(run_id) == 1
        assert stack.received(run_id) == 1


def test_error_after_processing_holds_and_is_never_resent(database: DatabaseHandle) -> None:
    with fault_stack(database) as stack:
        first = stack.start()
        stack.fault("fail-after", count=1)
        run_id = stack.start_run()
        status = stack.wait_state(run_id, ("held", "succeeded", "failed"), "the 500 run")
        assert status["state"] == "held", status
        assert status["attention"] is True
        step = stack.call_step(run_id)
        assert (step["state"], step.get("effect"), step["attempts"]) == ("uncertain", "unknown", 1)
        assert stack.processed(run_id) == 1

        # A clean restart, and time past any lease: still held, still sent once. The
        # stand-in would replay its first answer to a resend, so ``received`` is what shows
        # whether one happened.
        assert stack.stop(first) == 0
        stack.start()
        stack.advance(LEASE_SECONDS + 1)
        stack.finish_barrier_run()
        assert stack.status(run_id)["state"] == "held"
        assert stack.call_step(run_id)["state"] == "uncertain"
        assert stack.processed(run_id) == 1
        assert stack.received(run_id) == 1


def test_sigterm_while_a_call_hangs_exits_promptly_and_makes_it_uncertain(
    database: DatabaseHandle,
) -> None:
    with fault_stack(database) as stack:
        launcher = stack.start()
        stack.fault("hang-after", count=1)
        run_id = stack.start_run()
        stack.wait_processed(run_id, 1)

        began = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        status = wait_exit(launcher, STOP_BUDGET_SECONDS + 5)
        took = time.monotonic() - began
        stack.stop(launcher)
        assert status == 0
        assert took < STOP_BUDGET_SECONDS, f"the coordinator took {took:.1f} s to stop"

        # The stop itself recorded the cut-off call as uncertain: no lease had to run out
        # (the coordinator's clock never moves in this test).
        row = stack.step_row(run_id)
        assert row is not None
        assert (row["state"], row["effect"], row["lease_owner"]) == ("uncertain", "unknown", None)

        stack.start()
        held = stack.status(run_id)
        assert held["state"] == "held", held
        assert held["attention"] is True
        stack.clear_fault()
        stack.finish_barrier_run()
        assert stack.call_step(run_id)["state"] == "uncertain"
        assert stack.processed(run_id) == 1
        assert stack.received(run_id) == 1
