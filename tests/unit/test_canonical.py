"""The one canonical JSON (RFC 8785) and the reader of product JSON that matches it."""

from __future__ import annotations

import pytest

from core.canonical import SAFE_INTEGER, canonical_json, parse_json
from core.payloads import encode_json


def test_equal_values_give_equal_bytes_whatever_their_order() -> None:
    one = canonical_json({"b": [1, 2.5, "é"], "a": {"y": True, "x": None}})
    other = canonical_json({"a": {"x": None, "y": True}, "b": [1, 2.5, "é"]})
    assert one == other == '{"a":{"x":null,"y":true},"b":[1,2.5,"é"]}'.encode()


def test_sealed_payloads_use_the_same_encoding() -> None:
    value = {"z": 1.0, "a": "text", "n": [SAFE_INTEGER]}
    assert encode_json(value) == canonical_json(value)
    assert encode_json(value) == b'{"a":"text","n":[9007199254740991],"z":1}'


@pytest.mark.parametrize("value", [SAFE_INTEGER + 1, -(SAFE_INTEGER + 1), float("nan")])
def test_a_number_readers_disagree_on_cannot_be_encoded(value: float) -> None:
    with pytest.raises(ValueError):
        canonical_json({"n": value})


@pytest.mark.parametrize(
    "text", ['{"n": 9007199254740992}', '{"n": -9007199254740992}', "[NaN]", "[-Infinity]", "1e999"]
)
def test_product_json_with_an_unsafe_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_json(text)


def test_whatever_parse_json_reads_can_be_sealed() -> None:
    text = '{"n": 9007199254740991, "f": 0.1, "s": "\\u00e9", "l": [true, null]}'
    value = parse_json(text.encode())
    assert value == {"n": SAFE_INTEGER, "f": 0.1, "s": "é", "l": [True, None]}
    assert parse_json(canonical_json(value)) == value
