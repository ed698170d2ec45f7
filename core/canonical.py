"""Canonical JSON (RFC 8785): the one encoding of a JSON value that is sealed or digested.

Equal values always give equal bytes, whatever member order or spacing they arrived in, so
a digest of the bytes identifies the value. RFC 8785 refuses numbers that JSON readers do
not all read alike (integers beyond 2**53, NaN, infinities): ``ValueError``. JSON that
arrives from a product is read with :func:`parse_json`, which refuses the same numbers up
front, so whatever was read can always be sealed. JSON that a caller sends is checked with
:func:`unkept_place`, which names where a value holds what no peer can be handed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

import rfc8785

from core.workflow.jsonvalue import pointer_token

SAFE_INTEGER: Final = 2**53 - 1
"""The largest integer every JSON reader reads exactly (RFC 8785 §3.2.2.3, I-JSON)."""


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 bytes of ``value``; ``ValueError`` when it holds an unsafe number."""
    return bytes(rfc8785.dumps(value))


_LONE_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")

BEYOND_DOUBLE: Final = "is a number beyond the double range"
NOT_UNICODE: Final = "holds text that is not Unicode (a lone surrogate)"
NAME_NOT_UNICODE: Final = "has a member name that is not Unicode (a lone surrogate)"


def unkept_place(value: Any) -> tuple[str, str] | None:
    """The JSON pointer and reason of the first place, in document order, where a parsed JSON
    value holds what cannot be passed on: a number beyond the double range, or a string or
    member name with a lone surrogate. ``None`` when there is none.

    Python's reader turns ``1e999`` into infinity, which neither this module nor
    ``json.dumps(allow_nan=False)`` will write, and ``"\\ud800"`` into a string that UTF-8,
    and so protobuf, cannot encode. A member name is reported at its object, so the
    pointer never holds the text at fault. Walked without recursion: any depth is safe.
    """
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        pointer, item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return pointer, BEYOND_DOUBLE
        elif isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return pointer, NOT_UNICODE
        elif isinstance(item, dict):
            if any(_LONE_SURROGATE.search(name) for name in item):
                return pointer, NAME_NOT_UNICODE
            # Pushed in reverse so the first member is looked at first.
            pending.extend(
                (f"{pointer}/{pointer_token(name)}", member)
                for name, member in reversed(item.items())
            )
        elif isinstance(item, list):
            pending.extend(
                (f"{pointer}/{position}", member)
                for position, member in reversed(list(enumerate(item)))
            )
    return None


def _integer(text: str) -> int:
    value = int(text)
    if abs(value) > SAFE_INTEGER:
        raise ValueError("an integer beyond 2**53 cannot be kept exactly")
    return value


def _number(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("a number beyond the double range cannot be kept")
    return value


def _constant(_text: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


def parse_json(body: bytes | str) -> Any:
    """JSON text as a value :func:`canonical_json` can encode; ``ValueError`` (or
    ``UnicodeDecodeError``) when it is not JSON or holds an unsafe number."""
    return json.loads(body, parse_int=_integer, parse_float=_number, parse_constant=_constant)
