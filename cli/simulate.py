"""``coordinatorctl workflow simulate``: a workflow run offline against scripted answers.

The simulator is not a second interpreter. Each step is decided by the code every room that
runs steps shares, :mod:`core.execution`: a call's command is mapped and its request built by
:func:`core.execution.call.build_request` under the key :func:`core.derive.command_key`
derives; the scripted answer is classified by :mod:`core.execution.classify` and settled by
:func:`core.execution.call.answered` (retries by :func:`core.execution.classify.retry_delay`
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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from core import clock, derive
from core.bindings import Binding
from core.canonical import canonical_json
from core.codes import Code
from core.errors import CoordinatorError
from core.execution import wait_for
from core.execution.call import Built, answered
from core.execution.classify import (
    REFUSED,
    RETRYABLE,
    UNCERTAIN,
    Classified,
    classify_answer,
    classify_failure,
    retry_delay,
)
from core.execution.onward import Onward, branch_taken
from core.execution.settlement import Failure, Settlement, misses_deadline
from core.execution.steps import Decision, Reached, Send, Sleep, Watch, reached
from core.execution.wait_until import came
from core.products.http import (
    ANSWER_TOO_LARGE,
    CONNECTION_LOST,
    FRAMING_VIOLATION,
    NEVER_CONNECTED,
    TIMEOUT_AFTER_SEND,
    UNREADABLE_ANSWER,
    ExchangeFailure,
)
from core.states import RunState, StepState
from core.workflow.expr import Scope
from core.workflow.graph import CANCEL, START
from core.workflow.model import (
    CallStep,
    ChooseStep,
    Step,
    WaitForStep,
    Workflow,
    step_kind,
)
from core.workflow.schema import is_rfc3339, validate_input
from core.yamlsafe import load as load_yaml

SIMULATION_KEY: Final = hashlib.sha256(b"registry-coordinator workflow simulate v1").digest()
"""The admission key of every simulation: public, fixed, never a deployment's."""
SIMULATION_ISSUER: Final = "https://issuer.simulation.invalid"
SIMULATION_SUBJECT: Final = "simulation"
SIMULATION_IDEMPOTENCY_KEY: Final = "simulation"
SIMULATION_PROFILE: Final = "simulation"
"""The ``profile`` (and Casework ``producer``) of every simulated connection."""
DEFAULT_STARTED_AT: Final = "2030-01-07T09:00:00Z"
"""When a simulated run starts unless the script's ``startedAt`` says otherwise."""

FAILURE_CAUSES: Final = {
    NEVER_CONNECTED: False,
    TIMEOUT_AFTER_SEND: True,
    CONNECTION_LOST: True,
    UNREADABLE_ANSWER: True,
    FRAMING_VIOLATION: True,
    ANSWER_TOO_LARGE: True,
}
"""The ``noAnswer`` causes a script may give, and whether a byte can have left."""

_MAX_ATTEMPTS: Final = 1000
_SCRIPT_KEYS: Final = frozenset({"input", "startedAt", "answers", "cancel", "expect"})
_EXPECT_KEYS: Final = frozenset({"state", "outcome", "failure", "held"})
_TIMEOUT: Final = "timeout"


def _refuse(path: str, reason: str) -> CoordinatorError:
    where = f"script: {path}: " if path else "script: "
    return CoordinatorError(Code.REQUEST_INVALID, f"{where}{reason}")


# ------------------------------------------------------------------------------------ the script


@dataclass(frozen=True)
class CallAnswer:
    """One scripted exchange of a call: an HTTP answer, or no answer at all."""

    status: int | None
    body: bytes
    no_answer: str | None = None

    def classified(self) -> Classified:
        """What the dispatcher's classification makes of it."""
        if self.no_answer is not None:
            failure = ExchangeFailure(self.no_answer, sent=FAILURE_CAUSES[self.no_answer])
            return classify_failure(failure)
        assert self.status is not None
        return classify_answer(self.status, self.body)

    def describe(self) -> str:
        if self.no_answer is not None:
            return f"no answer ({self.no_answer})"
        return f"{self.status} {self.body.decode('utf-8', 'replace')}".rstrip()


