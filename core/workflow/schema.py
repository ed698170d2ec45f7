"""The start-input schema: a small subset of JSON Schema 2020-12.

Keywords: ``type`` (one of object, string, integer, number, boolean, array — required on
every schema so that references can be typed offline), ``properties``, ``required``,
``additionalProperties: false`` (required at the top level), ``items``, ``enum``, ``const``,
``pattern``, ``minLength``, ``maxLength``, ``minimum``, ``maximum``, ``maxItems``,
``format: date-time``, and ``description`` as a note for readers.

``check_schema`` judges a schema when a workflow is checked; ``validate_input`` judges a start
input against it (admission answers 422 with its JSON pointers). No reason ever contains the
value it judged.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from core.errors import PackageInvalid
from core.paths import index, key
from core.workflow.jsonvalue import article, json_equal, json_type_of, pointer_token, type_fits
from core.yamlsafe import FAILED, Problems

TYPES = ("object", "string", "integer", "number", "boolean", "array")

# Which keywords apply to which type; ``type``, ``enum``, ``const`` and ``description`` apply
# to all of them.
_ONLY_FOR = {
    "properties": ("object",),
    "required": ("object",),
    "additionalProperties": ("object",),
    "items": ("array",),
    "maxItems": ("array",),
    "pattern": ("string",),
    "minLength": ("string",),
    "maxLength": ("string",),
    "format": ("string",),
    "minimum": ("integer", "number"),
    "maximum": ("integer", "number"),
}
KEYWORDS = ("type", "enum", "const", "description", *_ONLY_FOR)

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)


def is_rfc3339(text: str) -> bool:
    """Whether ``text`` is an RFC 3339 date-time with an offset (``2026-05-01T09:00:00Z``)."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    offset = match.group(8)
    if offset not in ("Z", "z") and (int(offset[1:3]) > 23 or int(offset[4:6]) > 59):
        return False
    try:
        # A leap second (:60) is valid RFC 3339; datetime cannot hold it, so judge :59.
        datetime(year, month, day, hour, minute, min(second, 59))
    except ValueError:
        return False
    return second <= 60


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    # ASCII classes: closer to the ECMA-262 dialect JSON Schema patterns are written in.
    return re.compile(pattern, re.ASCII)


def _refuse(path: str, reason: str) -> PackageInvalid:
    return PackageInvalid(path, reason)


