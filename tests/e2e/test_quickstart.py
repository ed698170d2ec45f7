"""`make quickstart` as a new user runs it: every stage, exit 0, nothing left running."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quickstart_runs_the_approval_workflow_end_to_end() -> None:
    # A short folder: the coordinator's Unix socket paths must fit in 107 bytes.
    state = Path(tempfile.mkdtemp(prefix="qs-"))
    result = subprocess.run(
        [sys.executable, "-m", "devstack.quickstart"],
        cwd=ROOT,
        env={**os.environ, "COORDINATOR_QUICKSTART_STATE": str(state)},
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
        "runtime.yaml apply",
        "runtime.yaml deployment-status",
        "status: checked",
        "state: succeeded",
        "outcome: approved",
        "messageId=msg-",
        "hash chain intact",
        "coordinator exited with status 0",
    ):
        assert expected in output, expected
    # Nothing keeps running: no process still has the state folder on its command line.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(state)], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout.strip() == ""
