"""A product or issuer whose TLS certificate fails verification sends nothing and says so
(CONTRACT §8.4, §9.3 "Untrusted endpoints are visible").

The product is a real TLS server on 127.0.0.1, known to the connection as
``https://localhost:<port>`` and reached by the coordinator's own HTTP client with the
connection's trusted root (``trustedRootCertificateRef``). It shows, per handshake, the
certificate the test chooses: one from a root nobody trusts, one from the trusted root that
names another host, or a good one. The issuer is the development issuer in-process, or, for
the tests of an untrusted issuer, a real TLS server of its own whose root the system roots do
not hold (then the issuer's host is sent there).

Either way the handshake fails before a byte of the request leaves: the step is ready again
with cause ``tls-refused`` and its run asks for attention, until the certificate is mended
(the step prepares and sends, and both signs go) or the step's deadline passes (it fails
``deadline-exceeded`` and leaves no attention behind). Time moves by the test clock.

A wait-for's result read that fails TLS verification (the product's or the issuer's) keeps
the run waiting with attention, as a refused read does, until a read is answered; those
failures are given as the HTTP client reports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from core.products.http import TLS_REFUSED, Answer, Exchanger, ProductHttp
from core.runtime import Store
from devstack.postgres import DatabaseHandle
from devstack.postgres_tls import LOOPBACK, CertificateAuthority
from recovery import reads
from tests.helpers.base_kit import ISSUER
from tests.helpers.deployment import write_secret
from tests.helpers.dispatching import CLIENT, DispatchKit, dispatch_kit, token_refusals
from tests.helpers.failing_http import FailingHttp
from tests.helpers.pinned_clock import T0
from tests.helpers.review_kit import CASEWORK, ReviewKit, review_kit

pytestmark = pytest.mark.postgres

MESSAGE_ID = "msg-tls-1"
DEADLINE_SECONDS = 60  # the test workflows' deadlineSeconds


class TlsServer:
    """A server on 127.0.0.1 behind TLS, answering every request it reads with 201 and a
    Messaging ``messageId``, and keeping each request's head and body. The certificate it
    shows is chosen per handshake (:meth:`show`), so a test can mend it between attempts."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._shown: ssl.SSLContext | None = None
        self._server: asyncio.Server | None = None
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.port = 0

    def show(self, authority: CertificateAuthority, hosts: tuple[str, ...]) -> None:
        """From the next handshake on, show a certificate for ``hosts`` from ``authority``."""
        cert_pem, key_pem = authority.issue_server(hosts)
        shown = len(list(self._folder.glob("shown-*.crt")))
        cert, key = self._folder / f"shown-{shown}.crt", self._folder / f"shown-{shown}.key"
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._shown = context

    def _choose(self, connection: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        # Called with the client's hello, before a certificate is picked.
        assert self._shown is not None
        connection.context = self._shown

    async def start(self) -> None:
        assert self._shown is not None, "show a certificate first"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.sni_callback = self._choose
        self._server = await asyncio.start_server(self._answer, LOOPBACK, 0, ssl=context)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *fields = head.rstrip("\r\n").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, v in (f.split(":", 1) for f in fields)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((line, headers, body))
            answer = json.dumps({"messageId": MESSAGE_ID}).encode()
            writer.write(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(answer)}\r\nConnection: close\r\n\r\n".encode()
                + answer
            )
            await writer.drain()
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class Wire:
    """The dispatcher's exchanger in these tests: ``https://localhost`` over real sockets with
    the coordinator's own client (and the TLS context the caller gives); the issuer
    in-process, unless :attr:`issuer_port` sends its host to a TLS server on that port (still
    with the caller's context: none, so the system roots)."""

    def __init__(self, in_process: Exchanger) -> None:
        self._in_process = in_process
        self._real = ProductHttp()
        self.issuer_port: int | None = None

    async def exchange(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> Answer:
        parts = urlsplit(url)
        if url.startswith(ISSUER) and self.issuer_port is not None:
            url = f"https://localhost:{self.issuer_port}{parts.path}"
        elif parts.hostname != "localhost":
            return await self._in_process.exchange(
                method, url, headers=headers, body=body, timeout=timeout, tls=tls
            )
        return await self._real.exchange(
            method, url, headers=headers, body=body, timeout=timeout, tls=tls
        )

    async def close(self) -> None:
        await self._real.close()
        await self._in_process.close()


@pytest.fixture(scope="module")
def trusted() -> CertificateAuthority:
    return CertificateAuthority.create("Private products CA")


@pytest.fixture(scope="module")
def stranger() -> CertificateAuthority:
    return CertificateAuthority.create("A CA nobody here trusts")


@pytest.fixture
async def product(tmp_path: Path, trusted: CertificateAuthority) -> AsyncIterator[TlsServer]:
    server = TlsServer(tmp_path)
    server.show(trusted, ("localhost", LOOPBACK))
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def kit(
    tmp_path: Path,
    database: DatabaseHandle,
    product: TlsServer,
    trusted: CertificateAuthority,
) -> AsyncIterator[DispatchKit]:
    # The connection trusts the private root, and nothing else, for its product.
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700, exist_ok=True)
    write_secret(secrets, "products-ca.pem", trusted.pem)
    notices = {
        "type": "messaging",
        "baseUrl": product.url,
        "profile": "applicant-notices",
        "trustedRootCertificateRef": "secret:file/products-ca.pem",
        "authorization": {
            "clientId": CLIENT,
            "signingKeyRef": "secret:file/notices-client.jwk",
            "scopes": ["messages:send"],
        },
    }
    async with dispatch_kit(tmp_path, database, connections={"notices": notices}) as made:
        made.http = Wire(made.http)
        yield made


