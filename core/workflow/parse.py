"""From ``workflow.yaml`` bytes to a ``Workflow``: the shape of the document.

This module judges structure only — keys, types, ranges, names — and refuses with the dotted
key path of the first problem. Whether the steps make a sound graph, whether references
resolve and whether calls fit the catalogue is ``core.workflow.check``'s work.
"""

from __future__ import annotations

import math
import re
from typing import Any

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


def refuse(path: str, reason: str) -> PackageInvalid:
    """The refusal every workflow rule raises."""
    return PackageInvalid(path or "workflow.yaml", reason)


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
) -> None:
    for name in value:
        if name not in allowed:
            raise refuse(
                key(path, name), f"is not a key of {where} (it may have: {', '.join(allowed)})"
            )
    for name in required:
        if name not in value:
            raise refuse(key(path, name), f"is missing: {where} needs it")


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


def load_document(source: bytes) -> dict[str, Any]:
    """Strictly load the YAML of a workflow source (size, YAML rules, plain data)."""
    if len(source) > MAX_SOURCE_BYTES:
        raise refuse(
            "workflow.yaml",
            f"the file is larger than {MAX_SOURCE_BYTES:,} bytes (256 KiB)",
        )
    document = yamlsafe.load(source, refuse)
    _plain(document, "")
    return _mapping(document, "workflow.yaml", "a mapping of workflow keys")


def parse_source(source: bytes) -> Workflow:
    """Parse workflow source bytes into a ``Workflow``; structure only, no cross-checks."""
    doc = load_document(source)
    _keys(doc, "", TOP_KEYS, TOP_REQUIRED, "a workflow")
    if doc["format"] != WORKFLOW_FORMAT:
        raise refuse("format", f"must be {WORKFLOW_FORMAT}")
    workflow_id = _name(doc["id"], "id", "a workflow id")
    version = doc["version"]
    if not isinstance(version, str) or not SEMVER.fullmatch(version):
        raise refuse("version", "must be a semantic version such as 1.2.0 (quote it in YAML)")
    description = _text(doc.get("description", ""), "description")
    input_schema = _mapping(doc["input"], "input", "a schema mapping")

    connections = _mapping(
        doc["connections"], "connections", "a mapping of connection names to connection types"
    )
    for name, kind in connections.items():
        _name(name, key("connections", name), "a connection name")
        if not isinstance(kind, str):
            raise refuse(key("connections", name), "must be a connection type name")

    outcomes = doc["outcomes"]
    if not isinstance(outcomes, list) or not outcomes:
        raise refuse("outcomes", "must be a non-empty list of outcome names")
    for position, outcome in enumerate(outcomes):
        _name(outcome, index("outcomes", position), "an outcome")
        if outcome in outcomes[:position]:
            raise refuse(index("outcomes", position), "is listed twice")

    steps_doc = _mapping(doc["steps"], "steps", "a mapping of step names to steps")
    if not steps_doc:
        raise refuse("steps", "a workflow needs at least one step")
    if len(steps_doc) > MAX_STEPS:
        raise refuse(
            "steps", f"has {len(steps_doc)} steps; a workflow may have at most {MAX_STEPS}"
        )
    steps: dict[str, Step] = {}
    for step_id, body in steps_doc.items():
        path = key("steps", step_id)
        _name(step_id, path, "a step name")
        steps[step_id] = _step(step_id, body, path, connections)

    on_cancel = doc.get("onCancel")
    return Workflow(
        id=workflow_id,
        version=version,
        description=description,
        input_schema=input_schema,
        connections=dict(connections),
        outcomes=tuple(outcomes),
        start=_step_ref(doc["start"], "start"),
        on_cancel=None if on_cancel is None else _step_ref(on_cancel, "onCancel"),
        steps=steps,
    )


def _step(step_id: str, body: Any, path: str, connections: dict[str, Any]) -> Step:
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
    _keys(body, path, allowed, (), f"a {kind} step")
    if "description" in body:
        _text(body["description"], key(path, "description"))
    if kind != "finish" and kind != "choose" and "next" not in body:
        raise refuse(
            key(path, "next"),
            "is missing: say where the run continues, so that every path ends in a finish step",
        )
    inner = key(path, kind)
    if kind == "call":
        return _call(step_id, body, inner, path)
    if kind == "choose":
        return _choose(step_id, body, inner, path)
    if kind == "wait-until":
        return _wait_until(step_id, body, inner, path)
    if kind == "wait-for":
        return _wait_for(step_id, body, inner, path, connections)
    spec = _mapping(body["finish"], inner, "a mapping with outcome")
    _keys(spec, inner, ("outcome",), ("outcome",), "finish")
    return FinishStep(
        id=step_id, outcome=_name(spec["outcome"], key(inner, "outcome"), "an outcome")
    )


