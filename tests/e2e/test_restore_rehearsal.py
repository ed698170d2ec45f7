"""`make restore-rehearsal` as an operator runs it: every step, exit 0, duplicates 0."""

from __future__ import annotations

import pytest

from tests.helpers.devstack_kit import run_walkthrough

pytestmark = [pytest.mark.slow]


# About 35 s on an idle machine; the suite's 120 s default is too tight on two busy cores.
@pytest.mark.timeout(300)
def test_the_restore_rehearsal_recovers_every_run_without_a_duplicate() -> None:
    run_walkthrough(
        "devstack.rehearsal",
        "COORDINATOR_REHEARSAL_STATE",
        (
            "coordinatorctl restore-hold",
            "coordinatorctl reconcile",
            "coordinator.restore.unresolved",
            "coordinator.restore.review-required",
            "coordinatorctl complete-execution-recovery",
            "coordinatorctl release-restore-hold",
            "coordinatorctl retry-same",
            "coordinatorctl release-admission-hold",
            '"result": "not-sent"',
            "duplicates: 0",
            "restore rehearsal: consistent",
        ),
    )