@dataclass(frozen=True)
class WaitAnswer:
    """The scripted end of a wait-for: a decision document, or ``timeout``."""

    decision: Mapping[str, Any] | None


@dataclass(frozen=True)
class Script:
    """A parsed simulation script."""

    input: Any
    started_at: datetime
    calls: Mapping[str, tuple[CallAnswer, ...]]
    waits: Mapping[str, WaitAnswer]
    cancel: str | None
    expect: Mapping[str, Any]


def _call_answer(value: Any, path: str) -> CallAnswer:
    if not isinstance(value, dict):
        raise _refuse(path, "a call's answer is {status, body} or {noAnswer: <cause>}")
    unknown = sorted(set(value) - {"status", "body", "noAnswer"})
    if unknown:
        raise _refuse(f"{path}.{unknown[0]}", "unknown key")
    if "noAnswer" in value:
        cause = value["noAnswer"]
        if cause not in FAILURE_CAUSES or len(value) > 1:
            raise _refuse(f"{path}.noAnswer", f"one of {', '.join(sorted(FAILURE_CAUSES))}, alone")
        return CallAnswer(None, b"", cause)
    status = value.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise _refuse(f"{path}.status", "an HTTP status, 100-599")
    body = value.get("body")
    if body is None:
        raw = b""
    elif isinstance(body, str):
        raw = body.encode()  # a body given as text is sent as it is (an unreadable one, say)
    else:
        raw = json.dumps(body).encode()
    return CallAnswer(status, raw)


def _wait_answer(value: Any, path: str) -> WaitAnswer:
    if value == _TIMEOUT:
        return WaitAnswer(None)
    if not isinstance(value, dict) or set(value) != {"decision"}:
        raise _refuse(path, "a wait-for's answer is {decision: {outcome: …}} or timeout")
    decision = value["decision"]
    if not isinstance(decision, dict) or not isinstance(decision.get("outcome"), str):
        raise _refuse(f"{path}.decision.outcome", "the decision's outcome, as text")
    return WaitAnswer(decision)


def _instant(value: Any, path: str) -> datetime:
    if isinstance(value, datetime):  # YAML reads an unquoted timestamp as one
        value = value.isoformat()
    if not isinstance(value, str) or not is_rfc3339(value):
        raise _refuse(path, "an RFC 3339 instant, such as 2030-01-07T09:00:00Z")
    return clock.parse_instant(value)


