"""Canonical JSON (RFC 8785): the one encoding of a JSON value that is sealed or digested.

Equal values always give equal bytes, whatever member order or spacing they arrived in, so
a digest of the bytes identifies the value. RFC 8785 refuses numbers that JSON readers do
not all read alike (integers beyond 2**53, NaN, infinities): ``ValueError``. JSON that
arrives from a product is read with :func:`parse_json`, which refuses the same numbers up
front, so whatever was read can always be sealed.
"""

from __future__ import annotations

import json
from typing import Any, Final

import rfc8785

SAFE_INTEGER: Final = 2**53 - 1
"""The largest integer every JSON reader reads exactly (RFC 8785 §3.2.2.3, I-JSON)."""


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 bytes of ``value``; ``ValueError`` when it holds an unsafe number."""
    return bytes(rfc8785.dumps(value))


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
