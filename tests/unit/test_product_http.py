"""The outbound client's settings, what it refuses before connecting, and TLS
(``tests/fault/test_hostile_products.py`` drives the wire)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.errors import ConfigInvalid
from core.products.http import (
    RETIRED_KEEPALIVE_ENV,
    TLS_REFUSED,
    UNSENDABLE,
    ExchangeFailure,
    ProductHttp,
    refuse_retired_settings,
)
from core.products.tls import product_ssl_context
from devstack.postgres_tls import LOOPBACK, CertificateAuthority


@pytest.mark.parametrize("value", ["2", "0", ""])
def test_the_retired_keepalive_setting_is_refused_by_name_whatever_its_value(value: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        refuse_retired_settings({RETIRED_KEEPALIVE_ENV: value})
    assert RETIRED_KEEPALIVE_ENV in caught.value.detail
    refuse_retired_settings({"COORDINATOR_SOMETHING_ELSE": "2"})


@pytest.mark.parametrize(
    ("url", "headers"),
    [
        ("http://127.0.0.1:9/never", {"Idempotency-Key": "a\r\nX-Forged: 1"}),
        ("http://127.0.0.1:9/a path", {}),
        ("ftp://127.0.0.1:9/never", {}),
        ("http://user:secret@127.0.0.1:9/never", {}),
        ("http://127.0.0.1:99999/never", {}),
        ("http:///no-host", {}),
        ("http://127.0.0.1:9/never", {"Bad Name": "1"}),
    ],
    ids=["line-break", "space-in-path", "scheme", "userinfo", "port", "no-host", "header-name"],
)
async def test_an_unsendable_request_is_refused_before_anything_is_opened(
    url: str, headers: dict[str, str]
) -> None:
    http = ProductHttp()
    try:
        with pytest.raises(ExchangeFailure) as caught:
            await http.exchange("POST", url, headers=headers, body=b"{}", timeout=1.0)
    finally:
        await http.close()
    assert (caught.value.cause, caught.value.sent) == (UNSENDABLE, False)


# -- a product behind TLS with a private root ---------------------------------------------------


@pytest.fixture(scope="module")
def product_ca() -> CertificateAuthority:
    return CertificateAuthority.create("Private products CA")


@pytest.fixture
def certificate_hosts() -> tuple[str, ...]:
    """The names the product's certificate carries (a test may name others)."""
    return ("localhost", LOOPBACK)


@pytest.fixture
async def https_product(
    tmp_path: Path, product_ca: CertificateAuthority, certificate_hosts: tuple[str, ...]
) -> AsyncIterator[tuple[str, list[bytes]]]:
    """An HTTPS product on 127.0.0.1, reached as ``localhost``, whose certificate chains to
    ``product_ca`` only; answers 201 to every request and lists the request lines it read."""
    cert_pem, key_pem = product_ca.issue_server(certificate_hosts)
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


async def test_an_untrusted_certificate_is_refused_tls_so_nothing_was_sent(
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
    assert (caught.value.cause, caught.value.sent) == (TLS_REFUSED, False)
    assert seen == []


@pytest.mark.parametrize("certificate_hosts", [("product.example",)])
async def test_a_certificate_naming_another_host_is_refused_tls(
    https_product: tuple[str, list[bytes]], product_ca: CertificateAuthority
) -> None:
    url, seen = https_product
    http = ProductHttp()
    try:
        with pytest.raises(ExchangeFailure) as caught:
            # A root the connection trusts, but a certificate for another name.
            await http.exchange(
                "POST",
                url + "/v1/x",
                headers={},
                body=b"{}",
                timeout=5.0,
                tls=product_ssl_context(product_ca.pem),
            )
    finally:
        await http.close()
    assert (caught.value.cause, caught.value.sent) == (TLS_REFUSED, False)
    assert seen == []
