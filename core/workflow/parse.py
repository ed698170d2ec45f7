"""From ``workflow.yaml`` bytes to a ``Workflow``: the shape of the document.

This module judges structure only — keys, types, ranges, names — and refuses with the dotted
key path of each problem. Whether the steps make a sound graph, whether references resolve
and whether calls fit the catalogue is ``core.workflow.check``'s work.

A source that is not strict, plain YAML is refused at once. Otherwise every key and step is
judged and each problem kept (:class:`core.yamlsafe.Problems`) in source order; what parsed
is kept in a :class:`Draft`, so the checker can judge those parts too. A part that depends on
a refused one (a call's fields when the call block is not a mapping) is not judged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from core import yamlsafe
from core.errors import PackageInvalid
from core.paths import index, key
from core.workflow import catalogue
from core.workflow.expr import ExpressionError, parse_template
from core.workflow.model import (
    DEFAULT_DEADLINE_SECONDS,
    MAX_SOURCE_BYTES,
    MAX_STEPS,
    STEP_KINDS,
    WORKFLOW_FORMAT,
    All,
    AnyOf,
    Branch,
    CallStep,
    ChooseStep,
    Equals,
    Exists,
    FinishStep,
    In,
    Not,
    Predicate,
    Step,
    WaitForStep,
    WaitUntilStep,
    Workflow,
)
from core.yamlsafe import FAILED, AlreadyReported, Marks, Maybe, Problems, need, need_all

NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
# Semantic Versioning 2.0.0, as its specification writes it.
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
MAX_AFTER_SECONDS = 31_536_000
MAX_DEADLINE_SECONDS = 86_400
MAX_DESCRIPTION = 2000

TOP_KEYS = (
    "format",
    "id",
    "version",
    "description",
    "input",
    "connections",
    "outcomes",
    "start",
    "onCancel",
    "steps",
)
TOP_REQUIRED = ("format", "id", "version", "input", "connections", "outcomes", "start", "steps")
# Keys allowed beside the type key of each step kind.
BESIDE = {
    "call": ("next", "onRefused"),
    "choose": ("otherwise",),
    "wait-until": ("next",),
    "wait-for": ("next", "onTimeout"),
    "finish": (),
}
CALL_KEYS = ("connection", "operation", "input", "output", "deadlineSeconds")
PREDICATES = ("equals", "in", "exists", "all", "any", "not")


T = TypeVar("T")
P = ParamSpec("P")


def refuse(path: str, reason: str) -> PackageInvalid:
    """The refusal every workflow rule raises."""
    return PackageInvalid(path or "workflow.yaml", reason)


@dataclass
class Draft:
    """What of a workflow source parsed; FAILED marks a part that was refused.

    ``steps`` holds the steps that parsed, ``step_names`` every name under ``steps`` (None
    when ``steps`` itself was refused); ``connections`` the declarations that parsed and
    ``connection_names`` every declared name.
    """

    id: Maybe[str] = FAILED
    version: Maybe[str] = FAILED
    description: Maybe[str] = FAILED
    input_schema: Maybe[Mapping[str, Any]] = FAILED
    connections: dict[str, str] = field(default_factory=dict)
    connection_names: frozenset[str] | None = None
    outcomes: Maybe[tuple[str, ...]] = FAILED
    start: Maybe[str] = FAILED
    on_cancel: Maybe[str | None] = None
    steps: dict[str, Step] = field(default_factory=dict)
    step_names: frozenset[str] | None = None
    steps_complete: bool = False
    """Every step parsed and their number is allowed: the graph can be judged as a whole."""

    @property
    def connections_complete(self) -> bool:
        """Every declared connection parsed."""
        return self.connection_names is not None and set(self.connections) == set(
            self.connection_names
        )

    def workflow(self) -> Workflow:
        """The whole workflow; only when nothing was refused."""
        if not (self.steps_complete and self.connections_complete):
            raise AlreadyReported
        return Workflow(
            id=need(self.id),
            version=need(self.version),
            description=need(self.description),
            input_schema=need(self.input_schema),
            connections=dict(self.connections),
            outcomes=need(self.outcomes),
            start=need(self.start),
            on_cancel=need(self.on_cancel),
            steps=dict(self.steps),
        )


def _member(
    problems: Problems,
    values: dict[str, Any],
    name: str,
    path: str,
    reader: Callable[Concatenate[Any, str, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> Maybe[T]:
    """``values[name]`` through ``reader``; FAILED when absent (reported by :func:`_keys`) or
    refused."""
    if name not in values:
        return FAILED
    return problems.attempt(reader, values[name], key(path, name), *args, **kwargs)


def _mapping(value: Any, path: str, what: str = "a mapping") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise refuse(path, f"must be {what}")
    return value


def _keys(
    value: dict[str, Any],
    path: str,
    allowed: tuple[str, ...],
    required: tuple[str, ...],
    where: str,
    problems: Problems,
) -> None:
    """Keep a problem for every key not allowed, then for every required key missing."""
    for name in value:
        if name not in allowed:
            problems.add(
                refuse(
                    key(path, name), f"is not a key of {where} (it may have: {', '.join(allowed)})"
                )
            )
    for name in required:
        if name not in value:
            problems.add(refuse(key(path, name), f"is missing: {where} needs it"))


def _name(value: Any, path: str, what: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise refuse(
            path, f"{what} must be 1–63 characters of a-z, 0-9 and '-', starting with a letter"
        )
    return value


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise refuse(path, f"must be text of at most {MAX_DESCRIPTION} characters")
    return value


def _seconds(value: Any, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise refuse(path, f"must be a whole number of seconds from {low:,} to {high:,}")
    return value


def _plain(value: Any, path: str) -> None:
    """Refuse what JSON cannot hold: non-text keys (YAML reads ``on:`` as true) and ±inf/NaN."""
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                raise refuse(
                    key(path, str(name)),
                    "keys must be text; quote it (YAML reads some words as booleans or numbers)",
                )
            _plain(item, key(path, name))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            _plain(item, index(path, position))
    elif isinstance(value, float) and not math.isfinite(value):
        raise refuse(path, "must be a finite number")


def _step_ref(value: Any, path: str) -> str:
    return _name(value, path, "a step name")


def load_marked_document(source: bytes) -> tuple[dict[str, Any], Marks]:
    """Strictly load the YAML of a workflow source (size, YAML rules, plain data), and say
    where each key path of the source sits.

    A source that is not plain data is refused at once, with that one problem.
    """
    if len(source) > MAX_SOURCE_BYTES:
        raise refuse(
            "workflow.yaml",
            f"the file is larger than {MAX_SOURCE_BYTES:,} bytes (256 KiB)",
        )
    document, marks = yamlsafe.load_marked(source, refuse)
    _plain(document, "")
    return _mapping(document, "workflow.yaml", "a mapping of workflow keys"), marks


def parse_document(doc: dict[str, Any], problems: Problems) -> Draft:
    """Judge the shape of a loaded workflow document, keeping every problem."""
    draft = Draft()
    _keys(doc, "", TOP_KEYS, TOP_REQUIRED, "a workflow", problems)
    if "format" in doc and doc["format"] != WORKFLOW_FORMAT:
        problems.add(refuse("format", f"must be {WORKFLOW_FORMAT}"))
    draft.id = _member(problems, doc, "id", "", _name, "a workflow id")
    draft.version = _member(problems, doc, "version", "", _version)
    draft.description = problems.attempt(_text, doc.get("description", ""), "description")
    draft.input_schema = _member(problems, doc, "input", "", _mapping, "a schema mapping")
    if "connections" in doc:
        problems.attempt(_connections, doc["connections"], draft, problems)
    draft.outcomes = _member(problems, doc, "outcomes", "", _outcomes, problems)
    if "steps" in doc:
        problems.attempt(_steps, doc["steps"], draft, problems)
    draft.start = _member(problems, doc, "start", "", _step_ref)
    on_cancel = doc.get("onCancel")
    if on_cancel is not None:
        draft.on_cancel = problems.attempt(_step_ref, on_cancel, "onCancel")
    return draft


def _version(value: Any, path: str) -> str:
    if not isinstance(value, str) or not SEMVER.fullmatch(value):
        raise refuse(path, "must be a semantic version such as 1.2.0 (quote it in YAML)")
    return value


def _connections(value: Any, draft: Draft, problems: Problems) -> None:
    connections = _mapping(
        value, "connections", "a mapping of connection names to connection types"
    )
    draft.connection_names = frozenset(connections)
    for name, kind in connections.items():
        path = key("connections", name)
        named = problems.attempt(_name, name, path, "a connection name")
        if not isinstance(kind, str):
            problems.add(refuse(path, "must be a connection type name"))
        elif named is not FAILED:
            draft.connections[name] = kind


def _outcomes(value: Any, path: str, problems: Problems) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise refuse(path, "must be a non-empty list of outcome names")
    outcomes: list[Maybe[str]] = []
    for position, outcome in enumerate(value):
        where = index(path, position)
        named = problems.attempt(_name, outcome, where, "an outcome")
        if named is not FAILED and named in outcomes:
            problems.add(refuse(where, "is listed twice"))
            named = FAILED
        outcomes.append(named)
    return tuple(need_all(outcomes))


def _steps(value: Any, draft: Draft, problems: Problems) -> None:
    steps_doc = _mapping(value, "steps", "a mapping of step names to steps")
    draft.step_names = frozenset(steps_doc)
    complete = True
    if not steps_doc:
        problems.add(refuse("steps", "a workflow needs at least one step"))
        complete = False
    if len(steps_doc) > MAX_STEPS:
        problems.add(
            refuse("steps", f"has {len(steps_doc)} steps; a workflow may have at most {MAX_STEPS}")
        )
        complete = False
    for step_id, body in steps_doc.items():
        path = key("steps", step_id)
        named = problems.attempt(_name, step_id, path, "a step name")
        step = problems.attempt(_step, step_id, body, path, draft.connections, problems)
        if named is FAILED or step is FAILED:
            complete = False
        else:
            draft.steps[step_id] = step
    draft.steps_complete = complete


def _step(
    step_id: str, body: Any, path: str, connections: dict[str, str], problems: Problems
) -> Step:
    body = _mapping(body, path, "a mapping with one of " + ", ".join(STEP_KINDS))
    kinds = [name for name in body if name in STEP_KINDS]
    if not kinds:
        unknown = next((n for n in body if n != "description"), None)
        if unknown is not None and unknown not in ("next", "onRefused", "otherwise", "onTimeout"):
            raise refuse(
                key(path, unknown), "is not a step type (use one of " + ", ".join(STEP_KINDS) + ")"
            )
        raise refuse(path, "a step needs exactly one of " + ", ".join(STEP_KINDS))
    if len(kinds) > 1:
        raise refuse(
            key(path, kinds[1]), f"a step has one type, and this one is already {kinds[0]}"
        )
    kind = kinds[0]
    allowed = (kind, *BESIDE[kind], "description")
    # An unknown key or a refused description leaves the step itself usable: it is
    # reported, and the step still takes part in the graph.
    _keys(body, path, allowed, (), f"a {kind} step", problems)
    if "description" in body:
        problems.attempt(_text, body["description"], key(path, "description"))
    if kind != "finish" and kind != "choose" and "next" not in body:
        problems.add(
            refuse(
                key(path, "next"),
                "is missing: say where the run continues, so that every path ends in a finish step",
            )
        )
    inner = key(path, kind)
    if kind == "call":
        return _call(step_id, body, inner, path, problems)
    if kind == "choose":
        return _choose(step_id, body, inner, path, problems)
    if kind == "wait-until":
        return _wait_until(step_id, body, inner, path, problems)
    if kind == "wait-for":
        return _wait_for(step_id, body, inner, path, connections, problems)
    return _finish(step_id, body, inner, problems)


def _finish(step_id: str, body: dict[str, Any], inner: str, problems: Problems) -> FinishStep:
    spec = _mapping(body["finish"], inner, "a mapping with outcome")
    _keys(spec, inner, ("outcome",), ("outcome",), "finish", problems)
    outcome = _member(problems, spec, "outcome", inner, _name, "an outcome")
    return FinishStep(id=step_id, outcome=need(outcome))


def _output_names(value: Any, path: str, problems: Problems) -> dict[str, Any]:
    output = _mapping(value, path, "a mapping of names to values kept from the response")
    bad = False
    for name in output:
        if not FIELD_NAME.fullmatch(name):
            problems.add(
                refuse(
                    key(path, name),
                    "kept value names are letters, digits, '_' and '-', "
                    "starting with a letter or '_'",
                )
            )
            bad = True
    if bad:
        raise AlreadyReported
    return output


def _operation(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise refuse(path, "must be an operation name")
    return value


def _call(
    step_id: str, body: dict[str, Any], inner: str, path: str, problems: Problems
) -> CallStep:
    spec = _mapping(body["call"], inner)
    _keys(spec, inner, CALL_KEYS, ("connection", "operation", "input"), "call", problems)
    connection = _member(problems, spec, "connection", inner, _name, "a connection name")
    operation = _member(problems, spec, "operation", inner, _operation)
    command = _member(problems, spec, "input", inner, _mapping, "a mapping of command fields")
    output = problems.attempt(_output_names, spec.get("output", {}), key(inner, "output"), problems)
    deadline = (
        _member(problems, spec, "deadlineSeconds", inner, _seconds, 1, MAX_DEADLINE_SECONDS)
        if "deadlineSeconds" in spec
        else DEFAULT_DEADLINE_SECONDS
    )
    following = _member(problems, body, "next", path, _step_ref)
    on_refused = body.get("onRefused")
    refused_step = (
        None
        if on_refused is None
        else problems.attempt(_step_ref, on_refused, key(path, "onRefused"))
    )
    return CallStep(
        id=step_id,
        connection=need(connection),
        operation=need(operation),
        input=need(command),
        output=need(output),
        deadline_seconds=need(deadline),
        next=need(following),
        on_refused=need(refused_step),
    )


def _choose(
    step_id: str, body: dict[str, Any], inner: str, path: str, problems: Problems
) -> ChooseStep:
    entries = body["choose"]
    if not isinstance(entries, list) or not entries:
        raise refuse(inner, "must be a non-empty list of {when, next} entries")
    if "otherwise" not in body:
        problems.add(
            refuse(
                key(path, "otherwise"),
                "is missing: a choose step needs a step for when no branch matches",
            )
        )
    branches = [
        problems.attempt(_branch, entry, index(inner, position), problems)
        for position, entry in enumerate(entries)
    ]
    otherwise = _member(problems, body, "otherwise", path, _step_ref)
    return ChooseStep(id=step_id, branches=tuple(need_all(branches)), otherwise=need(otherwise))


def _branch(value: Any, where: str, problems: Problems) -> Branch:
    entry = _mapping(value, where, "a mapping with when and next")
    _keys(entry, where, ("when", "next"), ("when", "next"), "a choose branch", problems)
    when: Maybe[Predicate] = _member(problems, entry, "when", where, parse_predicate)
    following = _member(problems, entry, "next", where, _step_ref)
    if when is FAILED:  # (need() would widen the predicate union to object)
        raise AlreadyReported
    return Branch(when=when, next=need(following))


def parse_predicate(value: Any, path: str) -> Predicate:
    """Parse one predicate mapping (``equals``, ``in``, ``exists``, ``all``, ``any``, ``not``)."""
    spec = _mapping(value, path, "a predicate: one of " + ", ".join(PREDICATES))
    if len(spec) != 1:
        raise refuse(path, "a predicate has exactly one key: one of " + ", ".join(PREDICATES))
    ((word, arg),) = spec.items()
    where = key(path, word)
    if word not in PREDICATES:
        raise refuse(where, "is not a predicate (use one of " + ", ".join(PREDICATES) + ")")
    if word == "equals":
        if not isinstance(arg, list) or len(arg) != 2:
            raise refuse(where, "must be a list of two values: [a, b]")
        return Equals(arg[0], arg[1])
    if word == "in":
        if not isinstance(arg, list) or len(arg) != 2:
            raise refuse(where, "must be a list of a value and a list: [a, [x, y]]")
        if not isinstance(arg[1], list | str):
            raise refuse(index(where, 1), "must be a list of values or one ${...} naming a list")
        return In(arg[0], arg[1])
    if word == "exists":
        template = None
        if isinstance(arg, str):
            try:
                template = parse_template(arg).whole
            except ExpressionError as exc:
                raise refuse(where, str(exc)) from None
        if template is None:
            raise refuse(where, "must be exactly one ${...} reference")
        return Exists(arg)
    if word in ("all", "any"):
        if not isinstance(arg, list) or not arg:
            raise refuse(where, "must be a non-empty list of predicates")
        items = tuple(parse_predicate(p, index(where, i)) for i, p in enumerate(arg))
        return All(items) if word == "all" else AnyOf(items)
    return Not(parse_predicate(arg, where))


def _wait_until(
    step_id: str, body: dict[str, Any], inner: str, path: str, problems: Problems
) -> WaitUntilStep:
    spec = _mapping(body["wait-until"], inner, "a mapping with at or afterSeconds")
    _keys(spec, inner, ("at", "afterSeconds"), (), "wait-until", problems)
    exactly_one = ("at" in spec) != ("afterSeconds" in spec)
    if not exactly_one:
        problems.add(refuse(inner, "needs exactly one of at (an instant) or afterSeconds"))
    at = spec.get("at")
    if at is not None and not isinstance(at, str):
        problems.add(refuse(key(inner, "at"), "must be an RFC 3339 instant or a ${...} expression"))
        exactly_one = False
    after: Maybe[int | None] = None
    if "afterSeconds" in spec:
        after = _member(problems, spec, "afterSeconds", inner, _seconds, 1, MAX_AFTER_SECONDS)
    following = _member(problems, body, "next", path, _step_ref)
    if not exactly_one:
        raise AlreadyReported
    return WaitUntilStep(
        id=step_id,
        at=at if isinstance(at, str) else None,
        after_seconds=need(after),
        next=need(following),
    )


def _wait_for(
    step_id: str,
    body: dict[str, Any],
    inner: str,
    path: str,
    connections: dict[str, str],
    problems: Problems,
) -> WaitForStep:
    spec = _mapping(body["wait-for"], inner)
    for name in ("connection", "result"):
        if name not in spec:
            problems.add(refuse(key(inner, name), "is missing: wait-for needs it"))
    connection = _member(problems, spec, "connection", inner, _name, "a connection name")
    result_name = _member(problems, spec, "result", inner, _result_name)
    timeout: Maybe[int | None] = None
    if "timeoutSeconds" in spec:
        timeout = _member(problems, spec, "timeoutSeconds", inner, _seconds, 1, MAX_AFTER_SECONDS)
    # Whether onTimeout belongs depends on timeoutSeconds being written, not on its value.
    on_timeout = body.get("onTimeout")
    timed = "timeoutSeconds" in spec
    on_timeout_step: Maybe[str | None] = None
    if timed and on_timeout is None:
        problems.add(
            refuse(
                key(path, "onTimeout"),
                "is missing: with timeoutSeconds, say which step runs when the wait times out",
            )
        )
        on_timeout_step = FAILED
    elif not timed and on_timeout is not None:
        problems.add(
            refuse(key(path, "onTimeout"), "has no effect without wait-for.timeoutSeconds")
        )
        on_timeout_step = FAILED
    following = _member(problems, body, "next", path, _step_ref)
    if on_timeout is not None and on_timeout_step is not FAILED:
        on_timeout_step = problems.attempt(_step_ref, on_timeout, key(path, "onTimeout"))
    identifying = {
        n: v for n, v in spec.items() if n not in ("connection", "result", "timeoutSeconds")
    }
    kind = connections.get(connection) if connection is not FAILED else None
    known = (
        catalogue.result(kind, result_name)
        if isinstance(kind, str) and isinstance(result_name, str)
        else None
    )
    return WaitForStep(
        id=step_id,
        connection=need(connection),
        result=need(result_name),
        identifying=identifying,
        timeout_seconds=need(timeout),
        next=need(following),
        on_timeout=need(on_timeout_step),
        result_fields=tuple(f.name for f in known.fields) if known else (),
    )


def _result_name(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise refuse(path, "must be a result name")
    return value
