"""``coordinatorctl workflow simulate``: a workflow run offline against scripted answers.

The simulator is not a second interpreter. Each step is decided by the code every room that
runs steps shares, :mod:`core.execution`: a call's command is mapped and its request built by
:func:`core.execution.call.build_request` under the key :func:`core.derive.command_key`
derives; the scripted answer is classified by :mod:`core.execution.classify` and settled by
:func:`core.execution.call.answered` (retries by :func:`core.execution.classify.retry_wait`
and :func:`core.execution.settlement.misses_deadline`); a ``choose`` and the local steps
after a settled step go through :mod:`core.execution.onward`; a ``wait-for`` reads its
identity with :func:`core.execution.wait_for.identity_of`, its scripted decision through
:func:`core.execution.wait_for.interpret`, and ends by
:func:`~core.execution.wait_for.decided` or :func:`~core.execution.wait_for.timed_out`; a
``wait-until`` finds its instant with :func:`core.execution.wait_until.due_at`.

What stands in for the database here is small and written out below: the simulated clock,
the run's kept values, the one resend after a 401, a cancel that abandons the step the run
has reached and continues at ``onCancel``, and the run's end. It reads no secret and
contacts nothing: the admission key is :data:`SIMULATION_KEY`, a fixed, public value, so
the run id and the command keys shown are the simulation's, never a deployment's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final

from cli.simulation_script import CallAnswer, Script, refuse
from core import clock, derive
from core.bindings import Binding
from core.canonical import canonical_json
from core.execution import wait_for
from core.execution.call import Built, answered, direct
from core.execution.classify import (
    ACCEPTED,
    REFUSED,
    RETRYABLE,
    UNCERTAIN,
    Classified,
    retry_wait,
)
from core.execution.onward import branch_taken
from core.execution.operator import reconcile_unsupported, retry_same_refusal
from core.execution.settlement import Failure, Settlement, misses_deadline
from core.execution.steps import Decision, Reached, Send, Sleep, Watch, reached
from core.execution.wait_until import came
from core.products.http import (
    UNREADABLE_ANSWER,
)
from core.products.receipts import (
    EXPIRED,
    FOUND,
    NOT_SEEN,
    UNAVAILABLE,
    Receipt,
    classify_receipt,
)
from core.states import RunState, StepState
from core.workflow.catalogue import connection_type
from core.workflow.expr import Scope, predicate_refs, read_value
from core.workflow.graph import CANCEL, START
from core.workflow.model import (
    CallStep,
    ChooseStep,
    Step,
    WaitForStep,
    Workflow,
    step_kind,
)

SIMULATION_KEY: Final = hashlib.sha256(b"registry-coordinator workflow simulate v1").digest()
"""The admission key of every simulation: public, fixed, never a deployment's."""
SIMULATION_ISSUER: Final = "https://issuer.simulation.invalid"
SIMULATION_SUBJECT: Final = "simulation"
SIMULATION_IDEMPOTENCY_KEY: Final = "simulation"
SIMULATION_PROFILE: Final = "simulation"
"""The ``profile`` (and Casework ``producer``) of every simulated connection."""

_MAX_ATTEMPTS: Final = 1000
"""More attempts or steps than any checked workflow and script can take."""


# ------------------------------------------------------------------------------------ the run


