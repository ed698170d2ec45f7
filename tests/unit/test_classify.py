"""Classification of product answers (CONTRACT §9.3 step 4) and the retry delays."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from core.execution.classify import (
    ACCEPTED,
    NOT_SENDABLE,
    REFUSED,
    RETRYABLE,
    STATUS_5XX,
    UNCERTAIN,
    Classified,
    classify_answer,
    classify_failure,
    retry_cause,
    retry_delay,
    retry_wait,
)
from core.products.http import (
    ANSWER_TOO_LARGE,
    CONNECTION_LOST,
    FRAMING_VIOLATION,
    NEVER_CONNECTED,
    TIMEOUT_AFTER_SEND,
    TLS_REFUSED,
    UNREADABLE_ANSWER,
    UNSENDABLE,
    ExchangeFailure,
    retry_after_seconds,
)
from core.states import RetryCause
from tests.unit.test_states import allowed


def problem(code: str) -> bytes:
    return json.dumps({"type": "about:blank", "status": 0, "code": code}).encode()


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_a_2xx_with_a_json_object_is_accepted_with_its_body(status: int) -> None:
    result = classify_answer(status, b'{"messageId": "m-1", "acceptedAt": "x"}')
    assert (result.result, result.status) == (ACCEPTED, status)
    assert result.response == {"messageId": "m-1", "acceptedAt": "x"}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'"text"',
        b"null",
        b"\xff\xfe",
        # Numbers RFC 8785 cannot seal: the answer could not be kept, so it is not taken.
        b'{"messageId": 9007199254740993}',
        b'{"messageId": NaN}',
        b'{"messageId": 1e400}',
    ],
)
def test_a_2xx_whose_body_is_not_a_json_object_is_uncertain(body: bytes) -> None:
    result = classify_answer(202, body)
    assert result.result == UNCERTAIN
    assert result.response is None


def test_429_is_retryable_whatever_its_body() -> None:
    assert classify_answer(429, b"").result == RETRYABLE
    assert classify_answer(429, problem("rate-limited")).result == RETRYABLE


def test_503_is_retryable_only_with_the_service_unavailable_code() -> None:
    assert classify_answer(503, problem("service.unavailable")).result == RETRYABLE
    assert classify_answer(503, problem("maintenance")).result == UNCERTAIN
    assert classify_answer(503, b"<html>proxy</html>").result == UNCERTAIN
    assert classify_answer(503, b"").result == UNCERTAIN


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_definite_refusals(status: int) -> None:
    result = classify_answer(status, problem("idempotency.conflict"))
    assert (result.result, result.status) == (REFUSED, status)
    assert "idempotency.conflict" in result.reason


@pytest.mark.parametrize("status", [300, 302, 405, 408, 410, 413, 415, 500, 501, 502, 504, 599])
def test_every_other_status_is_uncertain(status: int) -> None:
    assert classify_answer(status, problem("service.unavailable")).result == UNCERTAIN


def test_reasons_never_quote_the_body() -> None:
    secret = b'{"messageId": "applicant-personal-data"}'
    for status in (202, 400, 500, 503):
        assert "applicant" not in classify_answer(status, secret).reason


def test_only_a_connection_that_never_existed_is_retryable() -> None:
    result = classify_failure(ExchangeFailure(NEVER_CONNECTED, sent=False))
    assert (result.result, result.cause) == (RETRYABLE, None)


def test_a_failed_tls_verification_is_retryable_and_carries_its_cause() -> None:
    # Nothing left, as with a connection never made; the cause is what makes it visible.
    result = classify_failure(ExchangeFailure(TLS_REFUSED, sent=False))
    assert (result.result, result.cause, result.cause_status) == (RETRYABLE, "tls-refused", None)
    assert result.status is None
    assert "tls-refused" in result.reason


def test_a_request_refused_before_it_was_written_is_not_sendable_and_not_uncertain() -> None:
    result = classify_failure(ExchangeFailure(UNSENDABLE, sent=False))
    assert (result.result, result.cause) == (NOT_SENDABLE, None)


@pytest.mark.parametrize(
    "cause",
    [
        TIMEOUT_AFTER_SEND,
        CONNECTION_LOST,
        UNREADABLE_ANSWER,
        FRAMING_VIOLATION,
        ANSWER_TOO_LARGE,
    ],
)
def test_failures_after_the_request_may_have_left_are_uncertain_with_their_cause(
    cause: str,
) -> None:
    result = classify_failure(ExchangeFailure(cause, sent=True))
    assert (result.result, result.cause, result.cause_status) == (UNCERTAIN, cause, None)
    assert result.status is None
    assert cause in result.reason


@pytest.mark.parametrize("status", [500, 502, 504, 599])
def test_a_5xx_names_its_status_as_the_cause(status: int) -> None:
    result = classify_answer(status, b"{}")
    assert (result.result, result.cause, result.cause_status) == (UNCERTAIN, STATUS_5XX, status)


@pytest.mark.parametrize("status", [200, 201, 202])
def test_a_2xx_that_is_not_a_json_object_is_an_unreadable_answer(status: int) -> None:
    result = classify_answer(status, b"not json")
    assert (result.result, result.cause, result.cause_status) == (
        UNCERTAIN,
        UNREADABLE_ANSWER,
        None,
    )


def test_retry_delays_double_from_one_second_up_to_five_minutes() -> None:
    no_jitter = [retry_delay(n, jitter=lambda: 0.0) for n in range(1, 12)]
    assert no_jitter[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert no_jitter[-1] == 300.0
    assert max(no_jitter) == 300.0


def test_jitter_adds_at_most_a_quarter_and_never_passes_the_cap() -> None:
    assert retry_delay(1, jitter=lambda: 0.999) == pytest.approx(1.24975)
    assert retry_delay(3, jitter=lambda: 0.5) == pytest.approx(4.5)
    assert retry_delay(40, jitter=lambda: 0.999) == 300.0
    assert retry_delay(2, first=0.5, cap=10.0, jitter=lambda: 0.0) == 1.0


def test_a_retry_delay_needs_at_least_one_retryable_answer() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        retry_delay(0)


def test_a_problem_code_that_is_not_code_shaped_is_not_repeated() -> None:
    result = classify_answer(409, problem("Jane Doe, 12 Main Street"))
    assert (result.result, result.reason) == (REFUSED, "409")


# -- what a retryable answer shows (CONTRACT §8.4 ``retry.lastCause``) ---------------------


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (classify_answer(429, problem("rate-limited")), RetryCause.STATUS_429),
        (classify_answer(429, b""), RetryCause.STATUS_429),
        (classify_answer(503, problem("service.unavailable")), RetryCause.STATUS_503),
        (
            classify_failure(ExchangeFailure(NEVER_CONNECTED, sent=False)),
            RetryCause.NEVER_CONNECTED,
        ),
        (classify_failure(ExchangeFailure(TLS_REFUSED, sent=False)), RetryCause.TLS_REFUSED),
        # Any other failure before the first byte left is a connection never made.
        (classify_failure(ExchangeFailure("dns-failed", sent=False)), RetryCause.NEVER_CONNECTED),
        # The product refused the token and the issuer gave no fresh one (the dispatcher's).
        (Classified(RETRYABLE, "401, and no fresh token", 401), RetryCause.TOKEN_REFUSED),
        # No status but 429 and 503 is retryable today; were one to be, a 5xx reads as the
        # product's unavailability and anything else as its "not now".
        (Classified(RETRYABLE, "502", 502), RetryCause.STATUS_503),
        (Classified(RETRYABLE, "500", 500), RetryCause.STATUS_503),
        (Classified(RETRYABLE, "408", 408), RetryCause.STATUS_429),
    ],
)
def test_each_retryable_result_names_what_its_attempt_met(
    result: Classified, expected: RetryCause
) -> None:
    assert result.result == RETRYABLE
    assert retry_cause(result) is expected


@pytest.mark.parametrize(
    "result",
    [
        classify_answer(201, b'{"messageId": "m-1"}'),
        classify_answer(409, problem("idempotency.conflict")),
        classify_answer(500, problem("internal")),
        # A 503 that does not promise the command was left alone is uncertain, never retried.
        classify_answer(503, problem("draining")),
        classify_answer(502, b""),
        classify_failure(ExchangeFailure(CONNECTION_LOST, sent=True)),
    ],
)
def test_a_result_that_is_not_retried_has_no_retry_cause(result: Classified) -> None:
    assert result.result != RETRYABLE
    with pytest.raises(ValueError):
        retry_cause(result)


def test_the_retry_causes_are_the_schemas_and_the_api_documents() -> None:
    root = Path(__file__).resolve().parents[2]
    assert allowed("step", "retry_cause") == {str(c) for c in RetryCause}
    api = yaml.safe_load((root / "docs" / "openapi.yaml").read_text())
    listed = api["components"]["schemas"]["Retry"]["properties"]["lastCause"]["enum"]
    assert set(listed) == {str(c) for c in RetryCause}


NOW = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 0 ", 0.0),
        ("Mon, 07 Jan 2030 09:05:00 GMT", 300.0),
        ("Mon, 07 Jan 2030 08:00:00 GMT", 0.0),  # a date already past: at once
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("99999999999", None),
        (None, None),
    ],
)
def test_retry_after_is_delay_seconds_or_an_http_date(
    value: str | None, seconds: float | None
) -> None:
    assert retry_after_seconds(value, NOW) == seconds


def test_only_a_retryable_answer_keeps_its_retry_after() -> None:
    assert classify_answer(429, b"", 120.0).retry_after == 120.0
    assert classify_answer(503, problem("service.unavailable"), 30.0).retry_after == 30.0
    assert classify_answer(503, problem("maintenance"), 30.0).retry_after is None
    assert classify_answer(500, b"", 30.0).retry_after is None


def test_retry_after_lengthens_the_wait_up_to_the_cap_and_never_shortens_it() -> None:
    def wait(retries: int, result: Classified) -> float:
        return retry_wait(retries, result, jitter=lambda: 0.0)

    assert wait(1, classify_answer(429, b"")) == 1.0
    assert wait(1, classify_answer(429, b"", 120.0)) == 120.0
    assert wait(1, classify_answer(429, b"", 3600.0)) == 300.0
    assert wait(9, classify_answer(429, b"", 2.0)) == 256.0
