"""The outbound client's settings and its reading of aiohttp's failures (no sockets here;
``tests/fault/test_hostile_products.py`` drives the wire)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import client_exceptions, http_exceptions

from core.errors import ConfigInvalid
from core.products.http import (
    ANSWER_TOO_LARGE,
    CONNECTION_LOST,
    FRAMING_VIOLATION,
    KEEPALIVE_ENV,
    KEEPALIVE_SECONDS,
    NEVER_CONNECTED,
    UNREADABLE_ANSWER,
    UNSENDABLE,
    ExchangeFailure,
    ProductHttp,
    _failure,
    keepalive_seconds,
)
from core.products.tls import product_ssl_context
from devstack.postgres_tls import LOOPBACK, CertificateAuthority


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


# -- a product behind TLS with a private root ---------------------------------------------------


@pytest.fixture(scope="module")
def product_ca() -> CertificateAuthority:
    return CertificateAuthority.create("Private products CA")


@pytest.fixture
async def https_product(
    tmp_path: Path, product_ca: CertificateAuthority
) -> AsyncIterator[tuple[str, list[bytes]]]:
    """An HTTPS product on 127.0.0.1 whose certificate chains to ``product_ca`` only;
    answers 201 to every request and lists the request lines it read."""
    cert_pem, key_pem = product_ca.issue_server(("localhost", LOOPBACK))
    cert, key = tmp_path / "product.crt", tmp_path / "product.key"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head.split(b"\r\n", 1)[0])
            writer.write(b'HTTP/1.1 201 Created\r\nContent-Length: 11\r\n\r\n{"ok":true}')
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, LOOPBACK, 0, ssl=context)
    try:
        yield f"https://localhost:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()
        await server.wait_closed()


async def test_a_private_root_is_trusted_for_its_connection(
    https_product: tuple[str, list[bytes]], product_ca: CertificateAuthority
) -> None:
    url, seen = https_product
    http = ProductHttp()
    try:
        answer = await http.exchange(
            "POST",
            url + "/v1/x",
            headers={},
            body=b"{}",
            timeout=5.0,
            tls=product_ssl_context(product_ca.pem),
        )
    finally:
        await http.close()
    assert (answer.status, answer.body) == (201, b'{"ok":true}')
    assert seen == [b"POST /v1/x HTTP/1.1"]


async def test_an_untrusted_certificate_is_never_connected_so_nothing_was_sent(
    https_product: tuple[str, list[bytes]],
) -> None:
    url, seen = https_product
    http = ProductHttp()
    try:
        with pytest.raises(ExchangeFailure) as caught:
            # The system roots do not vouch for the private root.
            await http.exchange("POST", url + "/v1/x", headers={}, body=b"{}", timeout=5.0)
    finally:
        await http.close()
    assert (caught.value.cause, caught.value.sent) == (NEVER_CONNECTED, False)
    assert seen == []
