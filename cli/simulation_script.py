"""The scripts of ``coordinatorctl workflow simulate`` and ``workflow test``: what a
script may say (answers and when events come, a cancel, what operators do after a hold, what
to expect), checked against the workflow before anything runs. Every refusal is
``request.invalid`` naming the script's key path (``answers.send-approval[1].status``), or
``input.invalid`` listing each input problem; :mod:`cli.simulate` runs what is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from core import clock
from core.codes import Code
from core.errors import CoordinatorError
from core.execution.classify import (
    Classified,
    classify_answer,
    classify_failure,
)
from core.products.http import (
    ANSWER_TOO_LARGE,
    CONNECTION_LOST,
    FRAMING_VIOLATION,
    NEVER_CONNECTED,
    TIMEOUT_AFTER_SEND,
    UNREADABLE_ANSWER,
    ExchangeFailure,
    retry_after_seconds,
)
from core.states import RunState, StepState
from core.workflow.model import (
    CallStep,
    WaitForStep,
    Workflow,
    step_kind,
)
from core.workflow.schema import is_rfc3339, validate_input
from core.yamlsafe import load as load_yaml

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

_SCRIPT_KEYS: Final = frozenset({"input", "startedAt", "answers", "cancel", "operator", "expect"})
OPERATOR_ACTIONS: Final = ("reconcile", "retry-same", "cancel")
_EXPECT_KEYS: Final = frozenset({"state", "outcome", "failure", "held", "steps", "path"})
_END_STATES: Final = (
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.CANCELLED,
    RunState.HELD,
    RunState.RUNNING,
)
"""The states a simulated run can end in (``running``: a step that cannot be decided)."""
_STEP_END_STATES: Final = (
    StepState.COMPLETED,
    StepState.REFUSED,
    StepState.FAILED,
    StepState.UNCERTAIN,
    StepState.CANCELLED,
    StepState.READY,
)
"""The states a step of a simulated run can be left in."""
_TIMEOUT: Final = "timeout"
_MAX_SECONDS: Final = 10 * 365 * 86_400


def refuse(path: str, reason: str) -> CoordinatorError:
    """A refusal of the script at ``path`` (a key path of the script, or empty)."""
    where = f"script: {path}: " if path else "script: "
    return CoordinatorError(Code.REQUEST_INVALID, f"{where}{reason}")


# ------------------------------------------------------------------------------------ the script


@dataclass(frozen=True)
class CallAnswer:
    """One scripted exchange of a call: an HTTP answer, or no answer at all."""

    status: int | None
    body: bytes
    no_answer: str | None = None
    retry_after: str | None = None
    """The answer's ``Retry-After`` header, when the script gives one."""

    def classified(self, now: datetime) -> Classified:
        """What the dispatcher's classification makes of it (at ``now``, which an HTTP-date
        in ``Retry-After`` is counted from)."""
        if self.no_answer is not None:
            failure = ExchangeFailure(self.no_answer, sent=FAILURE_CAUSES[self.no_answer])
            return classify_failure(failure)
        assert self.status is not None
        return classify_answer(self.status, self.body, retry_after_seconds(self.retry_after, now))

    def describe(self) -> str:
        if self.no_answer is not None:
            return f"no answer ({self.no_answer})"
        shown = f"{self.status} {self.body.decode('utf-8', 'replace')}".rstrip()
        return shown + (f" (Retry-After: {self.retry_after})" if self.retry_after else "")


@dataclass(frozen=True)
class Timing:
    """When a scripted event happens: at an instant, or some seconds after the run reaches
    the step it belongs to (for a cancel without a step: after the run starts)."""

    at: datetime | None = None
    after_seconds: int | None = None

    def when(self, reached: datetime) -> datetime:
        if self.at is not None:
            return self.at
        assert self.after_seconds is not None
        return reached + timedelta(seconds=self.after_seconds)


@dataclass(frozen=True)
class WaitAnswer:
    """The scripted end of a wait-for: a decision document (when it arrives, the moment the
    run reaches the step unless timed), or ``timeout``."""

    decision: Mapping[str, Any] | None
    timing: Timing | None = None


