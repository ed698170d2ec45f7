"""The outbound client's settings and its reading of aiohttp's failures (no sockets here;
``tests/fault/test_hostile_products.py`` drives the wire)."""

from __future__ import annotations

import pytest
from aiohttp import client_exceptions, http_exceptions

from core.errors import ConfigInvalid
from core.products.http import (
    ANSWER_TOO_LARGE,
    CONNECTION_LOST,
    FRAMING_VIOLATION,
    KEEPALIVE_ENV,
    KEEPALIVE_SECONDS,
    UNREADABLE_ANSWER,
    UNSENDABLE,
    ExchangeFailure,
    ProductHttp,
    _failure,
    keepalive_seconds,
)


def test_keepalive_defaults_to_two_seconds_and_takes_zero_to_sixty() -> None:
    assert keepalive_seconds({}) == KEEPALIVE_SECONDS == 2.0
    assert keepalive_seconds({KEEPALIVE_ENV: "0"}) == 0.0
    assert keepalive_seconds({KEEPALIVE_ENV: "1.5"}) == 1.5
    assert keepalive_seconds({KEEPALIVE_ENV: "60"}) == 60.0


@pytest.mark.parametrize("value", ["-1", "61", "soon", "", "nan"])
def test_a_keepalive_out_of_range_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        keepalive_seconds({KEEPALIVE_ENV: value})
    assert KEEPALIVE_ENV in caught.value.detail


async def test_a_header_with_a_line_break_is_refused_before_anything_is_opened() -> None:
    http = ProductHttp()
    try:
        with pytest.raises(ExchangeFailure) as caught:
            await http.exchange(
                "POST",
                "http://127.0.0.1:9/never",
                headers={"Idempotency-Key": "a\r\nX-Forged: 1"},
                timeout=1.0,
            )
    finally:
        await http.close()
    assert (caught.value.cause, caught.value.sent) == (UNSENDABLE, False)


def parser_refusal(underlying: Exception) -> client_exceptions.ClientResponseError:
    """A parser refusal as aiohttp raises it: a 400 response error, its parser's exception
    rewrapped and chained below."""
    rewrapped = http_exceptions.HttpProcessingError(code=400, message="refused")
    rewrapped.__cause__ = underlying
    error = client_exceptions.ClientResponseError(None, (), status=400)  # type: ignore[arg-type]
    error.__cause__ = rewrapped
    return error


@pytest.mark.parametrize(
    ("underlying", "cause"),
    [
        (http_exceptions.LineTooLong("header", "65536"), ANSWER_TOO_LARGE),
        (http_exceptions.BadStatusLine("HTTX/1.1"), UNREADABLE_ANSWER),
        (http_exceptions.BadHttpMessage("duplicate Content-Length"), FRAMING_VIOLATION),
        (http_exceptions.TransferEncodingError("bad chunk"), FRAMING_VIOLATION),
    ],
)
def test_the_parsers_refusals_are_sent_and_uncertain_by_their_kind(
    underlying: Exception, cause: str
) -> None:
    failure = _failure(parser_refusal(underlying))
    assert (failure.cause, failure.sent) == (cause, True)


@pytest.mark.parametrize(
    "error",
    [
        client_exceptions.ServerDisconnectedError(),
        client_exceptions.ClientPayloadError("cut short"),
        client_exceptions.ClientOSError(104, "reset by peer"),
        ConnectionResetError(104, "reset by peer"),
        RuntimeError("something nobody expected"),
    ],
)
def test_anything_else_after_connecting_is_a_lost_connection_never_a_retry(
    error: Exception,
) -> None:
    failure = _failure(error)
    assert (failure.cause, failure.sent) == (CONNECTION_LOST, True)
