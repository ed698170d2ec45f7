"""``wait-until``: a durable timer (CONTRACT §9.4).

The first time the step is worked on it stores its due instant — ``at`` evaluated, or
``afterSeconds`` from the database's now — and the run waits; an instant already past
continues at once. When the instant comes the claim loop finds the step due (it sleeps
until the earliest due instant it read) and the run continues at ``next``.

A timer on a step a cancel abandoned is not kept: the step ends cancelled.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from core import clock
from core.states import StepState
from core.workflow.expr import MissingValue, Scope, render
from core.workflow.model import WaitUntilStep
from core.workflow.schema import is_rfc3339
from dispatcher.claim import Claimed
from dispatcher.onward import onward
from dispatcher.run_view import RunView
from dispatcher.steps.base import Flight, StepEnv
from dispatcher.tx import Failure, Settlement

AT_POINTER = "/at"


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


async def execute(
    env: StepEnv, claimed: Claimed, run: RunView, step: WaitUntilStep, flight: Flight
) -> None:
    """Start the timer, or continue once it is due."""
    at = instant_of(step, run.scope)
    # A cancel that abandoned the step meanwhile is met by each call below: step_settle and
    # step_wait end the step cancelled instead.
    if claimed.state == StepState.WAITING:
        # Claimed because the stored instant has come.
        await env.settler.conclude(
            claimed, Settlement.onward(onward(run.workflow, run.scope, step.next))
        )
        return
    now = claimed.now
    assert now is not None  # a claimed row carries the database's clock
    if step.after_seconds is not None:
        due = now + timedelta(seconds=step.after_seconds)
    elif at is not None:
        due = at
    else:
        # The workflow was checked offline, but an input can still carry a value that is
        # no instant; the failure names the step's field, never the value.
        await env.settler.conclude(
            claimed, Settlement.failing(Failure("mapping-invalid", AT_POINTER))
        )
        return
    if due <= now:
        await env.settler.conclude(
            claimed, Settlement.onward(onward(run.workflow, run.scope, step.next))
        )
    else:
        await env.settler.wait(claimed, due)
