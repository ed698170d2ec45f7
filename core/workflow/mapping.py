"""Evaluating a call's ``input`` and ``output`` mappings, with the JSON pointer of whatever
went wrong (CONTRACT §8.3: ``failurePath`` is a pointer, never a value).

A command is mapped field by field so that a reference naming nothing at run time (an
optional input field that is absent, say) is reported at the command field it feeds; the
mapped command is then checked against the operation's command schema. The output mapping
reads ``${response.…}``; a field the product left out, or one whose JSON type differs from
the catalogue's, makes the mapping fail at that output name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from core.workflow.catalogue import Operation, validate_command
from core.workflow.expr import ExpressionError, MissingValue, Scope, parse_template, render
from core.workflow.jsonvalue import json_type_of, pointer_token, type_fits


@dataclass(frozen=True)
class Mapped:
    """A mapped value, or the pointer of the first place it could not be mapped."""

    value: Any = None
    failure_path: str | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Whether the mapping succeeded."""
        return self.failure_path is None


class _Failed(Exception):
    def __init__(self, pointer: str, reason: str) -> None:
        super().__init__(pointer)
        self.pointer = pointer
        self.reason = reason


def _render_at(template: Any, scope: Scope, pointer: str) -> Any:
    if isinstance(template, dict):
        return {
            name: _render_at(item, scope, f"{pointer}/{pointer_token(str(name))}")
            for name, item in template.items()
        }
    if isinstance(template, list):
        return [_render_at(item, scope, f"{pointer}/{i}") for i, item in enumerate(template)]
    try:
        return render(template, scope)
    except MissingValue as missing:
        raise _Failed(pointer, f"{missing.where} has no value") from None
    except ExpressionError:
        raise _Failed(pointer, "the expression is malformed") from None


def map_value(template: Any, scope: Scope) -> Mapped:
    """Evaluate a mapping; on failure, the pointer into the mapping where it failed."""
    try:
        return Mapped(_render_at(template, scope, ""))
    except _Failed as failed:
        return Mapped(failure_path=failed.pointer, reason=failed.reason)


def map_command(op: Operation, template: Any, scope: Scope) -> Mapped:
    """The command of a call step, mapped and checked against ``op``'s command schema."""
    mapped = map_value(template, scope)
    if not mapped.ok:
        return mapped
    problems = validate_command(op, mapped.value)
    if problems:
        pointer, reason = problems[0]
        return Mapped(failure_path=pointer, reason=reason)
    return mapped


def map_output(op: Operation, template: Any, scope: Scope, response: Any) -> Mapped:
    """The values a call step keeps from ``response``."""
    with_response = dataclasses.replace(scope, response=response, has_response=True)
    mapped = map_value(template, with_response)
    if not mapped.ok or not isinstance(template, dict):
        return mapped
    # A kept value that is exactly one ${response.<field>} must have the type the catalogue
    # gives that field: later steps were checked offline against that type.
    for name, item in template.items():
        if not isinstance(item, str):
            continue
        try:
            ref = parse_template(item).whole
        except ExpressionError:
            continue
        if ref is None or ref.root != "response" or len(ref.path) != 1:
            continue
        spec = op.response_field(ref.path[0])
        if spec is None:
            continue
        actual = json_type_of(mapped.value[name])
        if not type_fits(actual, spec.type):
            return Mapped(
                failure_path=f"/{pointer_token(str(name))}",
                reason=f"the response's {spec.name} is {actual}, not {spec.type}",
            )
    return mapped
