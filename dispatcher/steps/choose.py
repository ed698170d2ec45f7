"""``choose``: continue at the first branch whose predicate holds, else at ``otherwise``.

The choice is settled as a call's answer is: the step ends and the run goes on through the
local steps it can decide from its values (:mod:`dispatcher.onward`), in one call. A choice
on a step a cancel abandoned decides nothing: ``step_settle`` ends it cancelled.
"""

from __future__ import annotations

from core.workflow.model import ChooseStep
from dispatcher.claim import Claimed
from dispatcher.onward import onward, pick
from dispatcher.run_view import RunView
from dispatcher.steps.base import Flight, StepEnv
from dispatcher.tx import Settlement


async def execute(
    env: StepEnv, claimed: Claimed, run: RunView, step: ChooseStep, flight: Flight
) -> None:
    """Decide and make the chosen step due, in one transaction."""
    way = onward(run.workflow, run.scope, pick(step, run.scope))
    await env.settler.conclude(claimed, Settlement.onward(way))
