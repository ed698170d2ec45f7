"""The offline workflow checker behind ``coordinatorctl workflow check`` and ``package``.

``check_source`` parses a ``workflow.yaml`` (``core.workflow.parse``) and then judges what
the shape alone cannot show: the input schema, the step graph (no loop, every step reachable,
every branch target a step), every ``${…}`` reference (the field is declared or kept, and the
step it reads has run on *every* path to the reader), and every call and wait against the
operation catalogue. The first problem found is raised as ``PackageInvalid`` with the dotted
path of the key an author has to change.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.errors import PackageInvalid
from core.paths import index, key
from core.workflow import catalogue
from core.workflow.expr import ExpressionError, Ref, parse_template, walk_strings
from core.workflow.jsonvalue import article, json_type_of, type_fits
from core.workflow.model import (
    MAX_SOURCE_BYTES,
    All,
    AnyOf,
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
    step_kind,
)
from core.workflow.parse import parse_source, refuse
from core.workflow.schema import check_schema, is_rfc3339, lookup

SOURCE_NAME = "workflow.yaml"


def check_source_dir(path: Path) -> Workflow:
    """Check the ``workflow.yaml`` of a workflow source folder (other files are ignored)."""
    return check_source(read_source(path))


def read_source(path: Path) -> bytes:
    """The bytes of ``<path>/workflow.yaml``, refusing a missing or oversized file."""
    if not path.is_dir():
        raise PackageInvalid(str(path), "is not a folder holding a workflow.yaml")
    file = path / SOURCE_NAME
    if not file.is_file():
        raise PackageInvalid(str(file), "is missing: a workflow source folder holds workflow.yaml")
    try:
        with file.open("rb") as handle:
            # Read one byte past the limit rather than trusting a size taken before the read.
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        raise PackageInvalid(str(file), "cannot be read") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise refuse(SOURCE_NAME, f"the file is larger than {MAX_SOURCE_BYTES:,} bytes (256 KiB)")
    return data


def check_source(source: bytes) -> Workflow:
    """Parse and check workflow source bytes; the checked ``Workflow`` or PackageInvalid."""
    workflow = parse_source(source)
    check_workflow(workflow)
    return workflow


def check_workflow(wf: Workflow) -> None:
    """Every rule beyond the document's shape; raises PackageInvalid at the first problem."""
    check_schema(dict(wf.input_schema), "input")
    for name, kind in wf.connections.items():
        if catalogue.connection_type(kind) is None:
            raise refuse(
                key("connections", name),
                f"'{kind}' is not a connection type (known: "
                + ", ".join(catalogue.CONNECTION_TYPES)
                + ")",
            )
    _check_targets(wf)
    order = _check_acyclic(wf)
    _check_reachable(wf)
    available = _available(wf, order)
    for step_id, step in wf.steps.items():
        _check_step(wf, step, key("steps", step_id), available[step_id])
    used = {s.connection for s in wf.steps.values() if isinstance(s, CallStep | WaitForStep)}
    for name in wf.connections:
        if name not in used:
            raise refuse(
                key("connections", name),
                "is declared but no step uses it; remove it so operators need not configure it",
            )


# ------------------------------------------------------------------------------------ the graph


def edge_path(step: Step, kind: str) -> str:
    """The dotted path of the key that makes edge ``kind`` leave ``step``."""
    base = key("steps", step.id)
    if kind.startswith("choose["):
        return key(key(base, "choose") + kind[len("choose") :], "next")
    return key(base, kind)


def _check_targets(wf: Workflow) -> None:
    for where, target in (("start", wf.start), ("onCancel", wf.on_cancel)):
        if target is not None and target not in wf.steps:
            raise refuse(where, f"names no step '{target}'")
    for step in wf.steps.values():
        for kind, target in step.edges():
            if target not in wf.steps:
                raise refuse(edge_path(step, kind), f"names no step '{target}'")
        if isinstance(step, FinishStep) and step.outcome not in wf.outcomes:
            raise refuse(
                key(key(key("steps", step.id), "finish"), "outcome"),
                f"'{step.outcome}' is not listed in outcomes (" + ", ".join(wf.outcomes) + ")",
            )


