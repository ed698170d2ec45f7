"""Expressions and predicates: parsing, typed substitution, interpolation, evaluation."""

from __future__ import annotations

from typing import Any

import pytest

from core.workflow.expr import (
    ExpressionError,
    MissingValue,
    Ref,
    Scope,
    holds,
    parse_template,
    render,
)
from core.workflow.parse import parse_predicate

SCOPE = Scope(
    input={"id": "A-1", "count": 3, "flag": True, "nested": {"list": [10, 20]}, "none": None},
    steps={"review": {"outcome": "approved", "decidedAt": "2026-05-01T09:00:00Z"}},
    run_id="run-7",
    run_started_at="2026-04-01T08:00:00Z",
)


def test_parse_splits_text_and_references() -> None:
    template = parse_template("Case ${input.id} by ${steps.review.outcome}!")
    assert template.parts == (
        "Case ",
        Ref("input", ("id",)),
        " by ",
        Ref("steps", ("review", "outcome")),
        "!",
    )
    assert template.whole is None
    assert parse_template("${run.id}").whole == Ref("run", ("id",))
    assert parse_template("plain text").refs == ()
    assert parse_template("cost: $5 {not an expression}").refs == ()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("${input.id", "not closed"),
        ("${input}", "needs a field"),
        ("${steps.review}", "a step and a field"),
        ("${run.user}", "run.id"),
        ("${response}", "needs a field"),
        ("${env.PATH}", "not an expression"),
        ("${input..id}", "malformed name"),
        ("${input.id + 1}", "malformed name"),
        ("${input.${input.id}}", "nested"),
        ("${ input.id }", "not an expression"),
    ],
)
def test_malformed_expressions_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ExpressionError, match=reason.replace("+", "\\+")):
        parse_template(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("${input.count}", 3),
        ("${input.flag}", True),
        ("${input.nested}", {"list": [10, 20]}),
        ("${input.nested.list.1}", 20),
        ("${input.none}", None),
        ("n=${input.count} f=${input.flag} x=${input.none}", "n=3 f=true x=null"),
        ("${input.nested}!", '{"list":[10,20]}!'),
        ("${run.id}/${run.startedAt}", "run-7/2026-04-01T08:00:00Z"),
        ({"a": ["${steps.review.outcome}", 1]}, {"a": ["approved", 1]}),
        ("no expressions", "no expressions"),
        (42, 42),
    ],
)
def test_render_keeps_types_for_one_expression_and_interpolates_otherwise(
    value: Any, expected: Any
) -> None:
    assert render(value, SCOPE) == expected


def test_render_names_the_missing_reference() -> None:
    with pytest.raises(MissingValue) as caught:
        render({"x": "${input.absent}"}, SCOPE)
    assert caught.value.where == "${input.absent}"
    with pytest.raises(MissingValue):
        render("${input.nested.list.5}", SCOPE)
    with pytest.raises(MissingValue):
        render("${response.messageId}", SCOPE)  # no response outside output mapping
    with_response = Scope(
        SCOPE.input, SCOPE.steps, "r", "t", response={"messageId": "m-1"}, has_response=True
    )
    assert render("${response.messageId}", with_response) == "m-1"


def _pred(document: Any) -> bool:
    return holds(parse_predicate(document, "when"), SCOPE)


@pytest.mark.parametrize(
    ("predicate", "expected"),
    [
        ({"equals": ["${steps.review.outcome}", "approved"]}, True),
        ({"equals": ["${steps.review.outcome}", "rejected"]}, False),
        ({"equals": ["${input.count}", 3.0]}, True),
        ({"equals": ["${input.flag}", 1]}, False),  # true is not 1 in JSON
        ({"in": ["${input.count}", [1, 2, 3]]}, True),
        ({"in": [20, "${input.nested.list}"]}, True),
        ({"in": ["x", "${input.id}"]}, False),  # not a list
        ({"exists": "${input.id}"}, True),
        ({"exists": "${input.none}"}, False),
        ({"exists": "${input.absent}"}, False),
        ({"equals": ["${input.absent}", None]}, False),  # absent equals nothing
        ({"not": {"exists": "${input.absent}"}}, True),
        ({"all": [{"exists": "${input.id}"}, {"equals": [1, 1]}]}, True),
        ({"all": [{"exists": "${input.id}"}, {"equals": [1, 2]}]}, False),
        ({"any": [{"equals": [1, 2]}, {"equals": ["${input.id}", "A-1"]}]}, True),
        ({"any": [{"equals": [1, 2]}, {"not": {"equals": [1, 1]}}]}, False),
    ],
)
def test_predicates(predicate: Any, expected: bool) -> None:
    assert _pred(predicate) is expected
