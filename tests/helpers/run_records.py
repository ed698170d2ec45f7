"""A run and its steps as records, for the unit tests of the documents built from them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from core.runs import RunRecord, StepRecord

T0 = datetime(2026, 5, 1, 9, 0, 0, 123456, tzinfo=UTC)

RUN = RunRecord(
    id="0b3f6a52-1d2c-8e4f-9a10-112233445566",
    workflow_id="approval-notice",
    workflow_version="1.2.0",
    package_digest="sha256:" + "ab" * 32,
    principal_iss="https://issuer.example.org",
    principal_sub="alice",
    state="running",
    outcome=None,
    attention=False,
    cancelling=False,
    failure_kind=None,
    failure_path=None,
    failure_step=None,
    created_at=T0,
    updated_at=T0 + timedelta(seconds=2),
    ended_at=None,
)


def step(seq: int, **changes: object) -> StepRecord:
    base = StepRecord(
        step_id=f"s{seq}",
        seq=seq,
        step_type="call",
        state="completed",
        attempts=1,
        effect=None,
        due_at=None,
        next_check_at=None,
        timeout_at=None,
        checks=0,
        started_at=T0 + timedelta(seconds=seq),
        ended_at=None,
    )
    return replace(base, **changes)  # type: ignore[arg-type]