def parse_script(workflow: Workflow, document: Any, run_input: Any = None) -> Script:
    """Check a script against ``workflow``; ``run_input`` (from ``--input-file``) replaces
    the script's ``input``. Refusals name the script's key path."""
    if not isinstance(document, dict):
        raise _refuse("", "a script is a mapping with input, answers and expect")
    unknown = sorted(set(document) - _SCRIPT_KEYS)
    if unknown:
        raise _refuse(unknown[0], "unknown key")
    if run_input is None:
        if "input" not in document:
            raise _refuse("input", "required (or give --input-file)")
        run_input = document["input"]
    problems = validate_input(workflow.input_schema, run_input)
    if problems:
        pointer, reason = problems[0]
        raise CoordinatorError(
            Code.INPUT_INVALID, f"the input does not fit the workflow: {pointer or '/'}: {reason}"
        )
    answers = document.get("answers") or {}
    if not isinstance(answers, dict):
        raise _refuse("answers", "a mapping of step ids to answers")
    calls: dict[str, tuple[CallAnswer, ...]] = {}
    waits: dict[str, WaitAnswer] = {}
    for step_id, value in answers.items():
        path = f"answers.{step_id}"
        step = workflow.steps.get(str(step_id))
        if step is None:
            raise _refuse(path, f"the workflow has no step '{step_id}'")
        if isinstance(step, CallStep):
            items = value if isinstance(value, list) else [value]
            if not items:
                raise _refuse(path, "at least one answer")
            if isinstance(value, list):
                calls[step.id] = tuple(_call_answer(v, f"{path}[{i}]") for i, v in enumerate(items))
            else:
                calls[step.id] = (_call_answer(value, path),)
        elif isinstance(step, WaitForStep):
            answer = _wait_answer(value, path)
            if answer.decision is None and step.on_timeout is None:
                raise _refuse(path, f"'{step.id}' has no timeoutSeconds: it cannot time out")
            waits[step.id] = answer
        else:
            raise _refuse(path, f"'{step_id}' is a {step_kind(step)} step: nothing to answer")
    cancel = document.get("cancel")
    if cancel is not None and (not isinstance(cancel, str) or cancel not in workflow.steps):
        raise _refuse("cancel", "the id of a step the run is cancelled at")
    expect = document.get("expect")
    if not isinstance(expect, dict) or "state" not in expect:
        raise _refuse("expect", "required: at least the state the run ends in")
    unknown = sorted(set(expect) - _EXPECT_KEYS)
    if unknown:
        raise _refuse(f"expect.{unknown[0]}", f"unknown key; use {', '.join(sorted(_EXPECT_KEYS))}")
    started = _instant(document.get("startedAt", DEFAULT_STARTED_AT), "startedAt")
    return Script(run_input, started, calls, waits, cancel, expect)


def read_script(workflow: Workflow, path: Path, input_file: Path | None = None) -> Script:
    """Read and check a script file (and the input file that replaces its ``input``)."""
    try:
        raw = path.read_bytes()
    except OSError:
        raise _refuse("", f"{path}: cannot be read") from None
    document = load_yaml(raw, lambda where, reason: _refuse(where, reason))
    run_input = None
    if input_file is not None:
        try:
            run_input = json.loads(input_file.read_bytes())
        except OSError:
            raise CoordinatorError(Code.REQUEST_INVALID, f"{input_file}: cannot be read") from None
        except ValueError:
            raise CoordinatorError(Code.REQUEST_INVALID, f"{input_file}: not JSON") from None
    return parse_script(workflow, document, run_input)


# ------------------------------------------------------------------------------------ the run


