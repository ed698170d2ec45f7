"""The decisions of a ``call`` step (CONTRACT §9.3): the command and the request that
carries it, and what a classified answer makes of the step and the run. The dispatcher
(:mod:`dispatcher.steps.call`, which sends), ``workflow simulate`` (which answers from a
script) and an operator's reconcile (which answers from the product's receipt) all decide
through these."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.bindings import Binding
from core.execution.adapters import ProductRequest, RequestUnbuildable, adapter_for
from core.execution.classify import ACCEPTED, NOT_SENDABLE, REFUSED, Classified
from core.execution.onward import Onward, onward
from core.execution.settlement import Failure, Settlement
from core.states import Effect, StepState
from core.workflow.catalogue import Operation
from core.workflow.expr import Scope
from core.workflow.mapping import map_command, map_output
from core.workflow.model import CallStep, Workflow

Way = Callable[[Workflow, Scope, str], Onward]
"""How a run goes on from the step a settled one continues at."""


def direct(workflow: Workflow, scope: Scope, start: str) -> Onward:
    """Straight to ``start``, made due as it is: nothing on the way is decided here."""
    return Onward.direct(workflow, start)


@dataclass(frozen=True)
class Built:
    """A call's command, the request that sends it, and the operation it calls."""

    command: Any
    request: ProductRequest
    operation: Operation


def build_request(
    workflow: Workflow,
    step: CallStep,
    scope: Scope,
    binding: Binding,
    key: str,
    stored: Any = None,
) -> Built | Failure:
    """The command of ``step`` (``stored``, or mapped from ``scope`` and checked against the
    operation's command schema) and its request under ``key``; the ``invalid-command``
    failure with its pointer when either cannot be made."""
    adapter = adapter_for(workflow.connections[step.connection])
    op = adapter.operation(step.operation)
    if stored is not None:
        command = stored
    else:
        mapped = map_command(op, step.input, scope)
        if not mapped.ok:
            return Failure("invalid-command", mapped.failure_path)
        command = mapped.value
    try:
        request = adapter.build(op, binding, command, key)
    except RequestUnbuildable as unbuildable:
        return Failure("invalid-command", unbuildable.pointer)
    return Built(command, request, op)


def answered(
    workflow: Workflow,
    scope: Scope,
    step: CallStep,
    op: Operation,
    result: Classified,
    way: Way = onward,
) -> Settlement | None:
    """How a classified answer ends the step and where the run goes, for the answers whose
    ending needs nothing decided under the step's lock (accepted, refused, unsendable);
    ``None`` for retryable and uncertain ones, which the dispatcher hands to ``step_retry``
    and ``step_make_uncertain``. ``way`` finds the run's way on from the step it continues
    at: through the local steps after it (:func:`~core.execution.onward.onward`, the
    dispatcher's and the simulator's), or straight to it (:func:`direct`: an operator's
    reconcile, which executes nothing)."""
    response = result.response
    if result.result == ACCEPTED:
        mapped = map_output(op, step.output, scope, response)
        if not mapped.ok:
            return Settlement.failing(
                Failure("mapping-invalid", mapped.failure_path),
                effect=Effect.ACCEPTED,
                keep={"response": response},
            )
        # The run goes on with the output it keeps, through the local steps after the call.
        kept = mapped.value
        steps = {**scope.steps, step.id: kept} if isinstance(kept, dict) else scope.steps
        return Settlement.onward(
            way(workflow, dataclasses.replace(scope, steps=steps), step.next),
            effect=Effect.ACCEPTED,
            keep={"response": response, "output": kept},
        )
    if result.result == REFUSED:
        if step.on_refused is not None:
            return Settlement.onward(way(workflow, scope, step.on_refused), state=StepState.REFUSED)
        return Settlement.failing(Failure("refused"), state=StepState.REFUSED)
    if result.result == NOT_SENDABLE:
        # Refused here before a byte was written: never sent, and it never could be.
        return Settlement.failing(Failure("invalid-command", ""))
    return None