def _count(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse(path, "must be a whole number of zero or more")
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refuse(path, "must be a number")
    return float(value)


def check_schema(
    schema: Any, path: str = "input", *, top: bool = True, problems: Problems | None = None
) -> None:
    """Refuse a schema outside the subset; the path names the offending keyword.

    With ``problems``, every problem is kept there instead of raising the first one.
    """
    if problems is None:
        problems = Problems()
        _check_schema(schema, path, top, problems)
        problems.raise_first()
    else:
        _check_schema(schema, path, top, problems)


def _check_schema(schema: Any, path: str, top: bool, problems: Problems) -> None:
    if not isinstance(schema, dict):
        problems.add(_refuse(path, "a schema must be a mapping"))
        return
    for word in schema:
        if word not in KEYWORDS:
            problems.add(
                _refuse(
                    key(path, str(word)),
                    "is not a supported schema keyword (supported: " + ", ".join(KEYWORDS) + ")",
                )
            )
    kind = schema.get("type")
    if kind is None:
        problems.add(_refuse(key(path, "type"), "every schema needs a type"))
    elif kind not in TYPES:
        problems.add(_refuse(key(path, "type"), "must be one of " + ", ".join(TYPES)))
    # The rules below that depend on the type are judged only when the type is known.
    known = kind if kind in TYPES else None
    if known is not None:
        for word, kinds in _ONLY_FOR.items():
            if word in schema and known not in kinds:
                problems.add(
                    _refuse(
                        key(path, word), f"applies to {' and '.join(kinds)} schemas, not {known}"
                    )
                )
        if top and known != "object":
            problems.add(_refuse(key(path, "type"), "the start input must be an object"))
    if top and schema.get("additionalProperties") is not False:
        problems.add(
            _refuse(
                key(path, "additionalProperties"),
                "must be false at the top level, so unexpected start fields are refused",
            )
        )
    elif "additionalProperties" in schema and schema["additionalProperties"] is not False:
        problems.add(_refuse(key(path, "additionalProperties"), "only false is supported"))
    if "description" in schema and not isinstance(schema["description"], str):
        problems.add(_refuse(key(path, "description"), "must be text"))
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        problems.add(
            _refuse(key(path, "properties"), "must be a mapping of field names to schemas")
        )
        properties = None
    else:
        for name, sub in properties.items():
            if not isinstance(name, str) or not name:
                problems.add(_refuse(key(path, "properties"), "field names must be non-empty text"))
                continue
            _check_schema(sub, key(key(path, "properties"), name), False, problems)
    if "required" in schema:
        _check_required(schema["required"], key(path, "required"), properties, problems)
    if "items" in schema:
        _check_schema(schema["items"], key(path, "items"), False, problems)
    lengths = {
        w: problems.attempt(_count, schema[w], key(path, w))
        for w in ("minLength", "maxLength")
        if w in schema
    }
    if "maxItems" in schema:
        problems.attempt(_count, schema["maxItems"], key(path, "maxItems"))
    low, high = lengths.get("minLength", 0), lengths.get("maxLength", math.inf)
    if low is not FAILED and high is not FAILED and low > high:
        problems.add(_refuse(key(path, "minLength"), "is larger than maxLength"))
    bounds = {
        w: problems.attempt(_number, schema[w], key(path, w))
        for w in ("minimum", "maximum")
        if w in schema
    }
    least, most = bounds.get("minimum", -math.inf), bounds.get("maximum", math.inf)
    if least is not FAILED and most is not FAILED and least > most:
        problems.add(_refuse(key(path, "minimum"), "is larger than maximum"))
    if "pattern" in schema:
        problems.attempt(_pattern, schema["pattern"], key(path, "pattern"))
    if "format" in schema and schema["format"] != "date-time":
        problems.add(_refuse(key(path, "format"), "only date-time is supported"))
    if "enum" in schema:
        options = schema["enum"]
        if not isinstance(options, list) or not options:
            problems.add(_refuse(key(path, "enum"), "must be a non-empty list"))
        elif known is not None:
            for position, option in enumerate(options):
                if not type_fits(json_type_of(option), known):
                    problems.add(
                        _refuse(index(key(path, "enum"), position), f"is not of type {known}")
                    )
    if (
        "const" in schema
        and known is not None
        and not type_fits(json_type_of(schema["const"]), known)
    ):
        problems.add(_refuse(key(path, "const"), f"is not of type {known}"))


def _check_required(
    required: Any, where: str, properties: dict[str, Any] | None, problems: Problems
) -> None:
    if not isinstance(required, list):
        problems.add(_refuse(where, "must be a list of field names"))
        return
    for position, name in enumerate(required):
        # Against properties that could not be read, whether a name is declared is unknown.
        if properties is not None and (not isinstance(name, str) or name not in properties):
            problems.add(
                _refuse(index(where, position), "names a field not declared in properties")
            )
        elif name in required[:position]:
            problems.add(_refuse(index(where, position), "names a field twice"))


def _pattern(pattern: Any, path: str) -> None:
    if not isinstance(pattern, str):
        raise _refuse(path, "must be a regular expression as text")
    try:
        _compiled(pattern)
    except re.error:
        raise _refuse(path, "is not a valid regular expression") from None


def lookup(schema: dict[str, Any], names: tuple[str, ...]) -> tuple[dict[str, Any] | None, str]:
    """The schema of ``input.<names…>``, or None and why the schema does not declare it.

    Object fields must be declared in ``properties``; a list position (digits) reads the
    array's ``items``.
    """
    node = schema
    walked = "input"
    for name in names:
        kind = node.get("type")
        if kind == "object":
            properties = node.get("properties", {})
            if name not in properties:
                return None, f"the input schema declares no field '{name}' in {walked}"
            node = properties[name]
        elif kind == "array":
            if not name.isdigit():
                return None, f"{walked} is a list; pick an item by position"
            if "items" not in node:
                return None, f"the input schema does not describe the items of {walked}"
            node = node["items"]
        else:
            return None, f"{walked} is {article(str(kind))}, it has no field '{name}'"
        walked = f"{walked}.{name}"
    return node, ""


# ---------------------------------------------------------------------------------- validation


def validate_input(schema: Mapping[str, Any], value: Any) -> list[tuple[str, str]]:
    """Judge a start input: a list of (JSON pointer, reason), empty when it fits.

    Reasons describe the rule, never the value (a value may be personal data).
    """
    problems: list[tuple[str, str]] = []
    _validate(schema, value, "", problems)
    return problems


def _validate(
    schema: Mapping[str, Any], value: Any, pointer: str, out: list[tuple[str, str]]
) -> None:
    kind = schema.get("type", "")
    actual = json_type_of(value)
    if not type_fits(actual, kind):
        out.append((pointer, f"must be {article(kind)}"))
        return
    if "const" in schema and not json_equal(value, schema["const"]):
        out.append((pointer, "is not the one allowed value"))
    if "enum" in schema and not any(json_equal(value, o) for o in schema["enum"]):
        out.append((pointer, "is not one of the allowed values"))
    if kind == "string":
        _validate_string(schema, value, pointer, out)
    elif kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            out.append((pointer, f"must be at least {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            out.append((pointer, f"must be at most {schema['maximum']}"))
    elif kind == "object":
        properties: dict[str, Any] = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                out.append((f"{pointer}/{pointer_token(name)}", "is required"))
        for name in sorted(value):
            if name in properties:
                _validate(properties[name], value[name], f"{pointer}/{pointer_token(name)}", out)
            elif schema.get("additionalProperties") is False:
                out.append((f"{pointer}/{pointer_token(name)}", "is not an allowed field"))
    elif kind == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append((pointer, f"must have at most {schema['maxItems']} items"))
        if "items" in schema:
            for position, item in enumerate(value):
                _validate(schema["items"], item, f"{pointer}/{position}", out)


def _validate_string(
    schema: Mapping[str, Any], value: str, pointer: str, out: list[tuple[str, str]]
) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.append((pointer, f"must be at least {schema['minLength']} characters long"))
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        out.append((pointer, f"must be at most {schema['maxLength']} characters long"))
    if "pattern" in schema and _compiled(schema["pattern"]).search(value) is None:
        out.append((pointer, "does not match the required pattern"))
    if schema.get("format") == "date-time" and not is_rfc3339(value):
        out.append((pointer, "must be an RFC 3339 date-time"))
