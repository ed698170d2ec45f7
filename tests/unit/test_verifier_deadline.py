"""The token verifier never blocks on the issuer (CONTRACT §8.1, issue 36).

The issuer here is a real JWKS endpoint on a loopback socket whose pace the test sets: in
trickle mode it sends the status line, the headers and one byte of the body, then waits
on an event only the test sets. The verifier fetches from it with the gateway's own client
(:func:`gateway.auth.issuer_client`). Waits are on events the issuer sets when a fetch
reaches it; ``asyncio.wait_for`` bounds only guard against a hang, they decide nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import httpx
import jwt
import pytest
from jwt.algorithms import ECAlgorithm

from core.codes import Code
from core.errors import CoordinatorError
from gateway.auth import (
    HttpJwksSource,
    JwksUnavailable,
    TokenVerifier,
    issuer_client,
)
from tests.helpers.gateway_kit import (
    AUDIENCE,
    ISSUER,
    KID,
    NOW,
    OTHER_KEY,
    RUN_A,
    SIGNING_KEY,
    bearer,
    context,
    jwks_document,
    main_client,
)

NEW_KID: Final = "gateway-test-2"
"""A key the issuer publishes after the gateway loaded its keys."""
GUARD_SECONDS: Final = 10.0
"""How long a test waits for something that should be immediate before it calls it a hang."""
SHORT_DEADLINE: Final = 0.5
"""The injected fetch deadline of the tests that let it pass: long enough for a loaded machine
to connect and get the first byte, short enough to wait out."""
STATUS_PATH: Final = f"/v1/runs/{RUN_A}"


def token(kid: str = KID, key: Any = SIGNING_KEY) -> str:
    """An access token alice's intake portal could present, signed with ``key`` as ``kid``."""
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "client_id": "intake-portal",
        "iat": int(NOW) - 5,
        "exp": int(NOW) + 300,
    }
    return jwt.encode(claims, key, algorithm="ES256", headers={"kid": kid, "typ": "at+jwt"})


def rotated_jwks() -> dict[str, Any]:
    """The issuer's key set once it has published :data:`NEW_KID` beside the first key."""
    jwk = ECAlgorithm.to_jwk(OTHER_KEY.public_key(), as_dict=True)
    new = {**jwk, "kid": NEW_KID, "alg": "ES256", "use": "sig"}
    return {"keys": [*jwks_document()["keys"], new]}


