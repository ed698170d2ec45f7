"""``choose`` and ``finish``: steps decided from the run's values alone.

A ``choose`` continues at the first branch whose predicate holds, else at ``otherwise``; a
``finish`` ends the run with one of its declared outcomes (cancelled with it, when a cancel
path led there). Most are never claimed: the settle of the step before them records them on
the way (:mod:`core.execution.onward`). One is claimed on its own when that way stopped
short of it — under the execution hold, after a longer stretch of chooses, or when its
predicate could not be evaluated then — and is settled here like any other step's end, in
one call of ``step_settle``. On a step a cancel abandoned nothing is decided: ``step_settle``
ends it cancelled (and the run with it when the cancel has no onCancel path). A predicate
that cannot be evaluated raises, and the step is tried again later like any step whose
execution failed.
"""

from __future__ import annotations

from core.execution.settlement import Settlement
from core.execution.steps import Reached, reached
from core.workflow.model import ChooseStep, FinishStep
from dispatcher.claim import Claimed
from dispatcher.run_view import Loaded
from dispatcher.steps.base import Flight, StepEnv


async def execute(
    env: StepEnv,
    claimed: Claimed,
    loaded: Loaded,
    step: ChooseStep | FinishStep,
    flight: Flight,
    at: Reached,
) -> None:
    """Decide the step and settle it with all that follows, in one call."""
    decision = reached(step, at)
    assert isinstance(decision, Settlement)  # a local step ends when it is decided
    await env.settler.conclude(claimed, decision)
