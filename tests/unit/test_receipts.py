"""The receipt client reconcile reads products' receipts with (CONTRACT §10.1, §14)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from core.products.http import TLS_REFUSED, ExchangeFailure
from core.products.receipts import (
    EXPIRED,
    FOUND,
    NOT_SEEN,
    UNAVAILABLE,
    classify_receipt,
    read_receipt,
    receipt_url,
)
from core.products.token_client import TokenUnavailable
from core.workflow.catalogue import operation
from tests.helpers.asgi_http import AsgiHttp

SEND = operation("messaging", "send-notice")
SUBMIT = operation("breg-action", "submit-action")
URL = "https://messaging.example.org/v1/profiles/p/receipts/k"
PERSONAL = "applicant-17@example.org"


class Tokens:
    """Hands out numbered tokens; ``fail`` makes the next request for one fail, for the
    exchange's ``cause`` when one is given."""

    def __init__(self, *, fail: bool = False, cause: str | None = None) -> None:
        self.issued = 0
        self.invalidated: list[str] = []
        self.fail = fail
        self.cause = cause

    async def token(self, connection: str) -> str:
        if self.fail:
            raise TokenUnavailable(
                "the issuer could not be reached", retryable=True, cause=self.cause
            )
        self.issued += 1
        return f"token-{self.issued}"

    def invalidate(self, connection: str) -> None:
        self.invalidated.append(connection)


def _body(document: object) -> bytes:
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (200, _body({"messageId": "m-1", "acceptedAt": "2027-01-15T08:00:00Z"}), FOUND),
        (200, b"not json", UNAVAILABLE),
        (200, _body(["a list"]), UNAVAILABLE),
        (404, _body({"code": "receipt.not-found"}), NOT_SEEN),
        # A 404 that is not the product's own answer proves nothing.
        (404, _body({"code": "not-found"}), UNAVAILABLE),
        (404, b"", UNAVAILABLE),
        (410, _body({"code": "receipt.expired"}), EXPIRED),
        (500, _body({"code": "internal-error"}), UNAVAILABLE),
        (503, _body({"code": "service.unavailable"}), UNAVAILABLE),
        (401, _body({"code": "authentication.refused"}), UNAVAILABLE),
    ],
)
def test_answers_are_sorted_into_four_kinds(status: int, body: bytes, kind: str) -> None:
    receipt = classify_receipt(status, body)
    assert (receipt.kind, receipt.status) == (kind, status)
    assert (receipt.body is not None) == (kind == FOUND)


def test_reasons_and_reprs_never_carry_the_body() -> None:
    found = classify_receipt(200, _body({"messageId": PERSONAL}))
    refused = classify_receipt(404, _body({"code": "receipt.not-found", "detail": PERSONAL}))
    odd = classify_receipt(500, _body({"code": PERSONAL}))
    for receipt in (found, refused, odd):
        assert PERSONAL not in receipt.reason
        assert PERSONAL not in repr(receipt)
    assert refused.reason == "404 receipt.not-found"
    assert odd.reason == "500"


def test_the_receipt_url_fills_the_catalogued_route() -> None:
    assert SEND is not None and SUBMIT is not None
    assert receipt_url("https://m.example.org/base/", SEND, "notices", "ab12") == (
        "https://m.example.org/base/v1/profiles/notices/receipts/ab12"
    )
    with pytest.raises(ValueError, match="single path segment"):
        receipt_url("https://m.example.org", SEND, "notices", "../admin")
    with pytest.raises(ValueError, match="no receipts"):
        receipt_url("https://b.example.org", SUBMIT, "register", "ab12")


async def test_a_read_sends_the_connections_token_and_asks_for_json() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"messageId": "m-1"})

    async with AsgiHttp(httpx.MockTransport(answer)) as http:
        receipt = await read_receipt(http, Tokens(), "notices", URL, timeout=5.0)

    assert (receipt.kind, receipt.body) == (FOUND, {"messageId": "m-1"})
    [request] = seen
    assert (request.method, str(request.url)) == ("GET", URL)
    assert request.headers["authorization"] == "Bearer token-1"
    assert request.headers["accept"] == "application/json"


async def test_a_401_is_read_again_once_with_a_fresh_token() -> None:
    answers = [httpx.Response(401), httpx.Response(404, json={"code": "receipt.not-found"})]
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return answers.pop(0)

    tokens = Tokens()
    async with AsgiHttp(httpx.MockTransport(answer)) as http:
        receipt = await read_receipt(http, tokens, "notices", URL, timeout=5.0)

    assert receipt.kind == NOT_SEEN
    assert seen == ["Bearer token-1", "Bearer token-2"]
    assert tokens.invalidated == ["notices"]


async def test_a_second_401_is_unavailable() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401)

    async with AsgiHttp(httpx.MockTransport(answer)) as http:
        receipt = await read_receipt(http, Tokens(), "notices", URL, timeout=5.0)
    assert (receipt.kind, receipt.status) == (UNAVAILABLE, 401)


async def test_no_token_or_no_answer_is_unavailable_and_nothing_is_raised() -> None:
    calls: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    async with AsgiHttp(httpx.MockTransport(refuse)) as http:
        no_token = await read_receipt(http, Tokens(fail=True), "notices", URL, timeout=5.0)
        no_answer = await read_receipt(http, Tokens(), "notices", URL, timeout=5.0)

    assert no_token.kind == UNAVAILABLE and "token" in no_token.reason
    assert (no_answer.kind, no_answer.reason) == (UNAVAILABLE, "no answer (never-connected)")
    assert len(calls) == 1  # without a token nothing was sent


async def test_an_untrusted_product_or_issuer_is_unavailable_and_named_tls_refused() -> None:
    def untrusted(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing is read without a token")

    async with AsgiHttp(httpx.MockTransport(untrusted)) as http:
        issuer = await read_receipt(
            http, Tokens(fail=True, cause="tls-refused"), "notices", URL, timeout=5.0
        )
    assert (issuer.kind, issuer.reason) == (
        UNAVAILABLE,
        "no access token for the connection (tls-refused)",
    )

    class Untrusted(AsgiHttp):
        async def exchange(self, *args: Any, **kwargs: Any) -> Any:
            raise ExchangeFailure(TLS_REFUSED, sent=False)

    async with Untrusted(httpx.MockTransport(untrusted)) as http:
        product = await read_receipt(http, Tokens(), "notices", URL, timeout=5.0)
    assert (product.kind, product.reason) == (UNAVAILABLE, "no answer (tls-refused)")
