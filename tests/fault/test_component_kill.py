"""kill -9 of any other component takes the whole all-in-one instance down, loudly, and a
restart finds every run (CONTRACT §2.1).
"""

from __future__ import annotations

import os

import pytest

from devstack.postgres import DatabaseHandle
from tests.helpers.faults import (
    COMPONENTS,
    WAIT_SECONDS,
    children_of,
    component_pid,
    fault_stack,
    kill,
    wait_exit,
)

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_component_stops_the_instance_and_loses_no_run(
    database: DatabaseHandle,
) -> None:
    with fault_stack(database) as stack:
        launcher = stack.start()
        runs = {stack.finish_barrier_run()}
        # One run held for an operator, too: a run that needs attention must survive as well.
        stack.fault("fail-after", count=1)
        held = stack.start_run("person-held")
        found = stack.wait_state(held, ("held", "succeeded", "failed"), "the held run")
        assert (found["state"], found["attention"]) == ("held", True), found
        runs.add(held)

        for victim in ("admission", "recovery", "gateway", "auditd"):
            pids = {name: component_pid(launcher, name) for name in COMPONENTS}
            assert len(children_of(launcher.pid)) == len(COMPONENTS)
            kill(pids[victim])

            status = wait_exit(launcher, WAIT_SECONDS)
            log = stack.log_of(launcher)
            stack.stop(launcher)
            assert status != 0, victim
            message = f"the {victim} component exited (status -9); stopped every component"
            assert message in log, log
            # The whole instance, not just the victim: no component outlives the launcher.
            assert [name for name, pid in pids.items() if _alive(pid)] == []

            launcher = stack.start()
            assert set(stack.run_ids()) == runs, victim
            assert stack.status(held)["state"] == "held"
            runs.add(stack.finish_barrier_run())

        assert set(stack.run_ids()) == runs
        assert len(runs) == 6
        assert stack.received(held) == 1
        assert all(stack.processed(run_id) == 1 for run_id in runs)
