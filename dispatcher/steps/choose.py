"""``choose``: continue at the first branch whose predicate holds, else at ``otherwise``.

A choice on a step a cancel abandoned decides nothing: the step ends cancelled.
"""

from __future__ import annotations

from core.workflow.expr import holds
from core.workflow.model import ChooseStep, step_kind
from dispatcher.claim import Claimed
from dispatcher.run_view import RunView
from dispatcher.steps.base import Flight, StepEnv
from dispatcher.tx import Tx


def pick(step: ChooseStep, run: RunView) -> str:
    """The step a choose continues at."""
    for branch in step.branches:
        if holds(branch.when, run.scope):
            return branch.next
    return step.otherwise


async def execute(
    env: StepEnv, claimed: Claimed, run: RunView, step: ChooseStep, flight: Flight
) -> None:
    """Decide and make the chosen step due, in one transaction."""
    target = pick(step, run)
    kind = step_kind(run.workflow.step(target))
    if await env.settler.fast_advance(claimed, target, kind):
        return  # the common case, in one statement

    async def advance(tx: Tx) -> None:
        if tx.abandoned:
            await tx.cancel()
            return
        await tx.advance(run.workflow, target)

    await env.settler.settle(claimed, advance)