@dataclass
class Event:
    """One step on the run's path, every decision in it as data."""

    step: str
    type: str
    at: str
    """When the run reached the step."""
    state: str
    """The step's state after it (completed, refused, failed, uncertain, cancelled)."""
    ended_at: str | None = None
    """When the step ended (None while it is left undecided)."""
    request: dict[str, Any] | None = None
    """A call's request: method, url, key (Idempotency-Key) and body."""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """A call's exchanges: the answer, its classification, the next attempt's instant."""
    branch: int | str | None = None
    """A choose's branch: its index, or ``otherwise``."""
    next: str | None = None
    """Where a choose continues."""
    read: dict[str, Any] | None = None
    """The values a choose's predicates read (reference -> value, null for nothing)."""
    fired: dict[str, Any] | None = None
    """Why and when a wait ended (``due``, ``decision``, ``timeout``) or a cancel came."""
    decision: dict[str, Any] | None = None
    """The decision a wait-for kept."""
    ignored: dict[str, Any] | None = None
    """A scripted decision that came after the wait's timeout: ``{at}``, never kept."""
    kept: dict[str, Any] | None = None
    """The values the step kept for later steps (a call's output)."""
    outcome: str | None = None
    """A finish's outcome."""
    held: dict[str, Any] | None = None
    """An uncertain call: ``{cause}``; the run is held for an operator."""
    failure: dict[str, Any] | None = None
    """How the step failed: ``{kind, failurePath?}``."""
    undecided: str | None = None
    """Why a step could not be decided (the exception's name)."""
    operator: dict[str, Any] | None = None
    """An operator's action on the held step: ``{action, at, receipt?, refused?, detail?}``."""

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "type": self.type, "at": self.at}
        for name, value in (
            ("endedAt", self.ended_at),
            ("request", self.request),
            ("attempts", self.attempts or None),
            ("branch", self.branch),
            ("next", self.next),
            ("read", self.read),
            ("fired", self.fired),
            ("decision", self.decision),
            ("ignored", self.ignored),
            ("kept", self.kept),
            ("outcome", self.outcome),
            ("held", self.held),
            ("failure", self.failure),
            ("undecided", self.undecided),
            ("operator", self.operator),
        ):
            if value is not None:
                out[name] = value
        out["state"] = self.state
        return out


@dataclass(frozen=True)
class Taken:
    """One way out of a step the run took: an edge of the workflow's graph (the source,
    kind and branch of :class:`core.workflow.graph_model.Edge`), or a step's way to the
    run's failure (kind ``failure``)."""

    source: str
    kind: str
    branch: int | None = None


FAILURE: Final = "failure"
"""The kind of a step's way to the run's failure (no edge of the drawn graph)."""


@dataclass
class Simulation:
    """What a simulated run did."""

    workflow: Workflow
    run_id: str
    started_at: datetime
    events: list[Event]
    end: dict[str, Any]
    """The run's end, in status words: state, outcome, failure, held."""
    reached: set[str]
    used: dict[str, int]
    """Per answered step, how many of its scripted answers were used."""
    taken: list[Taken] = field(default_factory=list)
    """The ways out of steps the run took, in order."""

    @property
    def commands(self) -> list[dict[str, Any]]:
        """The requests the run would send, in order (one per call step)."""
        return [e.request | {"step": e.step} for e in self.events if e.request is not None]


def simulated_binding(connection: str, connection_type: str) -> Binding:
    """The binding every simulated run has: a reserved base URL, the simulation profile."""
    return Binding(
        connection=connection,
        type=connection_type,
        base_url=f"https://{connection}.simulation.invalid",
        client_id="simulation",
        issuer=SIMULATION_ISSUER,
        scopes=frozenset(),
        profile=SIMULATION_PROFILE,
        producer=SIMULATION_PROFILE,
    )


def simulation_run_id(workflow_id: str, admission_key: bytes = SIMULATION_KEY) -> str:
    """The run id a simulated start of ``workflow_id`` gets (fixed principal and key)."""
    identity = derive.api_start_identity(
        admission_key,
        SIMULATION_ISSUER,
        SIMULATION_SUBJECT,
        workflow_id,
        SIMULATION_IDEMPOTENCY_KEY,
    )
    return derive.run_id(admission_key, identity)


@dataclass
class Sent:
    """A call's command as first made: resent as it is by a retry-same."""

    send: Send
    first_attempt_at: datetime
    deadline_at: datetime
    prepared: int = 0
    """How many times the command was prepared (the retry delay counts them)."""


class _Cancelled:
    """A wait or a retry the scripted cancel came during (the step is abandoned)."""


