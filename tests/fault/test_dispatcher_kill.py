"""kill -9 of the dispatcher at the three instructions that matter (CONTRACT §2.1, §9.3).

Each test crashes a real dispatcher process, restarts it, moves the coordinator's clock past
the dead holder's lease, and then checks both sides: the run is still there and held for an
operator with an unknown effect, and the Messaging stand-in's own ledger shows the command
was never sent a second time (a resend would count in ``received`` even where the stand-in's
idempotency would keep ``processed`` at one).
"""

from __future__ import annotations

import contextlib

import httpx
import pytest

from devstack.postgres import DatabaseHandle
from devstack.stack import wait_until
from tests.helpers.faults import (
    CALL_STEP,
    LEASE_SECONDS,
    WAIT_SECONDS,
    FaultStack,
    fault_stack,
    kill,
    wait_exit,
)

pytestmark = pytest.mark.slow


def _crash_with_hook(stack: FaultStack, point: str) -> str:
    """Start the all-in-one coordinator with a crash point; one run kills its dispatcher."""
    first = stack.start(crash_at=point)
    answered: str | None = None
    # The instance may go down before the gateway answers: the dispatcher claims the run
    # as soon as admission commits it. The run exists either way.
    with contextlib.suppress(httpx.HTTPError):
        answer = stack.post_start()
        assert answer.status_code == 201, answer.text
        answered = str(answer.json()["runId"])
    # The launcher notices its dispatcher died and takes the whole instance down.
    status = wait_exit(first, WAIT_SECONDS)
    log = stack.log_of(first)
    stack.stop(first)
    assert status != 0
    assert "the dispatcher component exited (status -9)" in log, log
    (run_id,) = stack.stored_run_ids()
    assert answered in (None, run_id)
    return run_id


def _assert_abandoned_then_uncertain(stack: FaultStack, run_id: str, sent: int) -> None:
    """After a restart: untouched while the dead lease lasts, uncertain once it ran out."""
    stack.start()
    # The dead dispatcher's lease has not run out on the coordinator's clock: the new
    # dispatcher must leave the step alone (not resend, not settle it).
    before = stack.status(run_id)
    assert before["state"] == "running", before
    assert stack.call_step(run_id)["state"] == "prepared"

    stack.advance(LEASE_SECONDS + 1)
    held = stack.wait_state(run_id, ("held", "succeeded", "failed"), "the abandoned run")
    assert held["state"] == "held", held
    assert held["attention"] is True
    step = stack.call_step(run_id)
    assert (step["state"], step.get("effect")) == ("uncertain", "unknown"), step
    assert step["attempts"] == 1

    # A later run goes through the same dispatcher: it has looked at due work since.
    barrier = stack.finish_barrier_run()
    assert stack.processed(barrier) == 1
    assert stack.processed(run_id) == sent
    assert stack.received(run_id) == sent
    assert run_id in stack.run_ids()
    assert stack.status(run_id)["state"] == "held"


def test_killed_after_prepare_holds_the_run_and_never_sends(database: DatabaseHandle) -> None:
    with fault_stack(database) as stack:
        run_id = _crash_with_hook(stack, "after-prepare")

        # The command was committed as prepared under the dead dispatcher's lease, and no
        # byte of it reached the product.
        row = stack.step_row(run_id)
        assert row is not None
        assert row["state"] == "prepared"
        assert row["lease_owner"] is not None
        assert row["command_key"] == stack.key_of(run_id)
        assert stack.received(run_id) == 0

        # The coordinator cannot know it was not sent: held, effect unknown, never sent.
        _assert_abandoned_then_uncertain(stack, run_id, sent=0)


def test_killed_after_answer_holds_the_run_processed_once(database: DatabaseHandle) -> None:
    with fault_stack(database) as stack:
        run_id = _crash_with_hook(stack, "after-answer")

        # The product processed and answered; the answer died with the dispatcher.
        row = stack.step_row(run_id)
        assert row is not None
        assert row["state"] == "prepared"
        assert stack.processed(run_id) == 1

        _assert_abandoned_then_uncertain(stack, run_id, sent=1)


def test_killed_while_the_product_holds_the_request(database: DatabaseHandle) -> None:
    # One process per component, so only the dispatcher dies and the API stays up.
    with fault_stack(database) as stack:
        for component in ("auditd", "recovery", "admission", "gateway"):
            stack.start_component(component)
        dispatcher = stack.start_component("dispatcher", wait_ready=True)
        stack.fault("hang-after", count=1)
        run_id = stack.start_run()
        stack.wait_processed(run_id, 1)

        kill(dispatcher.pid)
        assert wait_exit(dispatcher, WAIT_SECONDS) == -9
        stack.stop(dispatcher)

        # Nothing is lost while no dispatcher runs: the run is still there, mid-call.
        assert stack.status(run_id)["state"] == "running"
        assert stack.call_step(run_id)["state"] == "prepared"

        stack.start_component("dispatcher")
        wait_until(stack.ready, "/ready with the new dispatcher", timeout=WAIT_SECONDS)
        assert stack.call_step(run_id)["state"] == "prepared"
        stack.advance(LEASE_SECONDS + 1)
        held = stack.wait_state(run_id, ("held", "succeeded", "failed"), "the abandoned run")
        assert held["state"] == "held", held
        assert held["attention"] is True
        step = stack.call_step(run_id)
        assert (step["state"], step.get("effect")) == ("uncertain", "unknown"), step

        # Let the held request go; a later run proves the dispatcher works and resent nothing.
        stack.clear_fault()
        stack.finish_barrier_run()
        assert stack.processed(run_id) == 1
        assert stack.received(run_id) == 1
        assert stack.step_row(run_id) == {
            "state": "uncertain",
            "effect": "unknown",
            "lease_owner": None,
            "command_key": stack.key_of(run_id),
            "attempts": 1,
        }
        assert CALL_STEP in {step["step"] for step in stack.inspection(run_id)["steps"]}
