"""Mapping a call's command and output, with the JSON pointer of a failure; the idle wait."""

from __future__ import annotations

from typing import Any

import pytest

from core.workflow.catalogue import Operation, operation
from core.workflow.expr import Scope
from core.workflow.mapping import map_command, map_output, map_value
from dispatcher.claim import BUSY_FLOOR_SECONDS, Wake

_SEND = operation("messaging", "send-notice")
assert _SEND is not None
SEND: Operation = _SEND
SCOPE = Scope(
    input={"applicantRef": "applicant-1", "count": 3, "tags": ["x"]},
    steps={"review": {"reviewId": "rev-9"}},
    run_id="run-1",
    run_started_at="2027-03-01T08:00:00.000Z",
)
TEMPLATE: dict[str, Any] = {
    "template": "approved",
    "recipientRef": "${input.applicantRef}",
    "parameters": {"review": "${steps.review.reviewId}", "run": "Run ${run.id}"},
}


def test_a_command_maps_with_json_types_kept() -> None:
    mapped = map_command(SEND, TEMPLATE, SCOPE)
    assert mapped.ok
    assert mapped.value == {
        "template": "approved",
        "recipientRef": "applicant-1",
        "parameters": {"review": "rev-9", "run": "Run run-1"},
    }


def test_a_missing_value_fails_at_the_command_field_it_feeds() -> None:
    template = {**TEMPLATE, "parameters": {"a/b": ["${input.absent}"]}}
    mapped = map_command(SEND, template, SCOPE)
    assert not mapped.ok
    assert mapped.failure_path == "/parameters/a~1b/0"
    assert "applicant" not in mapped.reason


def test_a_command_that_breaks_the_schema_fails_with_its_pointer() -> None:
    mapped = map_command(SEND, {**TEMPLATE, "recipientRef": "${input.count}"}, SCOPE)
    assert (mapped.ok, mapped.failure_path) == (False, "/recipientRef")
    assert "3" not in mapped.reason
    mapped = map_command(SEND, {"template": "t", "recipientRef": "r"}, SCOPE)
    assert mapped.failure_path == "/parameters"


def test_an_output_maps_from_the_response() -> None:
    mapped = map_output(SEND, {"messageId": "${response.messageId}"}, SCOPE, {"messageId": "m"})
    assert (mapped.ok, mapped.value) == (True, {"messageId": "m"})


@pytest.mark.parametrize(
    "response", [{}, {"acceptedAt": "x"}, {"messageId": 7}, {"messageId": None}]
)
def test_an_output_fails_when_the_response_lacks_the_field_or_its_type(
    response: dict[str, Any],
) -> None:
    mapped = map_output(SEND, {"messageId": "${response.messageId}"}, SCOPE, response)
    assert (mapped.ok, mapped.failure_path) == (False, "/messageId")


def test_map_value_leaves_plain_values_alone() -> None:
    assert map_value({"n": 1, "b": [True, None]}, SCOPE).value == {"n": 1, "b": [True, None]}


@pytest.mark.parametrize(
    ("wake", "expected"),
    [
        (Wake(None, None, False), 5.0),
        (Wake(2.5, None, False), 2.5),
        (Wake(9.0, 1.5, False), 1.5),
        (Wake(60.0, 90.0, False), 5.0),
        (Wake(-3.0, None, False), BUSY_FLOOR_SECONDS),
        (Wake(0.0, None, True), 5.0),
    ],
)
def test_an_idle_dispatcher_sleeps_until_the_next_due_instant_at_most(
    wake: Wake, expected: float
) -> None:
    assert wake.delay(5.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("wake", "sweep_in", "expected"),
    [
        # An expired lease waits for the next sweep that may act on it...
        (Wake(None, -1.0, False), 0.8, 0.8),
        (Wake(None, 0.2, False), 0.8, 0.8),
        # ...but a due step does not, and a later expiry is not moved.
        (Wake(0.1, -1.0, False), 0.8, 0.1),
        (Wake(None, 3.0, False), 0.8, 3.0),
    ],
)
def test_a_lease_expiry_wakes_the_loop_no_sooner_than_the_next_sweep(
    wake: Wake, sweep_in: float, expected: float
) -> None:
    assert wake.delay(5.0, sweep_in) == pytest.approx(expected)
