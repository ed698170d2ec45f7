"""The ``retry`` member of an inspection step (CONTRACT §8.4), as recovery builds it from the
step's row and as it crosses gRPC (core/documents.py) member for member."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from core.db.statements import RunStepsRow
from core.documents import inspection_document, inspection_message
from core.rpc import coordinator_pb2 as pb
from core.runs import Holds, StepRecord, inspection_of
from recovery.reads import _with_cause, retry_of
from tests.helpers.run_records import RUN, T0

LAST = T0 + timedelta(minutes=3)
NEXT = LAST + timedelta(seconds=64)
DEADLINE = T0 + timedelta(hours=2)

RETRYING = RunStepsRow(
    step_id="send",
    seq=1,
    step_type="call",
    state="ready",
    attempts=4,
    effect=None,
    cause=None,
    cause_status=None,
    due_at=NEXT,
    next_check_at=None,
    timeout_at=None,
    checks=0,
    retry_cause="status-503",
    retry_status=503,
    retry_last_at=LAST,
    deadline_at=DEADLINE,
    started_at=T0,
    ended_at=None,
)


def shown(*rows: RunStepsRow) -> dict[str, Any]:
    """The inspection recovery answers for RUN with these step rows."""
    document = inspection_of(
        RUN, [StepRecord.from_row(row) for row in rows], Holds(False, False), []
    )
    by_id = {row.step_id: row for row in rows}
    document["steps"] = [_with_cause(step, by_id[step["step"]]) for step in document["steps"]]
    return document


def test_a_call_waiting_for_its_next_attempt_shows_what_the_last_one_met() -> None:
    [step] = shown(RETRYING)["steps"]
    assert step == {
        "step": "send",
        "type": "call",
        "state": "ready",
        "attempts": 4,
        "retry": {
            "lastCause": "status-503",
            "lastStatus": 503,
            "lastAttemptAt": "2026-05-01T09:03:00.123Z",
            "nextAttemptAt": "2026-05-01T09:04:04.123Z",
            "deadlineAt": "2026-05-01T11:00:00.123Z",
        },
        "startedAt": "2026-05-01T09:00:00.123Z",
    }
    assert list(step) == ["step", "type", "state", "attempts", "retry", "startedAt"]


def test_a_cause_comes_before_the_retry_and_a_missing_status_or_deadline_is_left_out() -> None:
    row = replace(
        RETRYING, cause="retrying", retry_cause="never-connected", retry_status=None,
        deadline_at=None,
    )  # fmt: skip
    [step] = shown(row)["steps"]
    assert list(step) == ["step", "type", "state", "attempts", "cause", "retry", "startedAt"]
    assert step["cause"] == "retrying"
    assert step["retry"] == {
        "lastCause": "never-connected",
        "lastAttemptAt": "2026-05-01T09:03:00.123Z",
        "nextAttemptAt": "2026-05-01T09:04:04.123Z",
    }


@pytest.mark.parametrize(
    "change",
    [
        {"state": "prepared"},  # its next attempt is on its way
        {"state": "completed", "ended_at": NEXT},
        {"retry_cause": None, "retry_status": None, "retry_last_at": None},  # never retried
    ],
)
def test_only_a_ready_call_with_a_retry_recorded_shows_one(change: dict[str, Any]) -> None:
    row = replace(RETRYING, **change)
    assert retry_of(row) is None
    [step] = shown(row)["steps"]
    assert "retry" not in step


@pytest.mark.parametrize(
    "row",
    [
        RETRYING,
        replace(RETRYING, cause="retrying"),
        replace(RETRYING, cause="tls-refused", retry_cause="tls-refused", retry_status=None),
        replace(RETRYING, retry_cause="token-refused", retry_status=None, deadline_at=None),
    ],
)
def test_a_retry_crosses_the_wire_member_for_member(row: RunStepsRow) -> None:
    document = shown(row, replace(RETRYING, step_id="later", seq=2, state="prepared"))
    message = pb.Inspection.FromString(inspection_message(document).SerializeToString())
    back = inspection_document(message)
    assert json.dumps(back) == json.dumps(document)
    assert "retry" in back["steps"][0] and "retry" not in back["steps"][1]
