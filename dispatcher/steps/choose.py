"""``choose``: continue at the first branch whose predicate holds, else at ``otherwise``.

A choice on a step a cancel abandoned decides nothing: the step ends cancelled.
"""

from __future__ import annotations

from core.workflow.model import ChooseStep
from dispatcher.claim import Claimed
from dispatcher.onward import onward, pick
from dispatcher.run_view import RunView
from dispatcher.steps.base import Flight, StepEnv
from dispatcher.tx import Tx


async def execute(
    env: StepEnv, claimed: Claimed, run: RunView, step: ChooseStep, flight: Flight
) -> None:
    """Decide and make the chosen step due, in one transaction."""
    target = pick(step, run.scope)
    if await env.settler.fast_advance(claimed, onward(run.workflow, run.scope, target)):
        return  # the common case, in one statement (with the local steps after it)

    async def advance(tx: Tx) -> None:
        if tx.abandoned:
            await tx.cancel()
            return
        await tx.advance(run.workflow, target)

    await env.settler.settle(claimed, advance)
