"""The offline workflow checker behind ``coordinatorctl workflow check`` and ``package``.

``check_source`` parses a ``workflow.yaml`` (``core.workflow.parse``) and then judges what
the shape alone cannot show: the input schema, the step graph (no loop, every step reachable,
every branch target a step), every ``${…}`` reference (the field is declared or kept, and the
step it reads has run on *every* path to the reader), and every call and wait against the
operation catalogue. Each problem names the dotted path of the key an author has to change.

Every problem is reported in one run: the checker judges whatever parsed, and skips a rule
that would need a refused part — the graph as a whole when a step did not parse, whether a
step runs before another when the graph has a loop, an ``${input…}`` reference when the input
schema was refused. The first problem is raised as ``PackageInvalid``, carrying them all.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
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
from core.workflow.parse import Draft, load_marked_document, parse_document, refuse
from core.workflow.schema import check_schema, is_rfc3339, lookup
from core.yamlsafe import FAILED, Problems

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
    """Parse and check workflow source bytes; the checked ``Workflow`` or PackageInvalid.

    The refusal is the first problem found; it carries every problem (``extra["problems"]``).
    """
    document, marks = load_marked_document(source)
    problems = Problems(marks)
    draft = parse_document(document, problems)
    _judge(draft, problems)
    problems.raise_first()
    return draft.workflow()


class _Judge:
    """What every rule of one workflow consults: the draft, where problems go, and whether
    the input schema can be trusted for ``${input…}`` lookups."""

    def __init__(self, draft: Draft, problems: Problems, schema_ok: bool) -> None:
        self.draft = draft
        self.problems = problems
        schema = draft.input_schema
        self.schema = dict(schema) if schema_ok and schema is not FAILED else None

    def add(self, path: str, reason: str) -> None:
        self.problems.add(refuse(path, reason))


def _judge(d: Draft, problems: Problems) -> None:
    schema_ok = False
    schema = d.input_schema
    if schema is not FAILED:
        found = len(problems.errors)
        check_schema(dict(schema), "input", problems=problems)
        schema_ok = len(problems.errors) == found
    judge = _Judge(d, problems, schema_ok)
    for name, kind in d.connections.items():
        if catalogue.connection_type(kind) is None:
            judge.add(
                key("connections", name),
                f"'{kind}' is not a connection type (known: "
                + ", ".join(catalogue.CONNECTION_TYPES)
                + ")",
            )
    available: dict[str, frozenset[str]] | None = None
    if _check_targets(judge) and d.steps_complete:
        order = _check_acyclic(judge)
        _check_reachable(judge)
        if order is not None:
            available = _available(d, order)
    for step_id, step in d.steps.items():
        here = None if available is None else available[step_id]
        _check_step(judge, step, key("steps", step_id), here)
    if d.steps_complete and d.connections_complete:
        used = {s.connection for s in d.steps.values() if isinstance(s, CallStep | WaitForStep)}
        for name in d.connections:
            if name not in used:
                judge.add(
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


def _no_step(target: str, names: Iterable[str]) -> str:
    """The refusal of an edge to a step that does not exist, with the nearest step id when
    one is close enough to be a misspelling of it."""
    close = difflib.get_close_matches(target, list(names), n=1, cutoff=0.75)
    return f"names no step '{target}'" + (f"; did you mean '{close[0]}'?" if close else "")


def _check_targets(judge: _Judge) -> bool:
    """Whether the start, onCancel and every edge name a step (each that does not is kept)."""
    d = judge.draft
    names = d.step_names
    # Without the step names or the entries, the graph cannot be judged as a whole.
    whole = not (names is None or d.start is FAILED or d.on_cancel is FAILED)
    for where, target in (("start", d.start), ("onCancel", d.on_cancel)):
        if isinstance(target, str) and names is not None and target not in names:
            judge.add(where, _no_step(target, names))
            whole = False
    for step in d.steps.values():
        for kind, target in step.edges():
            if names is not None and target not in names:
                judge.add(edge_path(step, kind), _no_step(target, names))
                whole = False
        outcomes = d.outcomes
        if isinstance(step, FinishStep) and outcomes is not FAILED and step.outcome not in outcomes:
            judge.add(
                key(key(key("steps", step.id), "finish"), "outcome"),
                f"'{step.outcome}' is not listed in outcomes (" + ", ".join(outcomes) + ")",
            )
    return whole


def _check_acyclic(judge: _Judge) -> list[str] | None:
    """A topological order of all steps, or None when an edge closes a loop (each is kept)."""
    steps = judge.draft.steps
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    trail: list[str] = []
    looped = False

    def visit(step_id: str) -> None:
        nonlocal looped
        state[step_id] = 1
        trail.append(step_id)
        step = steps[step_id]
        for kind, target in step.edges():
            if state.get(target) == 1:
                loop = [*trail[trail.index(target) :], target]
                judge.add(
                    edge_path(step, kind),
                    "makes a loop (" + " → ".join(loop) + "); a workflow is acyclic",
                )
                looped = True
            elif target not in state:
                visit(target)
        trail.pop()
        state[step_id] = 2
        order.append(step_id)

    for step_id in steps:  # at most 64 steps: recursion depth stays small
        if step_id not in state:
            visit(step_id)
    order.reverse()
    return None if looped else order


def _check_reachable(judge: _Judge) -> None:
    d = judge.draft
    entries = [d.start, d.on_cancel]
    seen: set[str] = set()
    todo = [entry for entry in entries if isinstance(entry, str)]
    while todo:
        step_id = todo.pop()
        if step_id not in seen:
            seen.add(step_id)
            todo.extend(target for _, target in d.steps[step_id].edges())
    for step_id in d.steps:
        if step_id not in seen:
            judge.add(
                key("steps", step_id),
                "is never reached from start" + (" or onCancel" if d.on_cancel else ""),
            )


def _available(d: Draft, order: list[str]) -> dict[str, frozenset[str]]:
    """For each step, the steps whose kept values exist whenever it runs.

    A step's values exist after it left along its ``next`` edge (not ``onRefused`` or
    ``onTimeout``). The run can enter at ``start``, and at ``onCancel`` from any point, so
    both entries contribute an empty set. Computed in topological order: the meet over all
    incoming edges, which equals "on every path" for an acyclic graph.
    """
    incoming: dict[str, list[frozenset[str]]] = {step_id: [] for step_id in d.steps}
    for entry in (d.start, d.on_cancel):
        if isinstance(entry, str):
            incoming[entry].append(frozenset())
    available: dict[str, frozenset[str]] = {}
    for step_id in order:
        sets = incoming[step_id]
        here = frozenset.intersection(*sets) if sets else frozenset()
        available[step_id] = here
        for kind, target in d.steps[step_id].edges():
            incoming[target].append(here | {step_id} if kind == "next" else here)
    return available


# ---------------------------------------------------------------------------------- references


class _Refs:
    """Judges references at one step: which roots are allowed and which steps precede it.

    ``available`` is None when the graph could not be judged; then whether a step runs
    before this one is not judged either.
    """

    def __init__(
        self,
        judge: _Judge,
        available: frozenset[str] | None,
        response: catalogue.Operation | None,
    ):
        self.judge = judge
        self.draft = judge.draft
        self.available = available
        self.response = response  # set only while judging a call's output

    def check(self, ref: Ref, where: str) -> None:
        """Judge one reference; raises PackageInvalid for its problem."""
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
            if self.judge.schema is None:
                return  # the input schema was refused: nothing to look the field up in
            node, why = lookup(self.judge.schema, ref.path)
            if node is None:
                raise refuse(where, f"{ref.text}: {why}")
        elif ref.root == "steps":
            self._check_step_ref(ref, where)

    def _check_step_ref(self, ref: Ref, where: str) -> None:
        source_id, field = ref.path[0], ref.path[1]
        source = self.draft.steps.get(source_id)
        if source is None:
            names = self.draft.step_names
            if names is None or source_id in names:
                return  # that step was refused: what it keeps is unknown
            raise refuse(where, f"{ref.text}: there is no step '{source_id}'")
        if isinstance(source, WaitForStep) and self._result_of(source) is None:
            return  # its connection or result was refused: what it keeps is unknown
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
        if self.available is not None and source_id not in self.available:
            raise refuse(
                where,
                f"{ref.text}: step '{source_id}' does not run before this step "
                "on every path, so its values may not exist here (a refused "
                "call or a timed-out wait keeps nothing)",
            )

    def _result_of(self, step: WaitForStep) -> catalogue.Result | None:
        return catalogue.result(self.draft.connections.get(step.connection, ""), step.result)

    def type_of(self, ref: Ref) -> str | None:
        """The JSON type a reference has, when it is known offline."""
        if ref.root == "run":
            return "string"
        if ref.root == "input":
            if self.judge.schema is None:
                return None
            node, _ = lookup(self.judge.schema, ref.path)
            return None if node is None else str(node.get("type"))
        if ref.root == "response" and self.response is not None and len(ref.path) == 1:
            field = self.response.response_field(ref.path[0])
            return field.type if field else None
        if ref.root == "steps" and len(ref.path) == 2 and self.response is None:
            source = self.draft.steps.get(ref.path[0])
            if isinstance(source, WaitForStep):
                res = self._result_of(source)
                kept = res.result_field(ref.path[1]) if res else None
                return kept.type if kept else None
            if isinstance(source, CallStep) and ref.path[1] in source.output:
                op = _for_output(self.draft, source)
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
        judge = self if response is None else _Refs(self.judge, self.available, response)
        return judge.type_of(template.whole)

    def values(self, value: Any, path: str) -> None:
        """Judge every reference inside ``value``, keeping each problem."""
        problems = self.judge.problems
        for where, text in walk_strings(value, path):
            try:
                template = parse_template(text)
            except ExpressionError as exc:
                problems.add(refuse(where, str(exc)))
                continue
            for ref in template.refs:
                problems.attempt(self.check, ref, where)

    def predicate(self, predicate: Predicate, path: str) -> None:
        """Judge every reference inside a predicate."""
        if isinstance(predicate, Equals):
            self.values([predicate.left, predicate.right], key(path, "equals"))
        elif isinstance(predicate, In):
            self.values([predicate.item, predicate.options], key(path, "in"))
            if isinstance(predicate.options, str):
                kind = self.static_type(predicate.options)
                if kind is not None and kind != "array":
                    self.judge.add(
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


def _for_output(d: Draft, step: CallStep) -> catalogue.Operation | None:
    return catalogue.operation(d.connections.get(step.connection, ""), step.operation)


# --------------------------------------------------------------------------------------- steps


def _connection_type(
    judge: _Judge, name: str, where: str, use: str
) -> catalogue.ConnectionType | None:
    """The type of connection ``name``; None (and nothing more to judge) when it is not
    declared (kept as a problem), or its declaration was refused or names no type."""
    d = judge.draft
    kind = d.connections.get(name)
    if kind is None:
        if d.connection_names is not None and name not in d.connection_names:
            judge.add(
                where,
                f"'{name}' is not declared under connections; declare it with the type {use} needs",
            )
        return None
    return catalogue.connection_type(kind)


def _typed(value: Any, actual: str) -> str:
    """What has the wrong type, for a refusal: the value, or the one expression it is
    (``${input.count} is an integer``), so the author knows which declaration to look at."""
    whole = parse_template(value).whole if isinstance(value, str) else None
    if whole is None:
        return f"this value is {article(actual)}"
    if whole.root == "input":
        field = "/" + "/".join(whole.path)
        return f"{whole.text} is {article(actual)}, as the input schema declares {field}"
    return f"{whole.text} is {article(actual)}"


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
                judge.judge.add(
                    where,
                    f"is filled in by the coordinator from the connection's "
                    f"{source} setting; leave it out",
                )
            else:
                judge.judge.add(
                    where,
                    f"is not a field of {owner} (it may have: "
                    + ", ".join([*extra, *(f.name for f in fields)])
                    + ")",
                )
            continue
        judge.values(value, where)
        actual = judge.static_type(value)
        if actual is not None and not type_fits(actual, spec.type):
            judge.judge.add(where, f"must be {article(spec.type)}, but {_typed(value, actual)}")
    for spec in fields:
        if spec.required and spec.name not in given:
            judge.judge.add(key(path, spec.name), f"is missing: {owner} requires it")


def _check_step(judge: _Judge, step: Step, path: str, available: frozenset[str] | None) -> None:
    refs = _Refs(judge, available, None)
    if isinstance(step, CallStep):
        inner = key(path, "call")
        kind = _connection_type(judge, step.connection, key(inner, "connection"), "this call")
        if kind is None:
            return
        op = kind.operations.get(step.operation)
        if op is None:
            judge.add(
                key(inner, "operation"),
                f"'{step.operation}' is not an operation of {kind.name} connections (they "
                "offer: " + ", ".join(kind.operations) + ")",
            )
            return
        _fields(
            refs, dict(step.input), op.command, key(inner, "input"), op.name, op.connection_fields
        )
        _Refs(judge, available, op).values(dict(step.output), key(inner, "output"))
    elif isinstance(step, ChooseStep):
        for position, branch in enumerate(step.branches):
            refs.predicate(branch.when, key(index(key(path, "choose"), position), "when"))
    elif isinstance(step, WaitUntilStep) and step.at is not None:
        where = key(key(path, "wait-until"), "at")
        refs.values(step.at, where)
        try:
            template = parse_template(step.at)
        except ExpressionError:
            return  # kept by values() above
        if not template.refs and not is_rfc3339(step.at):
            judge.add(where, "must be an RFC 3339 instant such as 2026-05-01T09:00:00Z")
        whole = template.whole
        if whole is not None:
            _check_instant_ref(judge, refs, whole, where)
    elif isinstance(step, WaitForStep):
        inner = key(path, "wait-for")
        kind = _connection_type(judge, step.connection, key(inner, "connection"), "this wait")
        if kind is None:
            return
        res = kind.results.get(step.result)
        if res is None:
            judge.add(
                key(inner, "result"),
                f"{kind.name} connections have no result '{step.result}'"
                + (
                    " (they have: " + ", ".join(kind.results) + ")"
                    if kind.results
                    else "; nothing can be waited for on them"
                ),
            )
            return
        _fields(
            refs,
            dict(step.identifying),
            res.identifying,
            inner,
            f"a wait-for on {res.name}",
            extra=("connection", "result", "timeoutSeconds"),
        )


def _check_instant_ref(judge: _Judge, refs: _Refs, ref: Ref, where: str) -> None:
    kind = refs.type_of(ref)
    if kind is not None and kind != "string":
        judge.add(where, f"{ref.text} is {article(kind)}, not an instant")
        return
    if ref.root == "input" and judge.schema is not None:
        node, _ = lookup(judge.schema, ref.path)
        if node is not None and node.get("format") != "date-time":
            judge.add(
                where, f"{ref.text} must be declared with format: date-time in the input schema"
            )
