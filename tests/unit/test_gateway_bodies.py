"""Request validation helpers of the gateway (limits, JSON, references, instants)."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers, QueryParams

from core.errors import CoordinatorError
from gateway.bodies import (
    MAX_JSON_DEPTH,
    OPERATOR_BODIES,
    check_depth,
    idempotency_key,
    instant,
    list_parameters,
    parse_json_object,
    run_action_reason,
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


def test_unknown_member_names_are_not_echoed() -> None:
    with refused() as info:
        run_action_reason({"reason": "x", "alice-smith": 1})
    assert "alice" not in info.value.detail


@pytest.mark.parametrize(
    "value",
    ["2027-01-01T00:00:00Z", "2027-01-01t00:00:00.123456789+02:00", "2027-06-30T23:59:59-05:30"],
)
def test_instants_with_an_offset_are_accepted(value: str) -> None:
    assert instant({"before": value}, "before") == value


@pytest.mark.parametrize(
    "value",
    ["2027-02-30T00:00:00Z", "2027-01-01 00:00:00Z", "2027-01-01T25:00:00Z", 1700000000, None],
)
def test_bad_instants_are_refused(value: object) -> None:
    with refused():
        instant({"before": value}, "before")


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


def test_attestations_must_be_literally_true() -> None:
    validate = OPERATOR_BODIES["complete-execution-recovery"]
    body = {
        "recoveryReference": "r-1",
        "executionHistoryComplete": 1,
        "priorDeploymentFenced": True,
    }
    with refused():
        validate(body)
    body["executionHistoryComplete"] = True
    assert validate(body).reference == "r-1"
