"""The dispatcher's OAuth token client, end to end against the development issuer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.products.http import TLS_REFUSED
from core.products.token_client import (
    ClientCredentials,
    IssuerDiscovery,
    TokenClient,
    TokenUnavailable,
    credentials_for,
)
from devstack.issuer import ASSERTION_TYPE, DevIssuer, generate_private_jwk
from devstack.products.common import StandInSettings
from devstack.products.messaging import MessagingStandIn
from tests.helpers.asgi_http import AsgiHttp
from tests.helpers.devstack_kit import (
    ISSUER_URL,
    FakeClock,
    HostRouter,
    client_for,
    make_issuer,
)
from tests.helpers.failing_http import FailingHttp

CLIENT = "coordinator-notices"
# A base URL with a path and trailing slash: the resource must be sent verbatim.
AUDIENCE = "http://messaging.test/api/"


@dataclass
class Kit:
    clock: FakeClock
    issuer: DevIssuer
    router: HostRouter
    http: AsgiHttp
    key: dict[str, Any]

    def client(
        self, scopes: tuple[str, ...] = ("messages:send", "receipts:read"), **kw: Any
    ) -> TokenClient:
        credentials = ClientCredentials(CLIENT, self.key, scopes, AUDIENCE)
        return TokenClient(
            self.http, IssuerDiscovery(self.http, ISSUER_URL), credentials, clock=self.clock, **kw
        )

    def token_requests(self) -> list[dict[str, list[str]]]:
        return [
            parse_qs(r.content.decode()) for r in self.router.requests if r.url.path == "/token"
        ]

    def discoveries(self) -> int:
        return sum(
            1 for r in self.router.requests if r.url.path == "/.well-known/openid-configuration"
        )


@pytest.fixture(params=["ES256", "RS256"])
async def kit(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Kit]:
    clock = FakeClock()
    key = generate_private_jwk(request.param, kid="notices-key-1")
    issuer = make_issuer(
        tmp_path / "issuer", [client_for(CLIENT, key, {"messages:send", "receipts:read"})], clock
    )
    router = HostRouter({ISSUER_URL: issuer.app})
    http = AsgiHttp(router)
    try:
        yield Kit(clock, issuer, router, http, key)
    finally:
        await http.close()


async def test_token_request_carries_assertion_scope_and_resource(kit: Kit) -> None:
    token = await kit.client().token()
    (sent,) = kit.token_requests()
    assert sent["grant_type"] == ["client_credentials"]
    assert sent["client_assertion_type"] == [ASSERTION_TYPE]
    assert sent["scope"] == ["messages:send receipts:read"]
    assert sent["resource"] == [AUDIENCE]

    (signed,) = sent["client_assertion"]
    header = jwt.get_unverified_header(signed)
    assert header["kid"] == "notices-key-1"
    assert header["alg"] == kit.key["alg"]
    claims = jwt.decode(signed, options={"verify_signature": False})
    assert claims["iss"] == claims["sub"] == CLIENT
    assert claims["aud"] == ISSUER_URL + "/token"
    assert 0 < claims["exp"] - int(kit.clock()) <= 300
    assert claims["jti"]

    issued = jwt.decode(token, options={"verify_signature": False})
    assert issued["aud"] == AUDIENCE
    assert issued["client_id"] == CLIENT
    assert issued["scope"] == "messages:send receipts:read"


async def test_token_is_cached_until_shortly_before_expiry(kit: Kit) -> None:
    client = kit.client(refresh_margin_seconds=30)
    first = await client.token()
    kit.clock.advance(269)  # lifetime 300, renewed from 270 on
    assert await client.token() == first
    assert len(kit.token_requests()) == 1
    kit.clock.advance(2)
    second = await client.token()
    assert second != first
    assert len(kit.token_requests()) == 2
    assert kit.discoveries() == 1


async def test_invalidate_forces_one_new_token(kit: Kit) -> None:
    client = kit.client()
    first = await client.token()
    client.invalidate()
    second = await client.token()
    assert second != first
    assert await client.token() == second
    assert len(kit.token_requests()) == 2
    # Every assertion is new: the issuer refuses a replayed jti.
    jtis = {
        jwt.decode(r["client_assertion"][0], options={"verify_signature": False})["jti"]
        for r in kit.token_requests()
    }
    assert len(jtis) == 2


async def test_concurrent_callers_share_one_request(kit: Kit) -> None:
    client = kit.client()
    tokens = await asyncio.gather(*(client.token() for _ in range(5)))
    assert len(set(tokens)) == 1
    assert len(kit.token_requests()) == 1


async def test_refused_client_is_not_retryable_and_leaks_nothing(kit: Kit) -> None:
    client = kit.client(scopes=("messages:send", "bookings:write"))
    with pytest.raises(TokenUnavailable) as caught:
        await client.token()
    assert caught.value.retryable is False
    message = str(caught.value)
    assert "invalid_scope" in message and CLIENT in message
    (sent,) = kit.token_requests()
    assert sent["client_assertion"][0] not in message
    assert "eyJ" not in message


async def test_unreachable_issuer_is_retryable(kit: Kit) -> None:
    kit.router.remove(ISSUER_URL)
    with pytest.raises(TokenUnavailable) as caught:
        await kit.client().token()
    assert (caught.value.retryable, caught.value.cause) == (True, "never-connected")
    assert "never-connected" in str(caught.value)


@pytest.mark.parametrize("path", ["/.well-known/openid-configuration", "/token"])
async def test_an_issuer_failing_tls_verification_is_retryable_and_says_so(
    kit: Kit, path: str
) -> None:
    # The issuer's TLS verification fails for that path.
    http = FailingHttp(kit.http, lambda _method, url: urlsplit(url).path == path, TLS_REFUSED)
    credentials = ClientCredentials(CLIENT, kit.key, ("messages:send",), AUDIENCE)
    client = TokenClient(http, IssuerDiscovery(http, ISSUER_URL), credentials, clock=kit.clock)
    with pytest.raises(TokenUnavailable) as caught:
        await client.token()
    # Retryable (nothing left), with the cause the caller makes visible (CONTRACT §9.3).
    assert (caught.value.retryable, caught.value.cause, caught.value.error) == (
        True,
        "tls-refused",
        None,
    )
    assert "tls-refused" in str(caught.value)


async def test_an_issuer_that_answers_gives_no_cause(kit: Kit) -> None:
    client = kit.client(scopes=("messages:send", "bookings:write"))
    with pytest.raises(TokenUnavailable) as caught:
        await client.token()
    assert caught.value.cause is None


async def test_issuer_server_error_is_retryable(kit: Kit) -> None:
    client = kit.client()
    await client.token()  # discovery is now cached; then the token endpoint starts failing
    failing = Starlette(
        routes=[Route("/token", lambda r: JSONResponse({}, status_code=503), methods=["POST"])]
    )
    kit.router.add(ISSUER_URL, failing)
    client.invalidate()
    with pytest.raises(TokenUnavailable) as caught:
        await client.token()
    assert caught.value.retryable is True
    assert "503" in str(caught.value)


async def test_discovery_must_name_the_same_issuer(kit: Kit) -> None:
    other = Starlette(
        routes=[
            Route(
                "/.well-known/openid-configuration",
                lambda r: JSONResponse(
                    {"issuer": "http://elsewhere.test", "token_endpoint": "http://elsewhere.test/t"}
                ),
            )
        ]
    )
    kit.router.add(ISSUER_URL, other)
    with pytest.raises(TokenUnavailable) as caught:
        await kit.client().token()
    assert caught.value.retryable is False
    assert kit.token_requests() == []


def test_signing_key_needs_kid_and_alg(kit: Kit) -> None:
    no_kid = {k: v for k, v in kit.key.items() if k != "kid"}
    with pytest.raises(ValueError, match="kid and alg"):
        TokenClient(
            kit.http,
            IssuerDiscovery(kit.http, ISSUER_URL),
            ClientCredentials(CLIENT, no_kid, ("s",), AUDIENCE),
        )


async def test_repr_shows_no_token_or_key(kit: Kit) -> None:
    client = kit.client()
    token = await client.token()
    text = repr(client) + repr(ClientCredentials(CLIENT, kit.key, ("s",), AUDIENCE))
    assert token not in text
    assert kit.key["d"] not in text
    assert CLIENT in text


def test_credentials_for_a_connection_default_to_the_base_url(kit: Kit) -> None:
    from core.config.model import Connection, ConnectionAuthorization

    connection = Connection(
        name="notices",
        type="messaging",
        base_url=AUDIENCE,
        profile="applicant-notices",
        authorization=ConnectionAuthorization(
            client_id=CLIENT,
            signing_key_ref=None,  # type: ignore[arg-type]  # not read here
            scopes=("messages:send",),
            audience=None,
        ),
        producer=None,
        completion=None,
        result_check_seconds=None,
    )
    credentials = credentials_for(connection, kit.key)
    assert credentials == ClientCredentials(CLIENT, kit.key, ("messages:send",), AUDIENCE)


async def test_stand_in_accepts_the_clients_token(kit: Kit) -> None:
    stand_in = MessagingStandIn(
        StandInSettings(base_url=AUDIENCE, issuer=ISSUER_URL, allowed_clients=frozenset({CLIENT})),
        http=httpx.AsyncClient(transport=kit.router),
        clock=kit.clock,
    )
    client = kit.client()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=stand_in), base_url="http://messaging.test"
    ) as product:
        answer = await product.post(
            "/v1/profiles/p/messages",
            json={"template": "t", "recipientRef": "r", "parameters": {}},
            headers={"Authorization": f"Bearer {await client.token()}", "Idempotency-Key": "k"},
        )
    assert answer.status_code == 202, answer.text