@dataclass
class Event:
    """One step on the run's path."""

    step: str
    type: str
    at: str
    state: str
    """The step's state after it (completed, refused, failed, uncertain, cancelled)."""
    request: dict[str, Any] | None = None
    """A call's request: method, url, key (Idempotency-Key) and body."""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """A call's exchanges: the answer and its classification."""
    note: str | None = None

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "type": self.type, "at": self.at}
        if self.request is not None:
            out["request"] = self.request
        if self.attempts:
            out["attempts"] = self.attempts
        if self.note is not None:
            out["note"] = self.note
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
        self.timed_out: set[str] = set()
        """The wait-for steps that ended by their timeout."""
        self.cancelling = False
        self.bindings = {
            name: simulated_binding(name, kind) for name, kind in workflow.connections.items()
        }

    def event(self, step_id: str, state: str, **kwargs: Any) -> Event:
        kind = step_kind(self.workflow.step(step_id))
        ev = Event(step_id, kind, clock.timestamp(self.now), state, **kwargs)
        self.events.append(ev)
        self.reached.add(step_id)
        return ev

    # -------------------------------------------------------------------- the steps

    def reach(self, step: Step) -> Decision:
        """What the step comes to as the run reaches it (:func:`core.execution.steps.reached`),
        with the simulated connections' bindings and the command key a call would carry."""
        key = derive.command_key(self.key, self.run_id, step.id)
        at = Reached(self.workflow, self.scope, self.now, self.bindings, key=key)
        return reached(step, at)

    def send(self, send: Send, ev: Event) -> Settlement | dict[str, Any]:
        """Answer a call's command from the script, as often as the dispatcher would send it."""
        step, op = send.step, send.built.operation
        ev.request = _request_document(send.built)
        answers = self.script.calls.get(step.id)
        if answers is None:
            raise _refuse(
                f"answers.{step.id}", "the run reaches this call and the script does not answer it"
            )
        deadline_at = self.now + timedelta(seconds=step.deadline_seconds)
        resent = False
        prepared = 0
        for _ in range(_MAX_ATTEMPTS):
            prepared += 0 if resent else 1
            answer = answers[min(len(answers) - 1, self.used.get(step.id, 0))]
            self.used[step.id] = self.used.get(step.id, 0) + 1
            result = answer.classified()
            ev.attempts.append(
                {"at": clock.timestamp(self.now), "answer": answer.describe()}
                | _classified_document(result)
            )
            if result.result == REFUSED and result.status == 401 and not resent:
                # The dispatcher sends once more with a fresh token.
                resent = True
                continue
            resent = False
            settlement = answered(self.workflow, self.scope, step, op, result)
            if settlement is not None:
                return settlement
            if result.result == UNCERTAIN:
                ev.note = "effect unknown: never resent automatically; an operator settles it"
                return {"state": StepState.UNCERTAIN, "cause": result.cause or UNREADABLE_ANSWER}
            assert result.result == RETRYABLE
            delay = retry_delay(prepared, jitter=lambda: 0.0)
            if misses_deadline(deadline_at, self.now, delay):
                return Settlement.failing(Failure("deadline-exceeded"))
            self.now += timedelta(seconds=delay)
        raise _refuse(f"answers.{step.id}", f"more than {_MAX_ATTEMPTS} attempts")

    def watch(self, watch: Watch, ev: Event) -> Settlement:
        """Answer a wait-for's read from the script: a decision, or its timeout."""
        step = watch.step
        answer = self.script.waits.get(step.id)
        if answer is None:
            raise _refuse(
                f"answers.{step.id}",
                "the run reaches this wait-for and the script does not answer it",
            )
        self.used[step.id] = 1
        shown_identity = f"{step.result} {watch.field}={watch.identity}"
        if answer.decision is None:
            assert step.timeout_seconds is not None
            self.timed_out.add(step.id)
            self.now += timedelta(seconds=step.timeout_seconds)
            ev.note = f"{shown_identity}: no decision; timed out"
            return wait_for.timed_out(self.workflow, step)
        decision = {"decidedAt": clock.timestamp(self.now), **answer.decision}
        read = wait_for.interpret(200, canonical_json({"status": "decided", "decision": decision}))
        if read.kind != wait_for.DECIDED or read.result is None:
            raise _refuse(f"answers.{step.id}.decision", f"not a decision ({read.reason})")
        shown = ", ".join(f"{k}={v}" for k, v in read.result.items())
        ev.note = f"{shown_identity}: {shown}"
        return wait_for.decided(self.workflow, step, read.result)

    def sleep(self, sleep: Sleep, ev: Event) -> Settlement:
        """Move the simulated clock to a timer's instant; the run goes on."""
        ev.note = f"waits until {clock.timestamp(sleep.until)}"
        self.now = sleep.until
        return came(self.workflow, self.scope, sleep.step)

    # -------------------------------------------------------------------- the walk

    def keep(self, step_id: str, settlement: Settlement) -> None:
        """The values a settled step keeps for later steps (its output, a decision)."""
        for purpose in ("output", "wait-result"):
            value = settlement.keep.get(purpose)
            if isinstance(value, dict):
                self.scope = replace(self.scope, steps={**self.scope.steps, step_id: value})

    def take(self, source: str, kind: str, branch: int | None = None) -> None:
        self.taken.append(Taken(source, kind, branch))

    def take_choose(self, step: ChooseStep) -> None:
        """The branch a choose took, decided again over the same values (it reads nothing
        else), so a branch is told from ``otherwise`` when both lead to one step."""
        index = branch_taken(step, self.scope)
        self.take(step.id, "otherwise" if index is None else "choose", index)

    def take_way_out(self, step: Step, settled: Settlement) -> None:
        """The edge a settled step left by, and those of the chooses its way passed."""
        if isinstance(step, ChooseStep):
            self.take_choose(step)
        elif isinstance(step, CallStep) and settled.state == StepState.REFUSED:
            self.take(step.id, "onRefused")
        elif isinstance(step, WaitForStep) and step.id in self.timed_out:
            self.take(step.id, "onTimeout")
        else:
            self.take(step.id, "next")
        assert settled.way is not None
        for passed, kind in settled.way.passed:
            local = self.workflow.step(passed)
            if kind == "choose" and isinstance(local, ChooseStep):
                self.take_choose(local)

    def finished(self, outcome: str | None) -> dict[str, Any]:
        state = RunState.CANCELLED if self.cancelling else RunState.SUCCEEDED
        return {"state": str(state)} | ({"outcome": outcome} if outcome is not None else {})

    def run(self) -> dict[str, Any]:
        current = self.workflow.start
        self.take(START, "start")
        for _ in range(_MAX_ATTEMPTS):
            step = self.workflow.step(current)
            if self.script.cancel == current and not self.cancelling:
                self.event(current, StepState.CANCELLED, note="an operator cancels the run here")
                self.cancelling = True
                if self.workflow.on_cancel is None:
                    return {"state": str(RunState.CANCELLED)}
                self.take(CANCEL, "onCancel")
                current = self.workflow.on_cancel
                continue
            ev = self.event(current, StepState.COMPLETED)
            try:
                decision = self.reach(step)
            except Exception as exc:  # the dispatcher gives such a step back, again and again
                ev.state = "ready"
                ev.note = f"the step cannot be decided ({type(exc).__name__})"
                return {"state": str(RunState.RUNNING), "stuck": current}
            settled: Settlement | dict[str, Any]
            if isinstance(decision, Send):
                settled = self.send(decision, ev)
            elif isinstance(decision, Watch):
                settled = self.watch(decision, ev)
            elif isinstance(decision, Sleep):
                settled = self.sleep(decision, ev)
            else:
                settled = decision
                ev.note = _decided_note(decision)
            if isinstance(settled, dict):
                ev.state = settled["state"]
                return {"state": str(RunState.HELD), "held": {"step": current, **settled}}
            ev.state = settled.state
            self.keep(current, settled)
            if settled.failure is not None:
                self.take(current, FAILURE)
                if self.cancelling:
                    # A cancelled run ends cancelled even when its onCancel path fails
                    # (CONTRACT §10.3): no failure, no outcome, as step_settle records it.
                    ev.note = f"the onCancel path fails here ({settled.failure.kind})"
                    return {"state": str(RunState.CANCELLED)}
                failure = {"kind": settled.failure.kind, "step": current}
                if settled.failure.path is not None:
                    failure["failurePath"] = settled.failure.path
                return {"state": str(RunState.FAILED), "failure": failure}
            way = settled.way
            if way is None:  # a finish: the run ends with its outcome
                return self.finished(settled.outcome)
            self.take_way_out(step, settled)
            for i, (passed, _) in enumerate(way.passed):
                local = self.event(passed, StepState.COMPLETED)
                local.note = _continues(way, i)
            if way.next_step is None:
                return self.finished(way.outcome)
            current = way.next_step
        raise _refuse("", "the run takes more steps than any checked workflow can")


