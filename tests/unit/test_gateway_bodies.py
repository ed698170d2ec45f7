"""Request validation helpers of the gateway (limits, JSON, references, instants)."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers, QueryParams

from core.errors import CoordinatorError
from gateway.bodies import (
    MAX_JSON_DEPTH,
    check_depth,
    idempotency_key,
    list_parameters,
    parse_json_object,
    start_input,
)


def refused(code: str = "request.invalid") -> pytest.RaisesExc[CoordinatorError]:
    return pytest.raises(CoordinatorError, check=lambda exc: exc.code == code)


def test_depth_ignores_brackets_inside_strings() -> None:
    text = '{"a": "[[[[' + "[" * 100 + '\\"{{{{"}'
    check_depth(text)
    assert parse_json_object(text.encode()) == {"a": "[[[[" + "[" * 100 + '"{{{{'}


def test_depth_counts_arrays_and_objects_alike() -> None:
    check_depth("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    with refused():
        check_depth('{"a":' * (MAX_JSON_DEPTH + 1))


def test_start_input_is_compact_json_text() -> None:
    body = parse_json_object('{"input": {"name": "\u00e9", "n": [1, 2.5]}}'.encode())
    assert start_input(body) == '{"name":"\u00e9","n":[1,2.5]}'


def test_huge_numbers_are_malformed_not_a_crash() -> None:
    with refused():
        parse_json_object(b'{"input": {"n": ' + b"9" * 5000 + b"}}")


def test_idempotency_key_must_be_given_once() -> None:
    with refused():
        idempotency_key(Headers(raw=[(b"idempotency-key", b"a"), (b"idempotency-key", b"b")]))
    assert idempotency_key(Headers({"Idempotency-Key": "a-1"})) == "a-1"


def test_list_defaults() -> None:
    params = list_parameters(QueryParams(""))
    assert (params.attention, params.state, params.workflow, params.limit, params.cursor) == (
        None,
        None,
        None,
        20,
        None,
    )