def _check_acyclic(wf: Workflow) -> list[str]:
    """A topological order of all steps; refuse the edge that closes a loop."""
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    trail: list[str] = []

    def visit(step_id: str) -> None:
        state[step_id] = 1
        trail.append(step_id)
        step = wf.steps[step_id]
        for kind, target in step.edges():
            if state.get(target) == 1:
                loop = [*trail[trail.index(target) :], target]
                raise refuse(
                    edge_path(step, kind),
                    "makes a loop (" + " → ".join(loop) + "); a workflow is acyclic",
                )
            if target not in state:
                visit(target)
        trail.pop()
        state[step_id] = 2
        order.append(step_id)

    for step_id in wf.steps:  # at most 64 steps: recursion depth stays small
        if step_id not in state:
            visit(step_id)
    order.reverse()
    return order


def _check_reachable(wf: Workflow) -> None:
    seen: set[str] = set()
    todo = [wf.start] + ([wf.on_cancel] if wf.on_cancel else [])
    while todo:
        step_id = todo.pop()
        if step_id not in seen:
            seen.add(step_id)
            todo.extend(target for _, target in wf.steps[step_id].edges())
    for step_id in wf.steps:
        if step_id not in seen:
            raise refuse(
                key("steps", step_id),
                "is never reached from start" + (" or onCancel" if wf.on_cancel else ""),
            )


def _available(wf: Workflow, order: list[str]) -> dict[str, frozenset[str]]:
    """For each step, the steps whose kept values exist whenever it runs.

    A step's values exist after it left along its ``next`` edge (not ``onRefused`` or
    ``onTimeout``). The run can enter at ``start``, and at ``onCancel`` from any point, so
    both entries contribute an empty set. Computed in topological order: the meet over all
    incoming edges, which equals "on every path" for an acyclic graph.
    """
    incoming: dict[str, list[frozenset[str]]] = {step_id: [] for step_id in wf.steps}
    incoming[wf.start].append(frozenset())
    if wf.on_cancel is not None:
        incoming[wf.on_cancel].append(frozenset())
    available: dict[str, frozenset[str]] = {}
    for step_id in order:
        sets = incoming[step_id]
        here = frozenset.intersection(*sets) if sets else frozenset()
        available[step_id] = here
        for kind, target in wf.steps[step_id].edges():
            incoming[target].append(here | {step_id} if kind == "next" else here)
    return available


# ---------------------------------------------------------------------------------- references


def _templates(value: Any, path: str) -> Iterator[tuple[str, str, list[Ref], Ref | None]]:
    """(path, text, refs, whole ref) of every string inside a value."""
    for where, text in walk_strings(value, path):
        try:
            template = parse_template(text)
        except ExpressionError as exc:
            raise refuse(where, str(exc)) from None
        yield where, text, list(template.refs), template.whole