def _continues(way: Onward, index: int) -> str:
    """The note of local step ``index`` of ``way``: a finish's outcome, or where a choose
    continues."""
    if index + 1 == len(way.passed) and way.next_step is None:
        return f"outcome {way.outcome}"
    after = way.passed[index + 1][0] if index + 1 < len(way.passed) else way.next_step
    return f"continues at {after}"


def _decided_note(settlement: Settlement) -> str | None:
    """The note of a step that ended as it was reached: where a choose continues, a finish's
    outcome, a timer already past."""
    way = settlement.way
    if way is None:
        return None if settlement.outcome is None else f"outcome {settlement.outcome}"
    first = way.passed[0][0] if way.passed else way.next_step
    return f"continues at {first}" if first is not None else f"outcome {way.outcome}"


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
            raise _refuse(f"answers.{step_id}", "the run never reaches this step")
    if script.cancel is not None and script.cancel not in run.reached:
        raise _refuse("cancel", f"the run never reaches '{script.cancel}'")
    for step_id, answers in script.calls.items():
        used = run.used.get(step_id, 0)
        if used < len(answers):
            where = f"answers.{step_id}" + (f"[{used}]" if len(answers) > 1 else "")
            raise _refuse(where, "the run never uses this answer")
    for step_id in script.waits:
        if step_id not in run.used:
            raise _refuse(f"answers.{step_id}", "the run never uses this answer")
    return Simulation(
        workflow, run.run_id, script.started_at, run.events, end, run.reached, run.used, run.taken
    )


