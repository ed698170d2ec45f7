"""JSON value helpers shared by the schema validator, the checker and the evaluator."""

from __future__ import annotations

import math
from typing import Any


def json_type_of(value: Any) -> str:
    """The JSON type name of a plain value; an integral float counts as an integer."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if math.isfinite(value) and value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "unknown"


def type_fits(actual: str, wanted: str) -> bool:
    """Whether a value of JSON type ``actual`` is acceptable where ``wanted`` is declared."""
    return actual == wanted or (wanted == "number" and actual == "integer")


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 equals 1.0, but true never equals 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def pointer_token(name: str) -> str:
    """One RFC 6901 JSON pointer reference token."""
    return name.replace("~", "~0").replace("/", "~1")


def article(type_name: str) -> str:
    """``a string``, ``an object``."""
    return ("an " if type_name[:1] in ("a", "e", "i", "o", "u") else "a ") + type_name
