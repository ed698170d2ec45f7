"""The start-input schema subset: judging schemas, and judging inputs with JSON pointers."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import PackageInvalid
from core.workflow.schema import check_schema, is_rfc3339, lookup, validate_input

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["applicationId", "applicant"],
    "properties": {
        "applicationId": {"type": "string", "pattern": "^[A-Z0-9-]{4,32}$"},
        "applicant": {
            "type": "object",
            "required": ["ref"],
            "additionalProperties": False,
            "properties": {
                "ref": {"type": "string", "minLength": 2, "maxLength": 8},
                "a/b~c": {"type": "boolean"},
            },
        },
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "weight": {"type": "number", "maximum": 2.5},
        "channel": {"type": "string", "enum": ["mail", "sms"]},
        "kind": {"type": "string", "const": "standard"},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 3}},
        "due": {"type": "string", "format": "date-time"},
        "free": {"type": "object"},
    },
}

VALID = {"applicationId": "APP-1234", "applicant": {"ref": "ab"}}


def test_the_schema_is_in_the_subset_and_a_valid_input_fits() -> None:
    check_schema(SCHEMA)
    assert validate_input(SCHEMA, VALID) == []
    full = {
        **VALID,
        "priority": 5,
        "weight": 2,
        "channel": "sms",
        "kind": "standard",
        "tags": ["a", "bcd"],
        "due": "2026-05-01T09:00:00.5+02:00",
        "free": {"anything": [1, {"goes": None}]},
    }
    assert validate_input(SCHEMA, full) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"applicationId": "bad id"}, [("/applicationId", "does not match the required pattern")]),
        ({"applicationId": 12}, [("/applicationId", "must be a string")]),
        ({"applicant": {}}, [("/applicant/ref", "is required")]),
        ({"applicant": {"ref": "a"}}, [("/applicant/ref", "must be at least 2 characters long")]),
        (
            {"applicant": {"ref": "abcdefghi"}},
            [("/applicant/ref", "must be at most 8 characters long")],
        ),
        (
            {"applicant": {"ref": "ab", "a/b~c": "yes"}},
            [("/applicant/a~1b~0c", "must be a boolean")],
        ),
        (
            {"applicant": {"ref": "ab", "extra": 1}},
            [("/applicant/extra", "is not an allowed field")],
        ),
        ({"priority": 0}, [("/priority", "must be at least 1")]),
        ({"priority": 6}, [("/priority", "must be at most 5")]),
        ({"priority": 2.5}, [("/priority", "must be an integer")]),
        ({"priority": True}, [("/priority", "must be an integer")]),
        ({"weight": 3}, [("/weight", "must be at most 2.5")]),
        ({"weight": "1"}, [("/weight", "must be a number")]),
        ({"channel": "fax"}, [("/channel", "is not one of the allowed values")]),
        ({"kind": "express"}, [("/kind", "is not the one allowed value")]),
        ({"tags": ["a", "b", "c"]}, [("/tags", "must have at most 2 items")]),
        ({"tags": ["a", "long"]}, [("/tags/1", "must be at most 3 characters long")]),
        ({"tags": "a"}, [("/tags", "must be an array")]),
        ({"due": "2026-02-30T09:00:00Z"}, [("/due", "must be an RFC 3339 date-time")]),
        ({"due": "2026-05-01 09:00"}, [("/due", "must be an RFC 3339 date-time")]),
        ({"surprise": 1}, [("/surprise", "is not an allowed field")]),
        ({"free": None}, [("/free", "must be an object")]),
    ],
)
def test_each_violation_is_reported_at_its_pointer(
    change: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert validate_input(SCHEMA, {**VALID, **change}) == expected


def test_several_problems_are_all_reported_and_no_value_is_echoed() -> None:
    secret = "Jane Q. Citizen 1970-01-01"
    problems = validate_input(
        SCHEMA, {"applicationId": secret, "applicant": {"ref": secret}, "tags": [secret]}
    )
    assert problems == [
        ("/applicant/ref", "must be at most 8 characters long"),
        ("/applicationId", "does not match the required pattern"),
        ("/tags/0", "must be at most 3 characters long"),
    ]
    assert all(secret not in reason for _, reason in problems)


def test_an_input_that_is_not_an_object_is_refused_at_the_root() -> None:
    assert validate_input(SCHEMA, ["x"]) == [("", "must be an object")]
    missing = validate_input(SCHEMA, {})
    assert missing == [("/applicationId", "is required"), ("/applicant", "is required")]


def test_integral_floats_count_as_integers_and_patterns_are_unanchored() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"n": {"type": "integer"}, "s": {"type": "string", "pattern": "b"}},
    }
    assert validate_input(schema, {"n": 3.0, "s": "abc"}) == []
    # Pattern classes are ASCII, as in the ECMA-262 dialect schemas are written for.
    digits = {**schema, "properties": {"s": {"type": "string", "pattern": "^\\d+$"}}}
    assert validate_input(digits, {"s": "\u0663"}) == [
        ("/s", "does not match the required pattern")
    ]


@pytest.mark.parametrize(
    ("schema", "path", "reason"),
    [
        ({"type": "string"}, "input.type", "must be an object"),
        ({"type": "object"}, "input.additionalProperties", "must be false at the top level"),
        ({"type": "object", "additionalProperties": True}, "input.additionalProperties", "false"),
        ({"additionalProperties": False}, "input.type", "needs a type"),
        ({"type": "null", "additionalProperties": False}, "input.type", "must be one of"),
        (
            {"type": "object", "additionalProperties": False, "$ref": "#"},
            "input.$ref",
            "not a supported schema keyword",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string", "format": "email"}},
            },
            "input.properties.a.format",
            "only date-time",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string", "pattern": "("}},
            },
            "input.properties.a.pattern",
            "not a valid regular expression",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 2}},
            },
            "input.properties.a.minLength",
            "larger than",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 2}},
            },
            "input.properties.a.minimum",
            "larger than",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string", "maxLength": -1}},
            },
            "input.properties.a.maxLength",
            "zero or more",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string", "enum": ["x", 1]}},
            },
            "input.properties.a.enum[1]",
            "not of type string",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string", "enum": []}},
            },
            "input.properties.a.enum",
            "non-empty",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "integer", "const": "1"}},
            },
            "input.properties.a.const",
            "not of type integer",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "array", "items": {"type": "string", "minimum": 1}}},
            },
            "input.properties.a.items.minimum",
            "applies to integer and number",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["a", "a"],
                "properties": {"a": {"type": "string"}},
            },
            "input.required[1]",
            "twice",
        ),
    ],
)
def test_schemas_outside_the_subset_are_refused(schema: Any, path: str, reason: str) -> None:
    with pytest.raises(PackageInvalid) as caught:
        check_schema(schema)
    assert caught.value.path == path
    assert reason in caught.value.reason


def test_lookup_walks_nested_properties_and_list_items() -> None:
    node, _ = lookup(SCHEMA, ("applicant", "ref"))
    assert node == {"type": "string", "minLength": 2, "maxLength": 8}
    item, _ = lookup(SCHEMA, ("tags", "0"))
    assert item is not None and item["type"] == "string"
    assert lookup(SCHEMA, ("tags", "first"))[0] is None
    missing, why = lookup(SCHEMA, ("applicant", "name"))
    assert missing is None and "input.applicant" in why
    undeclared, _ = lookup(SCHEMA, ("free", "anything"))
    assert undeclared is None  # an object without properties declares no fields


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("2026-05-01T09:00:00Z", True),
        ("2026-05-01t09:00:00z", True),
        ("2026-05-01T09:00:00.123456+05:30", True),
        ("2016-12-31T23:59:60Z", True),
        ("2026-05-01T09:00:00", False),
        ("2026-13-01T09:00:00Z", False),
        ("2026-05-01T24:00:00Z", False),
        ("2026-05-01T09:00:00+24:00", False),
        ("2026-05-01", False),
        ("not a date", False),
    ],
)
def test_rfc3339(text: str, valid: bool) -> None:
    assert is_rfc3339(text) is valid
