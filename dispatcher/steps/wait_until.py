"""``wait-until``: a durable timer (CONTRACT §9.4).

The first time the step is worked on it stores its due instant — ``at`` evaluated, or
``afterSeconds`` from the database's now — and the run waits; an instant already past
continues at once. When the instant comes the claim loop finds the step due (it sleeps
until the earliest due instant it read) and the run continues at ``next``.

A timer on a step a cancel abandoned is not kept: the step ends cancelled.
"""

from __future__ import annotations

from core.execution.settlement import Settlement
from core.execution.steps import Reached, Sleep, reached
from core.execution.wait_until import came
from core.states import StepState
from core.workflow.model import WaitUntilStep
from dispatcher.claim import Claimed
from dispatcher.run_view import Loaded
from dispatcher.steps.base import Flight, StepEnv


async def execute(
    env: StepEnv, claimed: Claimed, loaded: Loaded, step: WaitUntilStep, flight: Flight, at: Reached
) -> None:
    """Start the timer, or continue once it is due."""
    # A cancel that abandoned the step meanwhile is met by each call below: step_settle and
    # step_wait end the step cancelled instead.
    if claimed.state == StepState.WAITING:
        # Claimed because the stored instant has come.
        await env.settler.conclude(claimed, came(at.workflow, at.scope, step))
        return
    decision = reached(step, at)
    if isinstance(decision, Sleep):
        await env.settler.wait(claimed, decision.until)
    else:
        assert isinstance(decision, Settlement)
        await env.settler.conclude(claimed, decision)