# ------------------------------------------------------------------------------------ the verdict


def mismatches(expect: Mapping[str, Any], end: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Where the run's end differs from ``expect`` (only what ``expect`` names is compared)."""
    out: list[str] = []
    for name, wanted in expect.items():
        got = end.get(name)
        if isinstance(wanted, dict) and isinstance(got, dict):
            out.extend(mismatches(wanted, got, f"{prefix}{name}."))
        elif wanted != got:
            out.append(
                f"expect.{prefix}{name}: expected {_show(wanted)}, the run gave {_show(got)}"
            )
    return out


def _show(value: Any) -> str:
    return "nothing" if value is None else json.dumps(value, ensure_ascii=False)


def document(simulation: Simulation, expect: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON form (``--output json``)."""
    wrong = mismatches(expect, simulation.end)
    return {
        "workflow": {"id": simulation.workflow.id, "version": simulation.workflow.version},
        "runId": simulation.run_id,
        "startedAt": clock.timestamp(simulation.started_at),
        "path": [e.document() for e in simulation.events],
        "end": simulation.end,
        "asExpected": not wrong,
        "mismatches": wrong,
    }


def text(simulation: Simulation, expect: Mapping[str, Any]) -> list[str]:
    """The readable form: the path step by step, the end, the verdict."""
    wf = simulation.workflow
    lines = [
        f"simulating {wf.id} {wf.version}: run {simulation.run_id}, "
        f"started {clock.timestamp(simulation.started_at)} (simulated time, simulation key)",
    ]
    for number, ev in enumerate(simulation.events, 1):
        lines.append(f"{number:>3}  {ev.at}  {ev.step} ({ev.type})")
        if ev.request is not None:
            req = ev.request
            lines.append(f"       send    {req['method']} {req['url']}")
            lines.append(f"       key     {req['key']}")
            body = json.dumps(req["body"], ensure_ascii=False, sort_keys=True)
            lines.append(f"       command {body}")
        for attempt in ev.attempts:
            cause = f", cause {attempt['cause']}" if "cause" in attempt else ""
            lines.append(
                f"       answer  {attempt['at']}  {attempt['answer']} -> {attempt['result']} "
                f"({attempt['reason']}{cause})"
            )
        if ev.note is not None:
            lines.append(f"       {ev.note}")
        lines.append(f"       state   {ev.state}")
    end = simulation.end
    summary = f"end: {end['state']}"
    if "outcome" in end:
        summary += f", outcome {end['outcome']}"
    if "failure" in end:
        failure = end["failure"]
        summary += f", failure {failure['kind']} at step {failure['step']}"
        if "failurePath" in failure:
            summary += f", failurePath {failure['failurePath'] or '(the whole command)'}"
    if "held" in end:
        summary += f" at step {end['held']['step']} (effect unknown, cause {end['held']['cause']})"
    if "stuck" in end:
        summary += f": step {end['stuck']} cannot be decided"
    lines.append(summary)
    wrong = mismatches(expect, end)
    lines.extend(wrong or ["as expected"])
    return lines