def _call(step_id: str, body: dict[str, Any], inner: str, path: str) -> CallStep:
    spec = _mapping(body["call"], inner)
    _keys(spec, inner, CALL_KEYS, ("connection", "operation", "input"), "call")
    connection = _name(spec["connection"], key(inner, "connection"), "a connection name")
    operation = spec["operation"]
    if not isinstance(operation, str):
        raise refuse(key(inner, "operation"), "must be an operation name")
    command = _mapping(spec["input"], key(inner, "input"), "a mapping of command fields")
    output = _mapping(
        spec.get("output", {}),
        key(inner, "output"),
        "a mapping of names to values kept from the response",
    )
    for name in output:
        if not FIELD_NAME.fullmatch(name):
            raise refuse(
                key(key(inner, "output"), name),
                "kept value names are letters, digits, '_' and '-', starting with a letter or '_'",
            )
    deadline = DEFAULT_DEADLINE_SECONDS
    if "deadlineSeconds" in spec:
        deadline = _seconds(
            spec["deadlineSeconds"], key(inner, "deadlineSeconds"), 1, MAX_DEADLINE_SECONDS
        )
    on_refused = body.get("onRefused")
    return CallStep(
        id=step_id,
        connection=connection,
        operation=operation,
        input=command,
        output=output,
        deadline_seconds=deadline,
        next=_step_ref(body["next"], key(path, "next")),
        on_refused=None if on_refused is None else _step_ref(on_refused, key(path, "onRefused")),
    )


def _choose(step_id: str, body: dict[str, Any], inner: str, path: str) -> ChooseStep:
    entries = body["choose"]
    if not isinstance(entries, list) or not entries:
        raise refuse(inner, "must be a non-empty list of {when, next} entries")
    if "otherwise" not in body:
        raise refuse(
            key(path, "otherwise"),
            "is missing: a choose step needs a step for when no branch matches",
        )
    branches = []
    for position, entry in enumerate(entries):
        where = index(inner, position)
        entry = _mapping(entry, where, "a mapping with when and next")
        _keys(entry, where, ("when", "next"), ("when", "next"), "a choose branch")
        branches.append(
            Branch(
                when=parse_predicate(entry["when"], key(where, "when")),
                next=_step_ref(entry["next"], key(where, "next")),
            )
        )
    return ChooseStep(
        id=step_id,
        branches=tuple(branches),
        otherwise=_step_ref(body["otherwise"], key(path, "otherwise")),
    )


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


def _wait_until(step_id: str, body: dict[str, Any], inner: str, path: str) -> WaitUntilStep:
    spec = _mapping(body["wait-until"], inner, "a mapping with at or afterSeconds")
    _keys(spec, inner, ("at", "afterSeconds"), (), "wait-until")
    if ("at" in spec) == ("afterSeconds" in spec):
        raise refuse(inner, "needs exactly one of at (an instant) or afterSeconds")
    at = spec.get("at")
    if at is not None and not isinstance(at, str):
        raise refuse(key(inner, "at"), "must be an RFC 3339 instant or a ${...} expression")
    after = None
    if "afterSeconds" in spec:
        after = _seconds(spec["afterSeconds"], key(inner, "afterSeconds"), 1, MAX_AFTER_SECONDS)
    return WaitUntilStep(
        id=step_id, at=at, after_seconds=after, next=_step_ref(body["next"], key(path, "next"))
    )


def _wait_for(
    step_id: str, body: dict[str, Any], inner: str, path: str, connections: dict[str, Any]
) -> WaitForStep:
    spec = _mapping(body["wait-for"], inner)
    for name in ("connection", "result"):
        if name not in spec:
            raise refuse(key(inner, name), "is missing: wait-for needs it")
    connection = _name(spec["connection"], key(inner, "connection"), "a connection name")
    result_name = spec["result"]
    if not isinstance(result_name, str):
        raise refuse(key(inner, "result"), "must be a result name")
    timeout = None
    if "timeoutSeconds" in spec:
        timeout = _seconds(
            spec["timeoutSeconds"], key(inner, "timeoutSeconds"), 1, MAX_AFTER_SECONDS
        )
    on_timeout = body.get("onTimeout")
    if timeout is not None and on_timeout is None:
        raise refuse(
            key(path, "onTimeout"),
            "is missing: with timeoutSeconds, say which step runs when the wait times out",
        )
    if timeout is None and on_timeout is not None:
        raise refuse(key(path, "onTimeout"), "has no effect without wait-for.timeoutSeconds")
    identifying = {
        n: v for n, v in spec.items() if n not in ("connection", "result", "timeoutSeconds")
    }
    kind = connections.get(connection)
    known = catalogue.result(kind, result_name) if isinstance(kind, str) else None
    return WaitForStep(
        id=step_id,
        connection=connection,
        result=result_name,
        identifying=identifying,
        timeout_seconds=timeout,
        next=_step_ref(body["next"], key(path, "next")),
        on_timeout=None if on_timeout is None else _step_ref(on_timeout, key(path, "onTimeout")),
        result_fields=tuple(f.name for f in known.fields) if known else (),
    )