@pytest.fixture
async def recovery_store(kit: DispatchKit) -> Store:
    store = Store(kit.runtime, "recovery")
    kit.stores.append(store)
    await store.open()
    return store


def wire(kit: DispatchKit) -> Wire:
    assert isinstance(kit.http, Wire)
    return kit.http


async def shown(store: Store, run_id: str) -> tuple[bool, dict[str, Any]]:
    """The run's attention and its call step, as inspection shows them."""
    document = await reads.inspection(store, run_id)
    [step] = [s for s in document["steps"] if s["step"] == "send"]
    return bool(document["attention"]), step


# ------------------------------------------------------------------- the product's certificate

BAD_CERTIFICATES = ("untrusted root", "another host")


def bad_certificate(
    bad: str, trusted: CertificateAuthority, stranger: CertificateAuthority
) -> tuple[CertificateAuthority, tuple[str, ...]]:
    """A certificate the connection must refuse: from a root it does not trust, or from its
    root but for another host."""
    if bad == "untrusted root":
        return stranger, ("localhost", LOOPBACK)
    return trusted, ("products.elsewhere.example.org",)


@pytest.mark.parametrize("bad", BAD_CERTIFICATES)
async def test_a_product_failing_tls_verification_shows_tls_refused_until_mended(
    kit: DispatchKit,
    recovery_store: Store,
    product: TlsServer,
    trusted: CertificateAuthority,
    stranger: CertificateAuthority,
    fake_clock: Callable[[datetime], None],
    bad: str,
) -> None:
    product.show(*bad_certificate(bad, trusted, stranger))
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-1"})

    assert await dispatcher.run_once() == 1

    # The handshake failed: nothing reached the product, and the step waits to try again.
    assert product.requests == []
    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"], row["effect"], row["attempts"]) == (
        "ready",
        "tls-refused",
        None,
        1,
    )
    assert row["due_at"] <= T0 + timedelta(seconds=1.25)  # the first retry's backoff
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("running", True)
    attention, step = await shown(recovery_store, run_id)
    assert attention is True
    assert (step["state"], step["cause"]) == ("ready", "tls-refused")
    assert "effect" not in step and "causeStatus" not in step
    assert dispatcher.metrics.calls("messaging", "retryable") == 1
    doctor = await reads.doctor(recovery_store, audit_ready=True, recovery_only=False)
    assert doctor["tokenRefusals"] == []  # the issuer refused nothing

    # The product shows a good certificate again: the same command goes out, once, under
    # the same key, and the signs go away.
    product.show(trusted, ("localhost", LOOPBACK))
    fake_clock(T0 + timedelta(seconds=2))
    assert await dispatcher.run_once() == 2  # the call, and the finish its settle passed

    [(line, headers, _)] = product.requests
    assert line == "POST /v1/profiles/applicant-notices/messages HTTP/1.1"
    assert headers["idempotency-key"] == kit.key(run_id)
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["attention"]) == ("succeeded", "sent", False)
    attention, step = await shown(recovery_store, run_id)
    assert attention is False
    assert (step["state"], step["effect"], step["attempts"]) == ("completed", "accepted", 2)
    assert "cause" not in step
    assert await kit.payload(run_id, "send", "output") == {"messageId": MESSAGE_ID}


async def test_a_product_that_stays_untrusted_fails_the_run_at_its_deadline_without_attention(
    kit: DispatchKit,
    recovery_store: Store,
    product: TlsServer,
    stranger: CertificateAuthority,
    fake_clock: Callable[[datetime], None],
) -> None:
    product.show(stranger, ("localhost", LOOPBACK))
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-2"})
    assert await dispatcher.run_once() == 1
    assert (await kit.run(run_id))["attention"] is True

    # Retried while the deadline allows (each attempt failing the same way)...
    fake_clock(T0 + timedelta(seconds=2))
    assert await dispatcher.run_once() == 1
    row = await kit.step(run_id, "send")
    assert (row["state"], row["cause"], row["attempts"]) == ("ready", "tls-refused", 2)
    assert (await kit.run(run_id))["attention"] is True

    # ...then the deadline passes: deadline-exceeded, and no attention left behind.
    fake_clock(T0 + timedelta(seconds=DEADLINE_SECONDS + 1))
    assert await dispatcher.run_once() == 1
    run = await kit.run(run_id)
    assert (run["state"], run["failure_kind"], run["attention"]) == (
        "failed",
        "deadline-exceeded",
        False,
    )
    attention, step = await shown(recovery_store, run_id)
    assert attention is False
    assert step["state"] == "failed" and "cause" not in step
    assert product.requests == []


