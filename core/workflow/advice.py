"""Warnings about a valid workflow: things it is allowed to say but that an operator will
likely regret. ``coordinatorctl workflow check`` prints them; they never refuse a workflow.

One rule today. retry-same is refused once a call's ``deadlineSeconds`` has passed (CONTRACT
§10.2), the same bound as the automatic retries. For a product that keeps no receipts
(Casework review requests, BReg Actions) retry-same or cancel is the only way an operator
can settle a call whose effect is unknown, so a deadline shorter than an hour leaves them
minutes to do it: at the default of 300 s, a call that became uncertain at night can only be
cancelled by morning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from core.workflow.catalogue import operation
from core.workflow.model import CallStep, Workflow

SHORT_DEADLINE_SECONDS: Final = 3600
"""A call without receipts whose deadline is shorter than this gets a warning."""


@dataclass(frozen=True)
class Advice:
    """One warning: the key path in the workflow it is about, and what to consider."""

    path: str
    message: str


def advise(workflow: Workflow) -> list[Advice]:
    """The warnings about ``workflow``, in step order."""
    found: list[Advice] = []
    for step_id, step in workflow.steps.items():
        if not isinstance(step, CallStep):
            continue
        kind = workflow.connections.get(step.connection)
        op = operation(kind, step.operation) if kind is not None else None
        if op is None or op.has_receipts or step.deadline_seconds >= SHORT_DEADLINE_SECONDS:
            continue
        found.append(
            Advice(
                f"steps.{step_id}.call.deadlineSeconds",
                f"{step.deadline_seconds} s is under an hour for {kind} {op.name}, which keeps"
                " no receipts: once it passes, an operator can no longer retry-same a call"
                " whose effect is unknown, only cancel the run",
            )
        )
    return found