@dataclass(frozen=True)
class CancelPlan:
    """When an operator cancels the run: as it reaches ``step`` (before the step is worked
    on), or at a time (``timing``: an instant, or seconds after the run reaches ``step``, or
    after the run starts when no step is named)."""

    step: str | None
    timing: Timing | None = None


@dataclass(frozen=True)
class Script:
    """A parsed simulation script."""

    input: Any
    started_at: datetime
    calls: Mapping[str, tuple[CallAnswer, ...]]
    waits: Mapping[str, WaitAnswer]
    cancel: CancelPlan | None
    expect: Mapping[str, Any]
    operator: tuple[OperatorAction, ...] = ()
    """What operators do while the run is held, in order."""


@dataclass(frozen=True)
class OperatorAction:
    """One operator action on a held run (CONTRACT §10): when it comes (from the moment
    the run is held, at once unless timed), the receipt a reconcile reads, the answers a
    retry-same's resend gets."""

    action: str
    timing: Timing | None
    receipt: CallAnswer | None
    answers: tuple[CallAnswer, ...]


def _call_answers(value: Any, path: str) -> tuple[CallAnswer, ...]:
    """One answer, or a list of them, one per attempt."""
    if isinstance(value, list):
        if not value:
            raise refuse(path, "at least one answer")
        return tuple(_call_answer(v, f"{path}[{i}]") for i, v in enumerate(value))
    return (_call_answer(value, path),)


def _operator(value: Any) -> tuple[OperatorAction, ...]:
    items = value if isinstance(value, list) else [value]
    actions: list[OperatorAction] = []
    for index, item in enumerate(items):
        path = f"operator[{index}]" if isinstance(value, list) else "operator"
        if not isinstance(item, dict) or item.get("action") not in OPERATOR_ACTIONS:
            raise refuse(
                f"{path}.action" if isinstance(item, dict) else path,
                "one of " + ", ".join(OPERATOR_ACTIONS),
            )
        action = item["action"]
        allowed = {"action", "at", "afterSeconds"}
        allowed |= {"receipt"} if action == "reconcile" else set()
        allowed |= {"answer"} if action == "retry-same" else set()
        unknown = sorted(set(item) - allowed)
        if unknown:
            raise refuse(
                f"{path}.{unknown[0]}", f"not for {action}; use " + ", ".join(sorted(allowed))
            )
        receipt = _call_answer(item["receipt"], f"{path}.receipt") if "receipt" in item else None
        answers = _call_answers(item["answer"], f"{path}.answer") if "answer" in item else ()
        actions.append(OperatorAction(action, _timing(item, path), receipt, answers))
    return tuple(actions)


def _call_answer(value: Any, path: str) -> CallAnswer:
    if not isinstance(value, dict):
        raise refuse(path, "a call's answer is {status, body} or {noAnswer: <cause>}")
    unknown = sorted(set(value) - {"status", "body", "headers", "noAnswer"})
    if unknown:
        raise refuse(f"{path}.{unknown[0]}", "unknown key; use status, body, headers, noAnswer")
    if "noAnswer" in value:
        cause = value["noAnswer"]
        if cause not in FAILURE_CAUSES or len(value) > 1:
            raise refuse(f"{path}.noAnswer", f"one of {', '.join(sorted(FAILURE_CAUSES))}, alone")
        return CallAnswer(None, b"", cause)
    status = value.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise refuse(f"{path}.status", "an HTTP status, 100-599")
    body = value.get("body")
    if body is None:
        raw = b""
    elif isinstance(body, str):
        raw = body.encode()  # a body given as text is sent as it is (an unreadable one, say)
    else:
        raw = json.dumps(body).encode()
    headers = value.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int) and not isinstance(v, bool)
        for k, v in headers.items()
    ):
        raise refuse(f"{path}.headers", "a mapping of header names to text")
    unknown = sorted(name for name in headers if name.lower() != "retry-after")
    if unknown:
        raise refuse(f"{path}.headers.{unknown[0]}", "only Retry-After changes what happens")
    retry_after = next((str(v) for v in headers.values()), None)
    return CallAnswer(status, raw, retry_after=retry_after)