# -------------------------------------------------------------------- the issuer's certificate


async def test_an_issuer_failing_tls_verification_shows_tls_refused_until_mended(
    kit: DispatchKit,
    recovery_store: Store,
    product: TlsServer,
    stranger: CertificateAuthority,
    tmp_path: Path,
    fake_clock: Callable[[datetime], None],
) -> None:
    folder = tmp_path / "issuer-tls"
    folder.mkdir()
    issuer = TlsServer(folder)
    issuer.show(stranger, ("localhost", LOOPBACK))
    await issuer.start()
    try:
        wire(kit).issuer_port = issuer.port
        dispatcher = await kit.dispatcher()
        run_id = await kit.start("notice", {"applicantRef": "applicant-3"})

        assert await dispatcher.run_once() == 1

        # No token, so nothing prepared and nothing sent; not a refusal by the issuer.
        assert issuer.requests == [] and product.requests == []
        row = await kit.step(run_id, "send")
        assert (row["state"], row["cause"], row["attempts"], row["command_key"]) == (
            "ready",
            "tls-refused",
            0,
            None,
        )
        assert row["deadline_at"] == T0 + timedelta(seconds=DEADLINE_SECONDS)
        run = await kit.run(run_id)
        assert (run["state"], run["attention"]) == ("running", True)
        attention, step = await shown(recovery_store, run_id)
        assert attention is True and step["cause"] == "tls-refused"
        doctor = await reads.doctor(recovery_store, audit_ready=True, recovery_only=False)
        assert doctor["tokenRefusals"] == []
        assert token_refusals(dispatcher.metrics, "messaging") == 0
    finally:
        await issuer.close()

    # The issuer is reached through a certificate the coordinator trusts again.
    wire(kit).issuer_port = None
    fake_clock(T0 + timedelta(seconds=dispatcher.settings.error_retry_seconds))
    assert await dispatcher.run_once() == 2  # the call, and the finish its settle passed

    assert len(product.requests) == 1
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["attention"]) == ("succeeded", "sent", False)
    attention, step = await shown(recovery_store, run_id)
    assert attention is False and "cause" not in step
    assert step["effect"] == "accepted"


# ------------------------------------------------------------------------------ result reads


def untrusted_reads(inner: Exchanger, target: str) -> FailingHttp:
    """Result reads (GETs to Casework), or the issuer's token requests, fail TLS
    verification as the HTTP client reports it, while ``failing`` says so."""

    def fails(method: str, url: str) -> bool:
        if target == "product":
            return method == "GET" and url.startswith(CASEWORK)
        return url.startswith(ISSUER) and urlsplit(url).path.endswith("/token")

    return FailingHttp(inner, fails, TLS_REFUSED)


@pytest.fixture
async def review(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[ReviewKit]:
    # No completion block: only polling reads the result, so nothing races the test.
    async with review_kit(tmp_path, database, completion=False) as made:
        yield made


@pytest.mark.parametrize("target", ["product", "issuer"])
async def test_a_result_read_failing_tls_verification_keeps_the_wait_with_attention(
    review: ReviewKit, fake_clock: Callable[[datetime], None], target: str
) -> None:
    dispatcher = await review.dispatcher()
    run_id = await review.start()
    await dispatcher.drain()  # the review is requested and the first read finds it pending
    wait = await review.step(run_id)
    assert wait is not None and wait["state"] == "waiting"
    assert (await review.run(run_id))["attention"] is False

    # From now on Casework (or the issuer) fails TLS verification; a new dispatcher has no
    # token cached, so the issuer is asked too.
    untrusted = untrusted_reads(review.http, target)
    review.http = untrusted
    dispatcher = await review.dispatcher()
    fake_clock(wait["next_check_at"] + timedelta(seconds=1))
    assert await dispatcher.run_once() == 1

    run = await review.run(run_id)
    wait = await review.step(run_id)
    assert wait is not None
    assert (run["state"], run["attention"], wait["state"], wait["checks"]) == (
        "waiting",
        True,
        "waiting",
        2,
    )
    assert wait["cause"] is None  # causes are a call's; the wait only asks for attention

    # Mended: the next read is answered (still pending), and the mark goes.
    untrusted.failing = False
    fake_clock(wait["next_check_at"] + timedelta(seconds=1))
    assert await dispatcher.run_once() == 1
    run = await review.run(run_id)
    assert (run["state"], run["attention"]) == ("waiting", False)