CANCELLED: Final = _Cancelled()


class _Run:
    """The simulated run: clock, kept values, path."""

    def __init__(
        self, workflow: Workflow, script: Script, admission_key: bytes, run_id: str
    ) -> None:
        self.workflow = workflow
        self.script = script
        self.key = admission_key
        self.run_id = run_id
        self.now = script.started_at
        self.scope = Scope(
            input=script.input,
            steps={},
            run_id=run_id,
            run_started_at=clock.timestamp(script.started_at),
        )
        self.events: list[Event] = []
        self.reached: set[str] = set()
        self.used: dict[str, int] = {}
        self.taken: list[Taken] = []
        self.sent: dict[str, Sent] = {}
        self.actions_done = 0
        """How many of the script's operator actions came."""
        self.resend_used: dict[int, int] = {}
        """Per retry-same action (by index), how many of its answers the resend used."""
        self.timed_out: set[str] = set()
        """The wait-for steps that ended by their timeout."""
        self.cancelling = False
        self.cancel_due: datetime | None = None
        """When the scripted cancel comes, once known."""
        self.cancelled = False
        """Whether the scripted cancel came."""
        plan = script.cancel
        if plan is not None and plan.step is None and plan.timing is not None:
            self.cancel_due = plan.timing.when(script.started_at)
        self.bindings = {
            name: simulated_binding(name, kind) for name, kind in workflow.connections.items()
        }

    def event(self, step_id: str, state: str) -> Event:
        kind = step_kind(self.workflow.step(step_id))
        ev = Event(step_id, kind, clock.timestamp(self.now), state)
        self.events.append(ev)
        self.reached.add(step_id)
        return ev

    def cancel_within(self, until: datetime) -> bool:
        """Whether the scripted cancel comes before (or at) ``until``, while the run waits
        at its present step; if so the clock moves to it."""
        if self.cancelled or self.cancel_due is None or self.cancel_due > until:
            return False
        self.now = max(self.now, self.cancel_due)
        return True

    # -------------------------------------------------------------------- the steps

    def reach(self, step: Step) -> Decision:
        """What the step comes to as the run reaches it (:func:`core.execution.steps.reached`),
        with the simulated connections' bindings and the command key a call would carry."""
        key = derive.command_key(self.key, self.run_id, step.id)
        at = Reached(self.workflow, self.scope, self.now, self.bindings, key=key)
        return reached(step, at)

    def send(self, send: Send, ev: Event) -> Settlement | dict[str, Any] | _Cancelled:
        """Answer a call's command from the script, as often as the dispatcher would send it."""
        step = send.step
        ev.request = _request_document(send.built)
        answers = self.script.calls.get(step.id)
        if answers is None:
            raise refuse(
                f"answers.{step.id}", "the run reaches this call and the script does not answer it"
            )
        deadline_at = self.now + timedelta(seconds=step.deadline_seconds)
        self.sent[step.id] = Sent(send, self.now, deadline_at)

        def take(index: int) -> CallAnswer:
            self.used[step.id] = self.used.get(step.id, 0) + 1
            return answers[min(len(answers) - 1, index)]

        return self.attempts(self.sent[step.id], ev, take)

    def attempts(
        self, sent: Sent, ev: Event, take: Callable[[int], CallAnswer]
    ) -> Settlement | dict[str, Any] | _Cancelled:
        """Send the command until an answer ends the step, holds it or a retry would miss
        its deadline; ``take(n)`` gives the answer to the n-th exchange."""
        step, op = sent.send.step, sent.send.built.operation
        resent = False
        for exchange in range(_MAX_ATTEMPTS):
            sent.prepared += 0 if resent else 1
            answer = take(exchange)
            result = answer.classified(self.now)
            attempt: dict[str, Any] = {"at": clock.timestamp(self.now), "answer": answer.describe()}
            attempt |= _classified_document(result)
            ev.attempts.append(attempt)
            if result.result == REFUSED and result.status == 401 and not resent:
                # The dispatcher sends once more with a fresh token.
                resent = True
                continue
            resent = False
            settlement = answered(self.workflow, self.scope, step, op, result)
            if settlement is not None:
                return settlement
            if result.result == UNCERTAIN:
                return {"state": StepState.UNCERTAIN, "cause": result.cause or UNREADABLE_ANSWER}
            assert result.result == RETRYABLE
            delay = retry_wait(sent.prepared, result, jitter=lambda: 0.0)
            if misses_deadline(sent.deadline_at, self.now, delay):
                attempt["nextAttemptAt"] = None  # the deadline passes first
                return Settlement.failing(Failure("deadline-exceeded"))
            next_at = self.now + timedelta(seconds=delay)
            attempt["nextAttemptAt"] = clock.timestamp(next_at)
            if self.cancel_within(next_at):
                return CANCELLED
            self.now = next_at
        raise refuse(f"answers.{step.id}", f"more than {_MAX_ATTEMPTS} attempts")

    def watch(self, watch: Watch, ev: Event) -> Settlement | _Cancelled:
        """Answer a wait-for's read from the script: a decision when it comes (at once unless
        timed), or the timeout, which also takes a decision scripted for later."""
        step = watch.step
        answer = self.script.waits.get(step.id)
        if answer is None:
            raise refuse(
                f"answers.{step.id}",
                "the run reaches this wait-for and the script does not answer it",
            )
        self.used[step.id] = 1
        reached_at = self.now
        timeout_at = (
            None
            if step.timeout_seconds is None
            else reached_at + timedelta(seconds=step.timeout_seconds)
        )
        arrives = None
        if answer.decision is not None:
            # A decision made before the run waits is found by the wait's first read.
            timing = answer.timing
            arrives = max(reached_at, timing.when(reached_at)) if timing else reached_at
        late = arrives is not None and timeout_at is not None and arrives >= timeout_at
        if arrives is None or late:
            assert timeout_at is not None  # the script's check: a timeout needs timeoutSeconds
            if self.cancel_within(timeout_at):
                return CANCELLED
            self.timed_out.add(step.id)
            self.now = timeout_at
            ev.fired = {"why": "timeout", "at": clock.timestamp(timeout_at)}
            if late:
                assert arrives is not None
                ev.ignored = {"at": clock.timestamp(arrives)}
            return wait_for.timed_out(self.workflow, step)
        assert answer.decision is not None
        if self.cancel_within(arrives):
            return CANCELLED
        self.now = arrives
        decision = {"decidedAt": clock.timestamp(self.now), **answer.decision}
        read = wait_for.interpret(200, canonical_json({"status": "decided", "decision": decision}))
        if read.kind != wait_for.DECIDED or read.result is None:
            raise refuse(f"answers.{step.id}.decision", f"not a decision ({read.reason})")
        ev.fired = {"why": "decision", "at": clock.timestamp(self.now)}
        ev.decision = dict(read.result)
        return wait_for.decided(self.workflow, step, read.result)

    def sleep(self, sleep: Sleep, ev: Event) -> Settlement | _Cancelled:
        """Move the simulated clock to a timer's instant; the run goes on."""
        if self.cancel_within(sleep.until):
            return CANCELLED
        self.now = sleep.until
        ev.fired = {"why": "due", "at": clock.timestamp(sleep.until)}
        return came(self.workflow, self.scope, sleep.step)

    # -------------------------------------------------------------------- the walk

    def keep(self, step_id: str, settlement: Settlement, ev: Event) -> None:
        """The values a settled step keeps for later steps (its output, a decision)."""
        for purpose in ("output", "wait-result"):
            value = settlement.keep.get(purpose)
            if isinstance(value, dict):
                self.scope = replace(self.scope, steps={**self.scope.steps, step_id: value})
                if purpose == "output":
                    ev.kept = dict(value)

    def take(self, source: str, kind: str, branch: int | None = None) -> None:
        self.taken.append(Taken(source, kind, branch))

    def take_choose(self, step: ChooseStep, ev: Event) -> None:
        """The branch a choose took, decided again over the same values (it reads nothing
        else), so a branch is told from ``otherwise`` when both lead to one step; the
        values its predicates read go into the step's trace."""
        index = branch_taken(step, self.scope)
        self.take(step.id, "otherwise" if index is None else "choose", index)
        ev.branch = "otherwise" if index is None else index
        ev.next = step.otherwise if index is None else step.branches[index].next
        tried = step.branches if index is None else step.branches[: index + 1]
        ev.read = {
            ref.text: read_value(ref, self.scope)
            for branch in tried
            for ref in predicate_refs(branch.when)
        }

    def take_way_out(self, step: Step, settled: Settlement, ev: Event) -> None:
        """The edge a settled step left by."""
        if isinstance(step, ChooseStep):
            self.take_choose(step, ev)
        elif isinstance(step, CallStep) and settled.state == StepState.REFUSED:
            self.take(step.id, "onRefused")
        elif isinstance(step, WaitForStep) and step.id in self.timed_out:
            self.take(step.id, "onTimeout")
        else:
            self.take(step.id, "next")

    def finished(self, outcome: str | None) -> dict[str, Any]:
        state = RunState.CANCELLED if self.cancelling else RunState.SUCCEEDED
        return {"state": str(state)} | ({"outcome": outcome} if outcome is not None else {})

    def cancel(self, ev: Event) -> str | None:
        """The scripted cancel comes at the step of ``ev``: the step is abandoned, and the
        run goes on at ``onCancel`` (its id) or ends (None)."""
        self.cancelled = self.cancelling = True
        ev.state = StepState.CANCELLED
        ev.ended_at = clock.timestamp(self.now)
        ev.fired = {"why": "cancel", "at": clock.timestamp(self.now)}
        if self.workflow.on_cancel is None:
            return None
        self.take(CANCEL, "onCancel")
        return self.workflow.on_cancel

    def arrive(self, current: str) -> bool:
        """The run reaches ``current``: whether the scripted cancel comes now, before the
        step is worked on."""
        plan = self.script.cancel
        if plan is None or self.cancelled:
            return False
        if plan.step == current and self.cancel_due is None:
            if plan.timing is None:
                return True
            self.cancel_due = plan.timing.when(self.now)
        return self.cancel_due is not None and self.cancel_due <= self.now

    def run(self) -> dict[str, Any]:
        current = self.workflow.start
        self.take(START, "start")
        for _ in range(_MAX_ATTEMPTS):
            step = self.workflow.step(current)
            ev = self.event(current, StepState.COMPLETED)
            if self.arrive(current):
                following = self.cancel(ev)
                if following is None:
                    return {"state": str(RunState.CANCELLED)}
                current = following
                continue
            try:
                decision = self.reach(step)
            except Exception as exc:  # the dispatcher gives such a step back, again and again
                ev.state = StepState.READY
                ev.undecided = type(exc).__name__
                return {"state": str(RunState.RUNNING), "stuck": current}
            settled: Settlement | dict[str, Any] | _Cancelled
            if isinstance(decision, Send):
                settled = self.send(decision, ev)
            elif isinstance(decision, Watch):
                settled = self.watch(decision, ev)
            elif isinstance(decision, Sleep):
                settled = self.sleep(decision, ev)
            else:
                settled = decision
            went = self.went(step, ev, settled)
            if isinstance(went, dict):
                return went
            current = went
        raise refuse("", "the run takes more steps than any checked workflow can")

    def went(
        self, step: Step, ev: Event, settled: Settlement | dict[str, Any] | _Cancelled
    ) -> dict[str, Any] | str:
        """Where the run goes once ``step`` came to ``settled``: the id of the step it
        continues at, or its end."""
        current = step.id
        if isinstance(settled, _Cancelled):
            following = self.cancel(ev)
            return {"state": str(RunState.CANCELLED)} if following is None else following
        if isinstance(settled, dict):
            ev.state = settled["state"]
            ev.held = {"cause": settled["cause"]}
            return self.operate(step, settled)
        ev.state = settled.state
        ev.ended_at = clock.timestamp(self.now)
        self.keep(current, settled, ev)
        if settled.failure is not None:
            self.take(current, FAILURE)
            ev.failure = {"kind": settled.failure.kind}
            if settled.failure.path is not None:
                ev.failure["failurePath"] = settled.failure.path
            if self.cancelling:
                # A cancelled run ends cancelled even when its onCancel path fails
                # (CONTRACT §10.3): no failure, no outcome, as step_settle records it.
                return {"state": str(RunState.CANCELLED)}
            failure = {"kind": settled.failure.kind, "step": current}
            if settled.failure.path is not None:
                failure["failurePath"] = settled.failure.path
            return {"state": str(RunState.FAILED), "failure": failure}
        way = settled.way
        if way is None:  # a finish: the run ends with its outcome
            ev.outcome = settled.outcome
            return self.finished(settled.outcome)
        self.take_way_out(step, settled, ev)
        for passed, _ in way.passed:
            local = self.event(passed, StepState.COMPLETED)
            local.ended_at = local.at
            local_step = self.workflow.step(passed)
            if isinstance(local_step, ChooseStep):
                self.take_choose(local_step, local)
            else:
                local.outcome = way.outcome
        if way.next_step is None:
            return self.finished(way.outcome)
        return way.next_step

    def operate(self, step: Step, held: dict[str, Any]) -> dict[str, Any] | str:
        """The run is held at the call ``step`` (``held``: its state and cause): the
        script's next operator action, if any, acts as recovery would (CONTRACT §10);
        otherwise the run ends held."""
        assert isinstance(step, CallStep)
        state, cause = held["state"], held["cause"]
        actions = self.script.operator
        while self.actions_done < len(actions):
            index = self.actions_done
            action = actions[index]
            self.actions_done += 1
            if action.timing is not None:
                self.now = max(self.now, action.timing.when(self.now))
            ev = self.event(step.id, state)
            ev.operator = {"action": action.action, "at": clock.timestamp(self.now)}
            ev.held = {"cause": cause}
            sent = self.sent[step.id]
            op = sent.send.built.operation
            kind = connection_type(self.workflow.connections[step.connection])
            product = kind.product if kind is not None else step.connection
            where = f"operator[{index}]" if len(actions) > 1 else "operator"
            if action.action == "cancel":
                # The held step stays as it is (its effect unknown); the run takes onCancel.
                return self.cancel_held(ev, state)
            if action.action == "reconcile":
                if state != StepState.UNCERTAIN:
                    ev.operator |= {"refused": "reconcile.refused"}
                    continue
                unsupported = reconcile_unsupported(op, product)
                if unsupported is not None:
                    ev.operator |= {"refused": "reconcile.unsupported", "detail": unsupported}
                    continue
                if action.receipt is None:
                    raise refuse(f"{where}.receipt", f"{product} is asked for a receipt")
                receipt = _receipt(action.receipt)
                ev.operator["receipt"] = receipt.kind
                if receipt.kind == NOT_SEEN:
                    state = ev.state = StepState.NOT_SENT
                    continue
                if receipt.kind != FOUND:
                    refused = (
                        "receipt.expired" if receipt.kind == EXPIRED else "service.unavailable"
                    )
                    ev.operator["refused"] = refused
                    continue
                found = Classified(ACCEPTED, "a receipt", response=receipt.body)
                settlement = answered(self.workflow, self.scope, step, op, found, direct)
                assert settlement is not None  # an accepted answer always ends the step
                ev.held = None
                return self.went(step, ev, settlement)
            refusal = retry_same_refusal(
                op,
                product,
                first_attempt_at=sent.first_attempt_at,
                deadline_at=sent.deadline_at,
                now=self.now,
            )
            if refusal is not None:
                ev.operator |= {"refused": "retry.refused", "detail": refusal}
                continue
            if not action.answers:
                raise refuse(f"{where}.answer", "the command is resent and needs an answer")
            ev.request = _request_document(sent.send.built)
            ev.held = None
            answers = action.answers

            def take(exchange: int, answers: tuple[CallAnswer, ...] = answers) -> CallAnswer:
                self.resend_used[self.actions_done - 1] = exchange + 1
                return answers[min(len(answers) - 1, exchange)]

            return self.went(step, ev, self.attempts(sent, ev, take))
        return {"state": str(RunState.HELD), "held": {"step": step.id, **held, "state": state}}

    def cancel_held(self, ev: Event, state: str) -> dict[str, Any] | str:
        """An operator cancels the held run: the held step keeps its state, and the run
        takes onCancel or ends cancelled."""
        self.cancelled = self.cancelling = True
        ev.state = state
        if self.workflow.on_cancel is None:
            return {"state": str(RunState.CANCELLED)}
        self.take(CANCEL, "onCancel")
        return self.workflow.on_cancel


