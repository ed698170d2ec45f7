"""`make restore-rehearsal` as an operator runs it: every step, exit 0, duplicates 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


# About 35 s on an idle machine; the suite's 120 s default is too tight on two busy cores.
@pytest.mark.timeout(300)
def test_the_restore_rehearsal_recovers_every_run_without_a_duplicate() -> None:
    # A short folder: the coordinator's Unix socket paths must fit in about 100 bytes.
    state = Path(tempfile.mkdtemp(prefix="rh-"))
    result = subprocess.run(
        [sys.executable, "-m", "devstack.rehearsal"],
        cwd=ROOT,
        env={**os.environ, "COORDINATOR_REHEARSAL_STATE": str(state)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    shutil.rmtree(state, ignore_errors=True)
    assert result.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    for expected in (
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
    ):
        assert expected in output, expected
    # Nothing keeps running: no process still has the state folder on its command line.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(state)], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout.strip() == ""
