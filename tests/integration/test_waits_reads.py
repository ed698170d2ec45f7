"""What a read of a review result means, and how far apart reads are planned (pure: no
database, no product)."""

from __future__ import annotations

import json

import pytest

from core import derive
from core.execution.wait_for import (
    DECIDED,
    FAILED,
    PENDING,
    REFUSED,
    check_delay,
    interpret,
)


def answer(document: object) -> bytes:
    return json.dumps(document).encode()


def test_a_decision_keeps_its_outcome_and_time() -> None:
    read = interpret(
        200,
        answer(
            {
                "status": "decided",
                "decision": {"outcome": "approved", "decidedAt": "2027-03-02T10:00:00.000Z"},
            }
        ),
    )
    assert read.kind == DECIDED
    assert read.result == {"outcome": "approved", "decidedAt": "2027-03-02T10:00:00.000Z"}


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (200, answer({"status": "pending"}), PENDING),
        (200, answer({"status": "decided"}), FAILED),
        (200, answer({"status": "decided", "decision": {"outcome": 7, "decidedAt": "x"}}), FAILED),
        (200, b"<html>", FAILED),
        (200, answer(["pending"]), FAILED),
        (500, b"", FAILED),
        (502, b"", FAILED),
        (503, answer({"code": "service.unavailable"}), FAILED),
        (429, b"", FAILED),
        (408, b"", FAILED),
        (302, b"", FAILED),
        (401, b"", REFUSED),
        (403, answer({"code": "producer.untrusted"}), REFUSED),
        (404, answer({"code": "review.not-found"}), REFUSED),
        (400, b"", REFUSED),
    ],
)
def test_every_other_answer_is_pending_failed_or_refused(
    status: int, body: bytes, kind: str
) -> None:
    read = interpret(status, body)
    assert (read.kind, read.status) == (kind, status)
    assert read.result is None


def test_reasons_never_quote_the_answer() -> None:
    secret = "person-17 applied for a licence"
    for status in (200, 403, 500):
        read = interpret(status, answer({"status": "odd", "detail": secret}))
        assert secret not in read.reason


def test_checks_are_planned_within_ten_percent_of_the_interval() -> None:
    assert check_delay(900, lambda: 0.0) == pytest.approx(810)
    assert check_delay(900, lambda: 0.5) == pytest.approx(900)
    assert check_delay(900, lambda: 0.999999) == pytest.approx(990, abs=0.01)


def test_the_wait_match_depends_on_connection_result_and_review() -> None:
    key = bytes(range(32))
    first = derive.wait_match(key, "review", "review-decision", "rev-1")
    assert len(first) == 32
    assert first == derive.wait_match(key, "review", "review-decision", "rev-1")
    others = {
        derive.wait_match(key, "escalation", "review-decision", "rev-1"),
        derive.wait_match(key, "review", "review-decision", "rev-2"),
        derive.wait_match(bytes(32), "review", "review-decision", "rev-1"),
        derive.wait_match(key, "reviewr", "eview-decision", "rev-1"),
    }
    assert first not in others and len(others) == 4