def _seconds(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SECONDS:
        raise refuse(path, f"whole seconds, 0 to {_MAX_SECONDS}")
    return value


def _timing(value: Mapping[str, Any], path: str) -> Timing | None:
    """The ``at`` or ``afterSeconds`` beside an event, if either is given (not both)."""
    if "at" in value and "afterSeconds" in value:
        raise refuse(f"{path}.afterSeconds", "give at or afterSeconds, not both")
    if "at" in value:
        return Timing(at=_instant(value["at"], f"{path}.at"))
    if "afterSeconds" in value:
        return Timing(after_seconds=_seconds(value["afterSeconds"], f"{path}.afterSeconds"))
    return None


def _wait_answer(value: Any, path: str) -> WaitAnswer:
    if value == _TIMEOUT:
        return WaitAnswer(None)
    shape = "a wait-for's answer is {decision: {outcome: …}} (with at or afterSeconds) or timeout"
    if not isinstance(value, dict) or "decision" not in value:
        raise refuse(path, shape)
    unknown = sorted(set(value) - {"decision", "at", "afterSeconds"})
    if unknown:
        raise refuse(f"{path}.{unknown[0]}", "unknown key; use decision, at, afterSeconds")
    decision = value["decision"]
    if not isinstance(decision, dict) or not isinstance(decision.get("outcome"), str):
        raise refuse(f"{path}.decision.outcome", "the decision's outcome, as text")
    return WaitAnswer(decision, _timing(value, path))


def _cancel_plan(workflow: Workflow, value: Any) -> CancelPlan | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = {"step": value}
    if not isinstance(value, dict):
        raise refuse("cancel", "a step id, or {step?, at | afterSeconds}")
    unknown = sorted(set(value) - {"step", "at", "afterSeconds"})
    if unknown:
        raise refuse(f"cancel.{unknown[0]}", "unknown key; use step, at, afterSeconds")
    step = value.get("step")
    if step is not None and (not isinstance(step, str) or step not in workflow.steps):
        where = "cancel" if set(value) == {"step"} else "cancel.step"
        raise refuse(where, "the id of a step the run is cancelled at")
    timing = _timing(value, "cancel")
    if step is None and timing is None:
        raise refuse("cancel", "a step id, or {step?, at | afterSeconds}")
    if step is not None and timing is not None and timing.at is not None:
        raise refuse("cancel.at", "an instant stands alone; with a step use afterSeconds")
    return CancelPlan(step, timing)


def _expectation(workflow: Workflow, expect: Any) -> Mapping[str, Any]:
    """``expect`` checked: the keys, a run state, the steps' states and the path named by
    step ids the workflow has. A value no run can give is refused, not compared."""
    if not isinstance(expect, dict) or "state" not in expect:
        raise refuse("expect", "required: at least the state the run ends in")
    unknown = sorted(set(expect) - _EXPECT_KEYS)
    if unknown:
        raise refuse(f"expect.{unknown[0]}", f"unknown key; use {', '.join(sorted(_EXPECT_KEYS))}")
    if expect["state"] not in _END_STATES:
        raise refuse("expect.state", "one of " + ", ".join(_END_STATES))
    steps = expect.get("steps")
    if steps is not None:
        if not isinstance(steps, dict) or not steps:
            raise refuse("expect.steps", "a mapping of step ids to states")
        for step_id, wanted in steps.items():
            path = f"expect.steps.{step_id}"
            if step_id not in workflow.steps:
                raise refuse(path, f"the workflow has no step '{step_id}'")
            state = wanted.get("state") if isinstance(wanted, dict) else wanted
            if isinstance(wanted, dict):
                extra = sorted(set(wanted) - {"state", "at"})
                if extra:
                    raise refuse(f"{path}.{extra[0]}", "unknown key; use state, at")
                if "at" in wanted:
                    _instant(wanted["at"], f"{path}.at")
            if state not in _STEP_END_STATES:
                raise refuse(
                    f"{path}.state" if isinstance(wanted, dict) else path,
                    "one of " + ", ".join(_STEP_END_STATES),
                )
    path_ids = expect.get("path")
    if path_ids is not None:
        if not isinstance(path_ids, list) or not path_ids:
            raise refuse("expect.path", "the ids of the steps the run takes, in order")
        for index, step_id in enumerate(path_ids):
            if step_id not in workflow.steps:
                raise refuse(f"expect.path[{index}]", f"the workflow has no step '{step_id}'")
    return expect


def _instant(value: Any, path: str) -> datetime:
    if isinstance(value, datetime):  # YAML reads an unquoted timestamp as one
        value = value.isoformat()
    if not isinstance(value, str) or not is_rfc3339(value):
        raise refuse(path, "an RFC 3339 instant, such as 2030-01-07T09:00:00Z")
    return clock.parse_instant(value)


def parse_script(workflow: Workflow, document: Any, run_input: Any = None) -> Script:
    """Check a script against ``workflow``; ``run_input`` (from ``--input-file``) replaces
    the script's ``input``. Refusals name the script's key path."""
    if not isinstance(document, dict):
        raise refuse("", "a script is a mapping with input, answers and expect")
    unknown = sorted(set(document) - _SCRIPT_KEYS)
    if unknown:
        raise refuse(unknown[0], "unknown key")
    if run_input is None:
        if "input" not in document:
            raise refuse("input", "required (or give --input-file)")
        run_input = document["input"]
    problems = validate_input(workflow.input_schema, run_input)
    if problems:
        every = "; ".join(f"{pointer or '/'}: {reason}" for pointer, reason in problems)
        raise CoordinatorError(Code.INPUT_INVALID, f"the input does not fit the workflow: {every}")
    answers = document.get("answers") or {}
    if not isinstance(answers, dict):
        raise refuse("answers", "a mapping of step ids to answers")
    calls: dict[str, tuple[CallAnswer, ...]] = {}
    waits: dict[str, WaitAnswer] = {}
    for step_id, value in answers.items():
        path = f"answers.{step_id}"
        step = workflow.steps.get(str(step_id))
        if step is None:
            raise refuse(path, f"the workflow has no step '{step_id}'")
        if isinstance(step, CallStep):
            calls[step.id] = _call_answers(value, path)
        elif isinstance(step, WaitForStep):
            answer = _wait_answer(value, path)
            if answer.decision is None and step.on_timeout is None:
                raise refuse(path, f"'{step.id}' has no timeoutSeconds: it cannot time out")
            waits[step.id] = answer
        else:
            raise refuse(path, f"'{step_id}' is a {step_kind(step)} step: nothing to answer")
    cancel = _cancel_plan(workflow, document.get("cancel"))
    expect = _expectation(workflow, document.get("expect"))
    started = _instant(document.get("startedAt", DEFAULT_STARTED_AT), "startedAt")
    cancel_at = cancel.timing.at if cancel is not None and cancel.timing is not None else None
    if cancel_at is not None and cancel_at < started:
        raise refuse("cancel.at", "before the run starts")
    operator = _operator(document["operator"]) if "operator" in document else ()
    return Script(run_input, started, calls, waits, cancel, expect, operator)


def read_script(workflow: Workflow, path: Path, input_file: Path | None = None) -> Script:
    """Read and check a script file (and the input file that replaces its ``input``)."""
    try:
        raw = path.read_bytes()
    except OSError:
        raise refuse("", f"{path}: cannot be read") from None
    document = load_yaml(raw, lambda where, reason: refuse(where, reason))
    run_input = None
    if input_file is not None:
        try:
            run_input = json.loads(input_file.read_bytes())
        except OSError:
            raise CoordinatorError(Code.REQUEST_INVALID, f"{input_file}: cannot be read") from None
        except ValueError:
            raise CoordinatorError(Code.REQUEST_INVALID, f"{input_file}: not JSON") from None
    return parse_script(workflow, document, run_input)
