"""``finish``: the run ends with one of its declared outcomes.

A finish is settled by ``step_settle`` like every other step's end, whether it is claimed on
its own or reached on the way from a step before it (:mod:`dispatcher.onward`). A finish a
cancel abandoned never runs: its outcome was not reached, so the step ends cancelled (and
the run with it when the cancel has no onCancel path). A finish on the onCancel path ends
the run cancelled with its outcome.
"""

from __future__ import annotations

from core.workflow.model import FinishStep
from dispatcher.claim import Claimed
from dispatcher.run_view import RunView
from dispatcher.steps.base import Flight, StepEnv
from dispatcher.tx import Settlement


async def execute(
    env: StepEnv, claimed: Claimed, run: RunView, step: FinishStep, flight: Flight
) -> None:
    """End the run (succeeded; cancelled when a cancel path led here) with the outcome."""
    await env.settler.conclude(claimed, Settlement.finishing(step.outcome))
