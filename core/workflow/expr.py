"""Expressions inside workflow values: ``${input.…}``, ``${steps.…}``, ``${run.…}`` and
``${response.…}``.

A string that is exactly one ``${…}`` stands for the referenced value with its JSON type; a
string with text around (or several) expressions is interpolated into a string. There is no
arithmetic, no function and no escape syntax: the language stays small enough to check offline.

``render`` and ``holds`` evaluate values and predicates at run time; the offline checker uses
``parse_template`` and ``references`` to judge them before a package is built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from core.workflow.jsonvalue import json_equal
from core.workflow.model import All, AnyOf, Equals, Exists, In, Not, Predicate

# One name in a reference path. Digits alone index a list.
SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9_-]*"
_SEGMENT_RE = re.compile(SEGMENT)
_RUN_FIELDS = ("id", "startedAt")
ROOTS = ("input", "steps", "run", "response")


class ExpressionError(ValueError):
    """A malformed ``${…}``; the message is safe to show an author (it quotes no input)."""


class MissingValue(LookupError):
    """A reference that names nothing at run time; ``where`` is the reference text."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where} has no value")
        self.where = where


@dataclass(frozen=True)
class Ref:
    """One parsed reference: its root and the names after it."""

    root: str
    path: tuple[str, ...]

    @property
    def text(self) -> str:
        """The reference as written, for messages (``${steps.review.reviewId}``)."""
        return "${" + ".".join((self.root, *self.path)) + "}"


@dataclass(frozen=True)
class Template:
    """A parsed string: literal text and references in order."""

    parts: tuple[str | Ref, ...]

    @property
    def refs(self) -> tuple[Ref, ...]:
        """The references in this string, in order."""
        return tuple(p for p in self.parts if isinstance(p, Ref))

    @property
    def whole(self) -> Ref | None:
        """The reference when the string is exactly one ``${…}`` (it keeps its JSON type)."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Ref):
            return self.parts[0]
        return None


def _parse_ref(body: str) -> Ref:
    names = body.split(".")
    root, rest = names[0], tuple(names[1:])
    if root not in ROOTS:
        raise ExpressionError(
            f"'${{{body}}}' is not an expression this language knows; use input., steps., "
            "run. or response."
        )
    for name in rest:
        if not _SEGMENT_RE.fullmatch(name):
            raise ExpressionError(
                f"'${{{body}}}' has an empty or malformed name; names are letters, digits, "
                "'_' and '-' separated by dots"
            )
    if root == "input" and not rest:
        raise ExpressionError("'${input}' needs a field: write ${input.<field>}")
    if root == "response" and not rest:
        raise ExpressionError("'${response}' needs a field: write ${response.<field>}")
    if root == "steps" and len(rest) < 2:
        raise ExpressionError(f"'${{{body}}}' needs a step and a field: ${{steps.<step>.<field>}}")
    if root == "run" and (len(rest) != 1 or rest[0] not in _RUN_FIELDS):
        raise ExpressionError(f"'${{{body}}}' is not known: use ${{run.id}} or ${{run.startedAt}}")
    return Ref(root, rest)


def parse_template(text: str) -> Template:
    """Split a string into literal text and references; raise ExpressionError if malformed."""
    parts: list[str | Ref] = []
    position = 0
    while True:
        start = text.find("${", position)
        if start < 0:
            break
        end = text.find("}", start + 2)
        if end < 0:
            raise ExpressionError("a '${' is not closed by '}'")
        if start > position:
            parts.append(text[position:start])
        body = text[start + 2 : end]
        if "${" in body:
            raise ExpressionError("expressions cannot be nested")
        parts.append(_parse_ref(body))
        position = end + 1
    if position < len(text):
        parts.append(text[position:])
    return Template(tuple(parts))


def walk_strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string inside a plain value with its dotted path (``a.b[2]``)."""
    from core.paths import index, key

    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from walk_strings(item, key(path, str(name)))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from walk_strings(item, index(path, position))