class _Refs:
    """Judges references at one step: which roots are allowed and which steps precede it."""

    def __init__(
        self, wf: Workflow, available: frozenset[str], response: catalogue.Operation | None
    ):
        self.wf = wf
        self.available = available
        self.response = response  # set only while judging a call's output

    def check(self, ref: Ref, where: str) -> None:
        if self.response is not None and ref.root != "response":
            raise refuse(
                where,
                f"{ref.text}: output keeps values from the response, so only "
                "${response.<field>} can be used here",
            )
        if ref.root == "response":
            if self.response is None:
                raise refuse(
                    where, f"{ref.text}: ${{response.…}} can only be used inside a call's output"
                )
            field = self.response.response_field(ref.path[0])
            if field is None:
                raise refuse(
                    where,
                    f"{ref.text}: the response of {self.response.name} has no "
                    f"field '{ref.path[0]}' (it has: "
                    + ", ".join(f.name for f in self.response.response)
                    + ")",
                )
            if len(ref.path) > 1 and field.type not in ("object", "array"):
                raise refuse(
                    where, f"{ref.text}: '{field.name}' is {article(field.type)}; it has no fields"
                )
        elif ref.root == "input":
            node, why = lookup(dict(self.wf.input_schema), ref.path)
            if node is None:
                raise refuse(where, f"{ref.text}: {why}")
        elif ref.root == "steps":
            self._check_step_ref(ref, where)

    def _check_step_ref(self, ref: Ref, where: str) -> None:
        source_id, field = ref.path[0], ref.path[1]
        source = self.wf.steps.get(source_id)
        if source is None:
            raise refuse(where, f"{ref.text}: there is no step '{source_id}'")
        if not source.kept:
            raise refuse(where, f"{ref.text}: a {step_kind(source)} step keeps no values")
        if field not in source.kept:
            raise refuse(
                where,
                f"{ref.text}: step '{source_id}' keeps no field '{field}' "
                "(it keeps: " + ", ".join(source.kept) + ")",
            )
        if isinstance(source, WaitForStep) and len(ref.path) > 2:
            raise refuse(where, f"{ref.text}: '{field}' is a single value; it has no fields")
        if source_id not in self.available:
            raise refuse(
                where,
                f"{ref.text}: step '{source_id}' does not run before this step "
                "on every path, so its values may not exist here (a refused "
                "call or a timed-out wait keeps nothing)",
            )

    def type_of(self, ref: Ref) -> str | None:
        """The JSON type a reference has, when it is known offline."""
        if ref.root == "run":
            return "string"
        if ref.root == "input":
            node, _ = lookup(dict(self.wf.input_schema), ref.path)
            return None if node is None else str(node.get("type"))
        if ref.root == "response" and self.response is not None and len(ref.path) == 1:
            field = self.response.response_field(ref.path[0])
            return field.type if field else None
        if ref.root == "steps" and len(ref.path) == 2 and self.response is None:
            source = self.wf.steps.get(ref.path[0])
            if isinstance(source, WaitForStep):
                res = catalogue.result(
                    self.wf.connections.get(source.connection, ""), source.result
                )
                kept = res.result_field(ref.path[1]) if res else None
                return kept.type if kept else None
            if isinstance(source, CallStep) and ref.path[1] in source.output:
                op = _for_output(self.wf, source)
                # Output values may only read the response, so this cannot recurse.
                return None if op is None else self.static_type(source.output[ref.path[1]], op)
        return None

    def static_type(self, value: Any, response: catalogue.Operation | None = None) -> str | None:
        """The JSON type a value will have after evaluation, when it is known offline."""
        if not isinstance(value, str):
            return json_type_of(value)
        try:
            template = parse_template(value)
        except ExpressionError:
            return None
        if template.whole is None:
            return "string"
        judge = self if response is None else _Refs(self.wf, self.available, response)
        return judge.type_of(template.whole)

    def values(self, value: Any, path: str) -> None:
        """Check every reference inside ``value``."""
        for where, _text, refs, _whole in _templates(value, path):
            for ref in refs:
                self.check(ref, where)

    def predicate(self, predicate: Predicate, path: str) -> None:
        """Check every reference inside a predicate."""
        if isinstance(predicate, Equals):
            self.values([predicate.left, predicate.right], key(path, "equals"))
        elif isinstance(predicate, In):
            self.values([predicate.item, predicate.options], key(path, "in"))
            if isinstance(predicate.options, str):
                kind = self.static_type(predicate.options)
                if kind is not None and kind != "array":
                    raise refuse(
                        index(key(path, "in"), 1), f"must name a list, not {article(kind)}"
                    )
        elif isinstance(predicate, Exists):
            self.values(predicate.value, key(path, "exists"))
        elif isinstance(predicate, All | AnyOf):
            word = "all" if isinstance(predicate, All) else "any"
            for position, item in enumerate(predicate.items):
                self.predicate(item, index(key(path, word), position))
        elif isinstance(predicate, Not):
            self.predicate(predicate.item, key(path, "not"))


def _for_output(wf: Workflow, step: CallStep) -> catalogue.Operation | None:
    return catalogue.operation(wf.connections.get(step.connection, ""), step.operation)


# --------------------------------------------------------------------------------------- steps


