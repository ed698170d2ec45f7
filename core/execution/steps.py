"""One table of step kinds: what a step comes to when a run reaches it.

Every room that runs steps asks :func:`reached` about a step it has in hand — the
dispatcher (``dispatcher/steps/``) against the products, ``workflow simulate`` against a
script — and acts on the answer, a :data:`Decision`:

- a :class:`~core.execution.settlement.Settlement`: the step ends as it says (a ``choose``
  or a ``finish``, a timer already past, a value that cannot be made, ...);
- :class:`Send`: a call's command and request are ready: commit them as prepared, send,
  and end the step with :func:`core.execution.call.answered` on the answer;
- :class:`Watch`: a wait-for reads the result with this identity until
  :func:`core.execution.wait_for.decided` or :func:`~core.execution.wait_for.timed_out`;
- :class:`Sleep`: a wait-until waits for its instant, then ends with
  :func:`core.execution.wait_until.came`.

Which kind a step is matters only here, in :data:`STEPS`: a room dispatches on the closed
set of decisions (the work only it can do), never on the step's type. Nothing here does
I/O, reads a clock or a secret: what a decision needs comes in :class:`Reached`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from core.bindings import Binding
from core.codes import Code
from core.errors import CoordinatorError
from core.execution import call, wait_for, wait_until
from core.execution.onward import onward, pick
from core.execution.settlement import Failure, Settlement
from core.workflow import catalogue
from core.workflow.expr import Scope
from core.workflow.model import (
    CallStep,
    ChooseStep,
    FinishStep,
    Step,
    WaitForStep,
    WaitUntilStep,
    Workflow,
    step_kind,
)


@dataclass(frozen=True)
class Reached:
    """A step as the room that runs it has it in hand."""

    workflow: Workflow
    scope: Scope
    """What the step's expressions can read: the input and the values kept so far."""
    now: datetime
    """When the run reached the step (the database's clock, or the simulation's)."""
    bindings: Mapping[str, Binding] = field(default_factory=dict)
    """The run's binding of each connection, by connection name."""
    key: str | None = None
    """A call's command key."""
    stored: Any = None
    """A call's command stored by an earlier attempt, sent again as it is."""


@dataclass(frozen=True)
class Send:
    """A call's command is made: commit it as prepared before a byte of it leaves."""

    step: CallStep
    built: call.Built


@dataclass(frozen=True)
class Watch:
    """A wait-for reads the catalogued result whose ``field`` is ``identity``."""

    step: WaitForStep
    result: catalogue.Result
    field: str
    identity: str


@dataclass(frozen=True)
class Sleep:
    """A wait-until's instant is still to come."""

    step: WaitUntilStep
    until: datetime


Decision = Settlement | Send | Watch | Sleep


def binding_of(step: CallStep | WaitForStep, at: Reached) -> Binding:
    """The run's binding of the step's connection; ``binding.live-conflict`` when it has
    none (a run always records one for each connection its workflow names)."""
    binding = at.bindings.get(step.connection)
    if binding is None:
        raise CoordinatorError(
            Code.BINDING_CONFLICT, f"the run has no binding for connection '{step.connection}'"
        )
    return binding


def _call(step: CallStep, at: Reached) -> Decision:
    assert at.key is not None  # a call is always reached with its command key
    built = call.build_request(at.workflow, step, at.scope, binding_of(step, at), at.key, at.stored)
    if isinstance(built, Failure):
        return Settlement.failing(built)
    return Send(step, built)


def _choose(step: ChooseStep, at: Reached) -> Decision:
    return Settlement.onward(onward(at.workflow, at.scope, pick(step, at.scope)))


def _finish(step: FinishStep, at: Reached) -> Decision:
    return Settlement.finishing(step.outcome)


def _wait_until(step: WaitUntilStep, at: Reached) -> Decision:
    due = wait_until.due_at(step, at.scope, at.now)
    if isinstance(due, Failure):
        return Settlement.failing(due)
    if due <= at.now:
        return wait_until.came(at.workflow, at.scope, step)
    return Sleep(step, due)


def _wait_for(step: WaitForStep, at: Reached) -> Decision:
    kind = at.workflow.connections[step.connection]
    result = catalogue.result(kind, step.result)
    if result is None or len(result.identifying) != 1:
        # The checker refuses a wait-for on a result the catalogue lacks; a package that
        # still names one cannot be waited on.
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"{kind} has no result {step.result!r} to wait for"
        )
    field = result.identifying[0].name
    identity = wait_for.identity_of(step, field, at.scope)
    if isinstance(identity, Failure):
        return Settlement.failing(identity)
    return Watch(step, result, field, identity)


STEPS: Final[Mapping[str, Callable[[Any, Reached], Decision]]] = MappingProxyType(
    {
        "call": _call,
        "choose": _choose,
        "finish": _finish,
        "wait-until": _wait_until,
        "wait-for": _wait_for,
    }
)
"""Each step kind (``step_kind``) and what it comes to when a run reaches it."""


def reached(step: Step, at: Reached) -> Decision:
    """What ``step`` comes to when its run reaches it (see the module docstring)."""
    return STEPS[step_kind(step)](step, at)
