"""``finish``: the run ends with one of its declared outcomes.

A finish a cancel abandoned never runs: its outcome was not reached, so the step ends
cancelled (and the run with it when the cancel has no onCancel path). A finish on the
onCancel path ends the run cancelled with its outcome.
"""

from __future__ import annotations

from core.states import RunState, StepState
from core.workflow.model import FinishStep
from dispatcher.claim import Claimed
from dispatcher.run_view import RunView
from dispatcher.steps.base import Flight, StepEnv
from dispatcher.tx import Tx


async def execute(
    env: StepEnv, claimed: Claimed, run: RunView, step: FinishStep, flight: Flight
) -> None:
    """End the run (succeeded; cancelled when a cancel path led here) with the outcome."""
    if await env.settler.fast_end_run(
        claimed, step_state=StepState.COMPLETED, run_state=RunState.SUCCEEDED, outcome=step.outcome
    ):
        return  # the common case, in one statement

    async def finish(tx: Tx) -> None:
        if tx.abandoned:
            await tx.cancel()
            return
        await tx.end_run(
            step_state=StepState.COMPLETED, run_state=RunState.SUCCEEDED, outcome=step.outcome
        )

    await env.settler.settle(claimed, finish)