def _receipt(answer: CallAnswer) -> Receipt:
    """What reconcile makes of a scripted receipt read (:func:`classify_receipt`)."""
    if answer.status is None:
        return Receipt(UNAVAILABLE, f"no answer ({answer.no_answer})")
    return classify_receipt(answer.status, answer.body)


def _request_document(built: Built) -> dict[str, Any]:
    request = built.request
    return {
        "method": request.method,
        "url": request.url,
        "key": request.command_key,
        "body": json.loads(request.body),
    }


def _classified_document(result: Classified) -> dict[str, Any]:
    out: dict[str, Any] = {"result": result.result, "reason": result.reason}
    if result.cause is not None:
        out["cause"] = result.cause
    return out


def simulate(
    workflow: Workflow,
    script: Script,
    *,
    admission_key: bytes = SIMULATION_KEY,
    run_id: str | None = None,
) -> Simulation:
    """Run ``workflow`` as ``script`` says. ``admission_key`` and ``run_id`` default to the
    simulation's; a test passes a deployment's to compare with its dispatcher. Refuses
    (``request.invalid``) a script whose answers the path does not use, naming the step."""
    run = _Run(workflow, script, admission_key, run_id or simulation_run_id(workflow.id))
    end = run.run()
    for step_id in [*script.calls, *script.waits]:
        if step_id not in run.reached:
            raise refuse(f"answers.{step_id}", "the run never reaches this step")
    plan = script.cancel
    if plan is not None and not run.cancelled:
        if plan.step is not None and plan.step not in run.reached:
            raise refuse("cancel", f"the run never reaches '{plan.step}'")
        when = "" if run.cancel_due is None else f" ({clock.timestamp(run.cancel_due)})"
        raise refuse("cancel", f"the run ends before the cancel comes{when}")
    for step_id, answers in script.calls.items():
        used = run.used.get(step_id, 0)
        if used < len(answers):
            where = f"answers.{step_id}" + (f"[{used}]" if len(answers) > 1 else "")
            raise refuse(where, "the run never uses this answer")
    for step_id in script.waits:
        if step_id not in run.used:
            raise refuse(f"answers.{step_id}", "the run never uses this answer")
    several = len(script.operator) > 1
    for index, action in enumerate(script.operator):
        where = f"operator[{index}]" if several else "operator"
        if index >= run.actions_done:
            raise refuse(where, "the run is not held when this action would come")
        used = run.resend_used.get(index, 0)
        if action.answers and used < len(action.answers):
            where += ".answer" + (f"[{used}]" if len(action.answers) > 1 else "")
            raise refuse(where, "the run never uses this answer")
    return Simulation(
        workflow, run.run_id, script.started_at, run.events, end, run.reached, run.used, run.taken
    )