def _connection_type(wf: Workflow, name: str, where: str, use: str) -> catalogue.ConnectionType:
    kind = wf.connections.get(name)
    if kind is None:
        raise refuse(
            where,
            f"'{name}' is not declared under connections; declare it with the type {use} needs",
        )
    found = catalogue.connection_type(kind)
    assert found is not None  # connection types were checked first
    return found


def _fields(
    judge: _Refs,
    given: dict[str, Any],
    fields: tuple[catalogue.Field, ...],
    path: str,
    owner: str,
    filled: tuple[tuple[str, str], ...] = (),
    extra: tuple[str, ...] = (),
) -> None:
    """Judge values written for catalogue fields: presence, unknown names, static types."""
    for name, value in given.items():
        where = key(path, name)
        spec = next((f for f in fields if f.name == name), None)
        if spec is None:
            source = dict(filled).get(name)
            if source is not None:
                raise refuse(
                    where,
                    f"is filled in by the coordinator from the connection's "
                    f"{source} setting; leave it out",
                )
            raise refuse(
                where,
                f"is not a field of {owner} (it may have: "
                + ", ".join([*extra, *(f.name for f in fields)])
                + ")",
            )
        judge.values(value, where)
        actual = judge.static_type(value)
        if actual is not None and not type_fits(actual, spec.type):
            raise refuse(
                where, f"must be {article(spec.type)}, but this value is {article(actual)}"
            )
    for spec in fields:
        if spec.required and spec.name not in given:
            raise refuse(key(path, spec.name), f"is missing: {owner} requires it")


def _check_step(wf: Workflow, step: Step, path: str, available: frozenset[str]) -> None:
    judge = _Refs(wf, available, None)
    if isinstance(step, CallStep):
        inner = key(path, "call")
        kind = _connection_type(wf, step.connection, key(inner, "connection"), "this call")
        op = kind.operations.get(step.operation)
        if op is None:
            raise refuse(
                key(inner, "operation"),
                f"'{step.operation}' is not an operation of {kind.name} connections (they "
                "offer: " + ", ".join(kind.operations) + ")",
            )
        _fields(
            judge, dict(step.input), op.command, key(inner, "input"), op.name, op.connection_fields
        )
        _Refs(wf, available, op).values(dict(step.output), key(inner, "output"))
    elif isinstance(step, ChooseStep):
        for position, branch in enumerate(step.branches):
            judge.predicate(branch.when, key(index(key(path, "choose"), position), "when"))
    elif isinstance(step, WaitUntilStep) and step.at is not None:
        where = key(key(path, "wait-until"), "at")
        judge.values(step.at, where)
        template = parse_template(step.at)
        if not template.refs and not is_rfc3339(step.at):
            raise refuse(where, "must be an RFC 3339 instant such as 2026-05-01T09:00:00Z")
        whole = template.whole
        if whole is not None:
            _check_instant_ref(wf, judge, whole, where)
    elif isinstance(step, WaitForStep):
        inner = key(path, "wait-for")
        kind = _connection_type(wf, step.connection, key(inner, "connection"), "this wait")
        res = kind.results.get(step.result)
        if res is None:
            raise refuse(
                key(inner, "result"),
                f"{kind.name} connections have no result '{step.result}'"
                + (
                    " (they have: " + ", ".join(kind.results) + ")"
                    if kind.results
                    else "; nothing can be waited for on them"
                ),
            )
        _fields(
            judge,
            dict(step.identifying),
            res.identifying,
            inner,
            f"a wait-for on {res.name}",
            extra=("connection", "result", "timeoutSeconds"),
        )


def _check_instant_ref(wf: Workflow, judge: _Refs, ref: Ref, where: str) -> None:
    kind = judge.type_of(ref)
    if kind is not None and kind != "string":
        raise refuse(where, f"{ref.text} is {article(kind)}, not an instant")
    if ref.root == "input":
        node, _ = lookup(dict(wf.input_schema), ref.path)
        if node is not None and node.get("format") != "date-time":
            raise refuse(
                where, f"{ref.text} must be declared with format: date-time in the input schema"
            )
