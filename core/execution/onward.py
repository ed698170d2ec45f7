"""The local steps a settled step leads through: worked out in the dispatcher, recorded in
the statement that settles the step before them.

A ``choose`` reads nothing but the run's values and a ``finish`` needs nothing at all, so
when a step's outcome is known together with the values it kept, the dispatcher can decide
what those steps would decide right away. The call that settles the step (``step_settle``)
then records them as reached and completed and makes the first step that does need work (a
call, a wait) due, or ends the run with the finish's outcome: one call takes a run from one
product answer to its next piece of real work, with no claim, read or transaction for the
steps between. The rows written are those the steps would have written on their own.

When the first step that needs work is a call whose command can be made then, the
dispatcher's settle prepares it too (``step_settle`` given the call's command,
:mod:`dispatcher.steps.call`).

``step_settle`` records them only where they would run: not for a step a cancel abandoned
(nothing follows it), not under the execution hold (the first of them is made due and waits
for the hold to end).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.workflow.expr import Scope, holds
from core.workflow.model import ChooseStep, FinishStep, Workflow, step_kind

# A bound on the steps one settle records besides its own; a longer stretch of chooses is
# continued by a dispatcher claiming the step where it stopped.
MAX_LOCAL_STEPS = 16


def branch_taken(step: ChooseStep, scope: Scope) -> int | None:
    """The index of the first branch whose predicate holds; ``None`` for ``otherwise``."""
    for index, branch in enumerate(step.branches):
        if holds(branch.when, scope):
            return index
    return None


def pick(step: ChooseStep, scope: Scope) -> str:
    """The step a choose continues at: the first branch whose predicate holds."""
    index = branch_taken(step, scope)
    return step.otherwise if index is None else step.branches[index].next


@dataclass(frozen=True)
class Onward:
    """Where a run goes from a settled step."""

    passed: tuple[tuple[str, str], ...]
    """The local steps reached and completed on the way, in order: (step id, type)."""
    next_step: str | None
    """The step made due next; ``None`` when the last of ``passed`` is a finish."""
    next_kind: str | None
    outcome: str | None
    """The finish's outcome, when the run ends."""

    @classmethod
    def direct(cls, workflow: Workflow, step_id: str) -> Onward:
        """Straight to ``step_id``, made due as it is (a choose or finish there is claimed
        on its own)."""
        return cls((), step_id, step_kind(workflow.step(step_id)), None)

    @property
    def step_ids(self) -> list[str]:
        return [step_id for step_id, _ in self.passed]

    @property
    def step_types(self) -> list[str]:
        return [kind for _, kind in self.passed]


def onward(workflow: Workflow, scope: Scope, start: str) -> Onward:
    """The run's way from ``start`` (the step a settled one continues at) through the local
    steps that can be decided now, to the first step that needs a dispatcher or to a finish.

    A choose whose predicate cannot be evaluated here stops the way: it is made due, and
    the dispatcher that claims it meets the problem as it would have anyway.
    """
    passed: list[tuple[str, str]] = []
    current = start
    for _ in range(MAX_LOCAL_STEPS):
        step = workflow.step(current)
        if isinstance(step, FinishStep):
            passed.append((current, "finish"))
            return Onward(tuple(passed), None, None, step.outcome)
        if not isinstance(step, ChooseStep):
            break
        try:
            target = pick(step, scope)
        except Exception:  # the claimed choose reports it the usual way
            break
        passed.append((current, "choose"))
        current = target
    return Onward(tuple(passed), current, step_kind(workflow.step(current)), None)
