"""`make quickstart` as a new user runs it: every stage, exit 0, nothing left running; then
`coordinatorctl audit verify` on the journal it wrote, and on a copy with one byte changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.devstack_kit import run_walkthrough

CTL = Path(sys.executable).with_name("coordinatorctl")


def verify(journal: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CTL), "audit", "verify", "--audit-file", str(journal), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def check_the_journal(state: Path) -> None:
    (journal,) = state.glob("**/deployment/audit.jsonl")
    good = verify(journal)
    assert good.returncode == 0, good.stderr
    intact = json.loads(good.stdout)
    lines = journal.read_bytes().splitlines(keepends=True)
    assert intact["records"] == intact["lastSeq"] == len(lines) >= 3
    # One byte of the second record changed (an outcome's letter): the chain breaks at the
    # record after it, which the refusal names.
    second = json.loads(lines[1])
    position = lines[1].index(b'"outcome":"') + len(b'"outcome":"')
    changed = bytearray(lines[1])
    changed[position] = ord("z") if changed[position] != ord("z") else ord("y")
    copy = state / "audit-changed.jsonl"
    copy.write_bytes(b"".join([lines[0], bytes(changed), *lines[2:]]))
    bad = verify(copy)
    assert bad.returncode == 1
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("coordinator.audit.journal-broken: ")
    assert f"seq {second['seq'] + 1} (line 3): prev is not the hash of record 2" in last


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
            "coordinatorctl audit verify --audit-file",
            "hash chain intact",
            "coordinator exited with status 0",
        ),
        afterwards=check_the_journal,
    )