class PacedIssuer:
    """A JWKS endpoint on 127.0.0.1 that answers whole, trickles, or streams without end.

    ``mode`` is read when a fetch arrives: ``"whole"`` answers at once; ``"trickle"`` sends
    one byte of the body, sets :attr:`trickling` and waits for :attr:`release` (then sends
    the rest) or for the client to hang up (then sets :attr:`abandoned`); ``"endless"``
    sends body bytes until the client hangs up.
    """

    def __init__(self) -> None:
        self.document: dict[str, Any] = jwks_document()
        self.mode = "whole"
        self.fetches = 0
        self.trickling = asyncio.Event()
        self.release = asyncio.Event()
        self.abandoned = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._exchanges: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._exchange, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/jwks"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        self.release.set()
        await asyncio.gather(*self._exchanges, return_exceptions=True)
        await self._server.wait_closed()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._exchanges.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.fetches += 1
            body = json.dumps(self.document).encode()
            if self.mode == "endless":
                await self._endless(writer)
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
            )
            if self.mode == "whole":
                writer.write(body)
                await writer.drain()
                return
            writer.write(body[:1])
            await writer.drain()
            self.trickling.set()
            # A GET sends nothing more: the next read ends only when the client hangs up.
            hung_up = asyncio.ensure_future(reader.read(1))
            released = asyncio.ensure_future(self.release.wait())
            done, pending = await asyncio.wait(
                {hung_up, released}, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()
            if hung_up in done:
                self.abandoned.set()
                return
            writer.write(body[1:])
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.abandoned.set()
        finally:
            writer.close()
            self._exchanges.discard(task)

    async def _endless(self, writer: asyncio.StreamWriter) -> None:
        # No length and no chunking: the body ends only when the connection does.
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n")
        writer.write(b'{"keys": [')
        while not writer.is_closing():
            writer.write(b" " * 16_384)
            await writer.drain()  # raises once the client has hung up
        self.abandoned.set()


class Monotonic:
    """The verifier's pacing clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def issuer() -> AsyncIterator[PacedIssuer]:
    served = PacedIssuer()
    await served.start()
    yield served
    await served.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # Each phase may take longer than any test lets the fetch take, so only the verifier's
    # deadline ends a trickled fetch here; the gateway's own per-phase timeout would end a
    # one-byte trickle, but not an issuer that sends a byte every few seconds.
    async with issuer_client(60.0) as client:
        yield client


def make_verifier(
    issuer: PacedIssuer, http: httpx.AsyncClient, clock: Monotonic, deadline: float
) -> TokenVerifier:
    return TokenVerifier(
        issuer=ISSUER,
        audience=AUDIENCE,
        algorithms=("ES256",),
        clock_skew_seconds=60,
        source=HttpJwksSource(issuer.url, http),
        clock=lambda: NOW,
        monotonic=clock,
        fetch_deadline_seconds=deadline,
    )


def assert_unavailable(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == Code.SERVICE_UNAVAILABLE.value


async def test_a_known_kid_is_answered_while_a_refresh_trickles(
    issuer: PacedIssuer, http: httpx.AsyncClient
) -> None:
    """The gateway's path: a stale key set is being refetched from a trickling issuer; a
    token with a known kid is answered meanwhile, and one with the new kid waits for that
    fetch and is then answered with the key it brought."""
    clock = Monotonic()
    # The deadline is far away: this test is about not waiting, not about giving up.
    verifier = make_verifier(issuer, http, clock, deadline=60.0)
    assert await verifier.refresh()
    issuer.mode, issuer.document = "trickle", rotated_jwks()
    clock.now += 3601  # stale: each request finds the set due for a refetch

    async with main_client(context(token_verifier=verifier)) as gateway:
        waiting = asyncio.create_task(
            gateway.get(STATUS_PATH, headers=bearer(token(NEW_KID, OTHER_KEY)))
        )
        await asyncio.wait_for(issuer.trickling.wait(), GUARD_SECONDS)

        known = await asyncio.wait_for(
            gateway.get(STATUS_PATH, headers=bearer(token())), GUARD_SECONDS
        )
        assert known.status_code == 200, known.text
        assert known.json()["runId"] == RUN_A
        # ... answered while the fetch is still held at its first byte.
        assert not issuer.release.is_set() and not waiting.done()
        assert issuer.fetches == 2

        issuer.release.set()
        answer = await asyncio.wait_for(waiting, GUARD_SECONDS)
    assert answer.status_code == 200, answer.text
    assert issuer.fetches == 2  # both requests shared the one fetch
    await verifier.close()


async def test_a_stale_key_set_is_refetched_behind_the_requests(
    issuer: PacedIssuer, http: httpx.AsyncClient
) -> None:
    clock = Monotonic()
    verifier = make_verifier(issuer, http, clock, deadline=60.0)
    assert await verifier.refresh()
    issuer.mode = "trickle"
    clock.now += 3601

    # The request that finds the set stale starts the refetch and does not wait for it.
    first = await asyncio.wait_for(verifier.verify(token()), GUARD_SECONDS)
    assert first.sub == "alice"
    await asyncio.wait_for(issuer.trickling.wait(), GUARD_SECONDS)
    second = await asyncio.wait_for(verifier.verify(token()), GUARD_SECONDS)
    assert second.sub == "alice"
    assert issuer.fetches == 2 and not issuer.release.is_set()

    issuer.release.set()
    assert await asyncio.wait_for(verifier.refresh(), GUARD_SECONDS)  # joins, no new fetch
    assert issuer.fetches == 2
    await verifier.close()


async def test_an_unknown_kid_is_503_once_the_deadline_passes(
    issuer: PacedIssuer, http: httpx.AsyncClient
) -> None:
    """The gateway's path: the refresh an unknown kid asks for trickles past its deadline;
    that request is answered 503, the fetch is abandoned, and known kids still pass."""
    clock = Monotonic()
    verifier = make_verifier(issuer, http, clock, deadline=SHORT_DEADLINE)
    assert await verifier.refresh()
    issuer.mode = "trickle"
    clock.now += 61  # an unknown kid may refresh again

    async with main_client(context(token_verifier=verifier)) as gateway:
        stranger = bearer(token(NEW_KID, OTHER_KEY))
        answer = await asyncio.wait_for(gateway.get(STATUS_PATH, headers=stranger), GUARD_SECONDS)
        assert_unavailable(answer)
        assert issuer.trickling.is_set() and not issuer.release.is_set()
        # The verifier hung up on the trickling issuer; nothing keeps reading from it.
        await asyncio.wait_for(issuer.abandoned.wait(), GUARD_SECONDS)

        known = await asyncio.wait_for(
            gateway.get(STATUS_PATH, headers=bearer(token())), GUARD_SECONDS
        )
        assert known.status_code == 200, known.text
        # Within the minute the failed fetch is not retried: still 503, at once.
        clock.now += 30
        again = await asyncio.wait_for(gateway.get(STATUS_PATH, headers=stranger), GUARD_SECONDS)
        assert_unavailable(again)
        assert issuer.fetches == 2
    for part in token(NEW_KID, OTHER_KEY).split("."):
        assert part not in answer.text


async def test_a_trickling_issuer_at_start_leaves_the_verifier_unready_not_stuck(
    issuer: PacedIssuer, http: httpx.AsyncClient
) -> None:
    issuer.mode = "trickle"
    verifier = make_verifier(issuer, http, Monotonic(), deadline=SHORT_DEADLINE)
    assert not await asyncio.wait_for(verifier.refresh(), GUARD_SECONDS)
    assert not verifier.ready
    await asyncio.wait_for(issuer.abandoned.wait(), GUARD_SECONDS)
    with pytest.raises(CoordinatorError) as caught:
        await asyncio.wait_for(verifier.verify(token()), GUARD_SECONDS)
    assert caught.value.code == Code.SERVICE_UNAVAILABLE
    assert issuer.fetches == 1  # within the retry pause: no second fetch


async def test_a_request_that_gives_up_does_not_cancel_the_shared_fetch(
    issuer: PacedIssuer, http: httpx.AsyncClient
) -> None:
    clock = Monotonic()
    verifier = make_verifier(issuer, http, clock, deadline=60.0)
    assert await verifier.refresh()
    issuer.mode, issuer.document = "trickle", rotated_jwks()
    clock.now += 61

    impatient = asyncio.create_task(verifier.verify(token(NEW_KID, OTHER_KEY)))
    await asyncio.wait_for(issuer.trickling.wait(), GUARD_SECONDS)
    impatient.cancel()  # its caller went away
    await asyncio.wait({impatient})
    assert not issuer.abandoned.is_set()

    issuer.release.set()
    assert await asyncio.wait_for(verifier.refresh(), GUARD_SECONDS)
    assert (await verifier.verify(token(NEW_KID, OTHER_KEY))).sub == "alice"
    assert issuer.fetches == 2
    await verifier.close()


async def test_closing_the_verifier_ends_a_running_fetch(
    issuer: PacedIssuer, http: httpx.AsyncClient
) -> None:
    issuer.mode = "trickle"
    verifier = make_verifier(issuer, http, Monotonic(), deadline=60.0)
    starting = asyncio.create_task(verifier.refresh())
    await asyncio.wait_for(issuer.trickling.wait(), GUARD_SECONDS)
    await asyncio.wait_for(verifier.close(), GUARD_SECONDS)
    await asyncio.wait_for(issuer.abandoned.wait(), GUARD_SECONDS)
    assert not await asyncio.wait_for(starting, GUARD_SECONDS)


async def test_a_body_without_end_is_cut_at_the_cap(
    issuer: PacedIssuer, http: httpx.AsyncClient
) -> None:
    issuer.mode = "endless"
    # A body that never ends is read up to the cap and dropped there.
    with pytest.raises(JwksUnavailable, match="too large"):
        await asyncio.wait_for(HttpJwksSource(issuer.url, http).fetch(), GUARD_SECONDS)
    await asyncio.wait_for(issuer.abandoned.wait(), GUARD_SECONDS)
