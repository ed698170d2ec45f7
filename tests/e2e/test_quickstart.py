"""`make quickstart` as a new user runs it: every stage, exit 0, nothing left running."""

from __future__ import annotations

from tests.helpers.devstack_kit import run_walkthrough


def test_the_quickstart_runs_the_approval_workflow_end_to_end() -> None:
    run_walkthrough(
        "devstack.quickstart",
        "COORDINATOR_QUICKSTART_STATE",
        (
            "runtime.yaml apply",
            "runtime.yaml deployment-status",
            "status: checked",
            "state: succeeded",
            "outcome: approved",
            "messageId=msg-",
            "hash chain intact",
            "coordinator exited with status 0",
        ),
    )