# ------------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Scope:
    """What expressions can read while one step runs.

    ``steps`` holds, per step id, the values that step kept (a call's ``output``, a wait-for's
    result fields). ``response`` is set only while a call's ``output`` is mapped.
    """

    input: Any
    steps: Mapping[str, Mapping[str, Any]]
    run_id: str
    run_started_at: str
    response: Any = None
    has_response: bool = False


_ABSENT = object()


def _descend(value: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        if isinstance(value, dict):
            value = value.get(name, _ABSENT)
        elif isinstance(value, list) and name.isdigit() and int(name) < len(value):
            value = value[int(name)]
        else:
            return _ABSENT
        if value is _ABSENT:
            return _ABSENT
    return value


def _lookup(ref: Ref, scope: Scope) -> Any:
    if ref.root == "input":
        return _descend(scope.input, ref.path)
    if ref.root == "run":
        return scope.run_id if ref.path[0] == "id" else scope.run_started_at
    if ref.root == "response":
        return _descend(scope.response, ref.path) if scope.has_response else _ABSENT
    kept = scope.steps.get(ref.path[0])
    return _ABSENT if kept is None else _descend(dict(kept), ref.path[1:])


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def resolve(ref: Ref, scope: Scope) -> Any:
    """The value a reference names; MissingValue when it names nothing."""
    value = _lookup(ref, scope)
    if value is _ABSENT:
        raise MissingValue(ref.text)
    return value


def render(value: Any, scope: Scope) -> Any:
    """Evaluate every expression inside a plain value (mapping, list, string, scalar)."""
    if isinstance(value, str):
        template = parse_template(value)
        whole = template.whole
        if whole is not None:
            return resolve(whole, scope)
        if not template.refs:
            return value
        return "".join(
            _as_text(resolve(p, scope)) if isinstance(p, Ref) else p for p in template.parts
        )
    if isinstance(value, dict):
        return {name: render(item, scope) for name, item in value.items()}
    if isinstance(value, list):
        return [render(item, scope) for item in value]
    return value


def holds(predicate: Predicate, scope: Scope) -> bool:
    """Evaluate a ``choose`` predicate.

    ``exists`` is true for a present, non-null value; ``equals`` and ``in`` are false when a
    side names nothing.
    """
    # A reference that names nothing makes ``equals`` and ``in`` false rather than failing
    # the run: optional input fields are normal, and ``exists`` tests for them explicitly.
    try:
        if isinstance(predicate, Equals):
            return json_equal(render(predicate.left, scope), render(predicate.right, scope))
        if isinstance(predicate, In):
            item = render(predicate.item, scope)
            options = render(predicate.options, scope)
            return isinstance(options, list) and any(json_equal(item, o) for o in options)
    except MissingValue:
        return False
    if isinstance(predicate, Exists):
        ref = parse_template(predicate.value).whole
        if ref is None:
            return False
        value = _lookup(ref, scope)
        return value is not _ABSENT and value is not None
    if isinstance(predicate, All):
        return all(holds(p, scope) for p in predicate.items)
    if isinstance(predicate, AnyOf):
        return any(holds(p, scope) for p in predicate.items)
    if isinstance(predicate, Not):
        return not holds(predicate.item, scope)
    raise TypeError(f"unknown predicate {type(predicate).__name__}")  # pragma: no cover


def predicate_refs(predicate: Predicate) -> list[Ref]:
    """The references a predicate reads, in the order written, each once."""
    found: list[Ref] = []

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)

    def visit(p: Predicate) -> None:
        if isinstance(p, Equals):
            texts = [*strings(p.left), *strings(p.right)]
        elif isinstance(p, In):
            texts = [*strings(p.item), *strings(p.options)]
        elif isinstance(p, Exists):
            texts = [p.value]
        else:
            for item in p.items if isinstance(p, All | AnyOf) else (p.item,):
                visit(item)
            return
        for text in texts:
            for ref in parse_template(text).refs:
                if ref not in found:
                    found.append(ref)

    visit(predicate)
    return found


def read_value(ref: Ref, scope: Scope) -> Any:
    """The value a reference names, or None when it names nothing (as a trace shows it)."""
    value = _lookup(ref, scope)
    return None if value is _ABSENT else value
