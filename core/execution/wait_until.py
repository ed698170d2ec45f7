"""The decisions of a ``wait-until`` step (CONTRACT §9.4): the instant the timer is due, and
where the run goes when it comes. The dispatcher (:mod:`dispatcher.steps.wait_until`, which
stores the instant) and ``workflow simulate`` (which moves its clock to it) both decide
through these."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from core import clock
from core.execution.onward import onward
from core.execution.settlement import Failure, Settlement
from core.workflow.expr import MissingValue, Scope, render
from core.workflow.model import WaitUntilStep, Workflow
from core.workflow.schema import is_rfc3339

AT_POINTER: Final = "/at"


def instant_of(step: WaitUntilStep, scope: Scope) -> datetime | None:
    """The instant ``at`` names, or ``None`` when it does not evaluate to an RFC 3339 one."""
    if step.at is None:
        return None
    try:
        value = render(step.at, scope)
    except MissingValue:
        return None
    if not isinstance(value, str) or not is_rfc3339(value):
        return None
    return clock.parse_instant(value)


def due_at(step: WaitUntilStep, scope: Scope, now: datetime) -> datetime | Failure:
    """When the timer of a step reached at ``now`` is due: ``afterSeconds`` from then, or
    the instant ``at`` names. A value that is no instant fails the run ``mapping-invalid``
    at the step's ``at`` (the workflow was checked offline, but an input can still carry
    such a value); the failure names the field, never the value."""
    if step.after_seconds is not None:
        return now + timedelta(seconds=step.after_seconds)
    at = instant_of(step, scope)
    if at is None:
        return Failure("mapping-invalid", AT_POINTER)
    return at


def came(workflow: Workflow, scope: Scope, step: WaitUntilStep) -> Settlement:
    """The timer's instant has come: the run goes on at ``next``."""
    return Settlement.onward(onward(workflow, scope, step.next))
