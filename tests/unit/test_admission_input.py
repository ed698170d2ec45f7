"""Admission's pure parts: parsing, canonical form, keyed digest and key checks."""

from __future__ import annotations

import json

import pytest

from admission.start import MAX_INPUT_BYTES, canonical_input, input_digest, parse_input
from core.errors import CoordinatorError
from core.runs import check_idempotency_key

KEY = bytes(range(32))


def test_member_order_and_spacing_do_not_change_the_digest() -> None:
    one = parse_input('{"a": 1, "b": [true, "x"]}')
    two = parse_input('{"b":[true,"x"],"a":1}')
    assert canonical_input(one) == canonical_input(two) == b'{"a":1,"b":[true,"x"]}'
    assert input_digest(KEY, canonical_input(one)) == input_digest(KEY, canonical_input(two))


def test_the_digest_is_keyed_and_depends_on_the_input() -> None:
    body = canonical_input({"a": 1})
    assert input_digest(KEY, body) != input_digest(bytes(32), body)
    assert input_digest(KEY, body) != input_digest(KEY, canonical_input({"a": 2}))
    assert len(input_digest(KEY, body)) == 64


@pytest.mark.parametrize("text", ["{", "[1,]", "NaN", '{"a": Infinity}', ""])
def test_malformed_json_is_request_invalid(text: str) -> None:
    with pytest.raises(CoordinatorError) as caught:
        parse_input(text)
    assert caught.value.code == "request.invalid"


def test_an_oversized_input_is_too_large() -> None:
    with pytest.raises(CoordinatorError) as caught:
        parse_input(json.dumps({"a": "x" * MAX_INPUT_BYTES}))
    assert caught.value.code == "request.too-large"


def test_a_number_beyond_the_safe_range_is_invalid_without_echoing_it() -> None:
    with pytest.raises(CoordinatorError) as caught:
        canonical_input({"n": 2**60})
    assert caught.value.code == "input.invalid"
    assert str(2**60) not in caught.value.detail
    assert caught.value.extra["errors"][0]["pointer"] == ""


@pytest.mark.parametrize("key", ["a", "x" * 255, "K-1:/._~!"])
def test_visible_ascii_keys_pass(key: str) -> None:
    check_idempotency_key(key)


@pytest.mark.parametrize("key", ["", "x" * 256, "with space", "tab\t", "é"])
def test_other_keys_are_refused(key: str) -> None:
    with pytest.raises(CoordinatorError) as caught:
        check_idempotency_key(key)
    assert caught.value.code == "request.invalid"
