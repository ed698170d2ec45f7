"""The status and inspection documents and list cursors (core/runs.py), from records."""

from __future__ import annotations

import base64
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from core.clock import timestamp
from core.errors import CoordinatorError
from core.runs import (
    Cursor,
    Holds,
    OperatorActionRecord,
    inspection_of,
)
from tests.helpers.run_records import RUN, T0, step


def test_timestamps_are_utc_milliseconds_with_z() -> None:
    assert timestamp(T0) == "2026-05-01T09:00:00.123Z"
    plus_two = timezone(timedelta(hours=2))
    assert timestamp(datetime(2026, 5, 1, 11, 0, 0, 5000, tzinfo=plus_two)) == (
        "2026-05-01T09:00:00.005Z"
    )
    with pytest.raises(ValueError):
        timestamp(datetime(2026, 5, 1))


def test_a_running_run_shows_only_the_members_that_apply() -> None:
    assert RUN.status() == {
        "runId": RUN.id,
        "workflow": {"id": "approval-notice", "version": "1.2.0", "digest": RUN.package_digest},
        "state": "running",
        "attention": False,
        "createdAt": "2026-05-01T09:00:00.123Z",
        "updatedAt": "2026-05-01T09:00:02.123Z",
    }


def test_an_ended_run_shows_outcome_failure_and_end() -> None:
    ended = T0 + timedelta(minutes=1)
    succeeded = replace(RUN, state="succeeded", outcome="approved", ended_at=ended)
    assert succeeded.status()["outcome"] == "approved"
    assert succeeded.status()["endedAt"] == "2026-05-01T09:01:00.123Z"
    assert "failure" not in succeeded.status()

    failed = replace(
        RUN,
        state="failed",
        failure_kind="invalid-command",
        failure_path="/recipientRef",
        failure_step="send-approval",
        ended_at=ended,
    )
    assert failed.status()["failure"] == {
        "kind": "invalid-command",
        "failurePath": "/recipientRef",
        "step": "send-approval",
    }
    refused = replace(failed, failure_kind="refused", failure_path=None)
    assert refused.status()["failure"] == {"kind": "refused", "step": "send-approval"}


def test_cancelling_shows_only_while_the_run_is_live() -> None:
    assert RUN.status().get("cancelling") is None
    assert replace(RUN, cancelling=True).status()["cancelling"] is True
    ended = replace(RUN, cancelling=True, state="cancelled", ended_at=T0)
    assert "cancelling" not in ended.status()


def test_steps_show_effects_and_waits() -> None:
    due = T0 + timedelta(hours=1)
    steps = [
        step(
            3,
            step_type="wait-for",
            state="waiting",
            due_at=due,
            next_check_at=due,
            timeout_at=due + timedelta(days=14),
            checks=4,
        ),
        step(1, effect="accepted", ended_at=T0 + timedelta(seconds=5)),
        step(2, step_type="wait-until", state="waiting", due_at=due),
        step(4, state="uncertain", effect="unknown", attempts=2),
    ]
    doc = inspection_of(
        RUN,
        steps,
        Holds(execution=True, admission=False),
        [OperatorActionRecord("reconcile", "INC-7", T0)],
    )
    assert [entry["step"] for entry in doc["steps"]] == ["s1", "s2", "s3", "s4"]
    first, timer, result_wait, uncertain = doc["steps"]
    assert first == {
        "step": "s1",
        "type": "call",
        "state": "completed",
        "attempts": 1,
        "effect": "accepted",
        "startedAt": "2026-05-01T09:00:01.123Z",
        "endedAt": "2026-05-01T09:00:05.123Z",
    }
    assert timer["wait"] == {"dueAt": "2026-05-01T10:00:00.123Z", "checks": 0}
    assert result_wait["wait"] == {
        "nextCheckAt": "2026-05-01T10:00:00.123Z",
        "timeoutAt": "2026-05-15T10:00:00.123Z",
        "checks": 4,
    }
    assert uncertain["effect"] == "unknown" and "wait" not in uncertain
    assert doc["holds"] == {"execution": True, "admission": False}
    assert doc["lastOperatorActions"] == [
        {"kind": "reconcile", "reason": "INC-7", "at": "2026-05-01T09:00:00.123Z"}
    ]
    assert doc["runId"] == RUN.id and doc["state"] == "running"


def test_cursors_round_trip_with_microseconds() -> None:
    cursor = Cursor(T0, RUN.id)
    text = cursor.encode()
    assert "=" not in text and RUN.id not in text
    assert Cursor.decode(text) == cursor


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not base64!",
        base64.urlsafe_b64encode(b"nodot").decode(),
        base64.urlsafe_b64encode(b"12.bad id").decode(),
        base64.urlsafe_b64encode(b"99999999999999999999.x").decode(),
        "é",
        "A" * 300,
    ],
)
def test_foreign_cursors_are_request_invalid(text: str) -> None:
    with pytest.raises(CoordinatorError) as caught:
        Cursor.decode(text)
    assert caught.value.code == "request.invalid"
