"""What an operator's action on a held call may do (CONTRACT §10.1, §10.2), decided alike
for a deployment's run (recovery) and for a scripted one (``workflow simulate``)."""

from __future__ import annotations

from datetime import datetime

from core.workflow.catalogue import DAY, Operation


def reconcile_unsupported(op: Operation, product: str) -> str | None:
    """Why reconcile cannot settle a call of ``op`` from a receipt; None when it can."""
    if op.has_receipts:
        return None
    return f"{product} keeps no receipts of {op.name}; retry the same command or cancel the run"


def _window(seconds: int) -> str:
    if seconds % DAY == 0 and seconds >= 2 * DAY:
        return f"{seconds // DAY} days"
    return f"{seconds // 3600} h"


def retry_same_refusal(
    op: Operation,
    product: str,
    *,
    first_attempt_at: datetime,
    deadline_at: datetime | None,
    now: datetime,
) -> str | None:
    """Why the held call may not be resent under its key now; None when it may: the
    product's idempotency window since the first attempt is over, or the step's deadline
    has passed."""
    if (now - first_attempt_at).total_seconds() > op.retry_same_seconds:
        return (
            f"{product} keeps idempotency keys for {_window(op.retry_same_seconds)} after the "
            "first attempt, and that time has passed; resending now could act twice"
        )
    if deadline_at is not None and now >= deadline_at:
        return "the step's deadline passed"
    return None
