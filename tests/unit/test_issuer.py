"""The development OpenID issuer: discovery, JWKS, the token endpoint, and minted tokens."""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from devstack import mint
from devstack.issuer import (
    ASSERTION_TYPE,
    DevIssuer,
    IssuerState,
    RegisteredClient,
    clients_document,
    generate_private_jwk,
    load_clients,
    public_jwk,
)
from tests.helpers.devstack_kit import ISSUER_URL, FakeClock, client_for, make_issuer

TOKEN_URL = ISSUER_URL + "/token"
RESOURCE = "https://messaging.internal.example.org"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def es_key() -> dict[str, Any]:
    return generate_private_jwk("ES256", kid="notices-1")


@pytest.fixture
def rs_key() -> dict[str, Any]:
    return generate_private_jwk("RS256", kid="review-1")


@pytest.fixture
def issuer(
    tmp_path: Path, clock: FakeClock, es_key: dict[str, Any], rs_key: dict[str, Any]
) -> DevIssuer:
    clients = [
        client_for("coordinator-notices", es_key, {"messages:send", "receipts:read"}),
        client_for("coordinator-review", rs_key, {"review-requests:write"}),
    ]
    return make_issuer(tmp_path / "issuer", clients, clock)


@pytest.fixture
async def http(issuer: DevIssuer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=issuer.app), base_url=ISSUER_URL
    ) as client:
        yield client


def assertion(
    key: dict[str, Any],
    clock: FakeClock,
    client_id: str = "coordinator-notices",
    **overrides: Any,
) -> str:
    now = int(clock())
    claims: dict[str, Any] = {
        "iss": client_id,
        "sub": client_id,
        "aud": TOKEN_URL,
        "iat": now,
        "exp": now + 60,
        "jti": uuid.uuid4().hex,
    }
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, jwt.PyJWK(key).key, algorithm=key["alg"], headers={"kid": key["kid"]})


def form(signed: str, **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "grant_type": "client_credentials",
        "client_assertion_type": ASSERTION_TYPE,
        "client_assertion": signed,
        "scope": "messages:send receipts:read",
        "resource": RESOURCE,
    }
    fields.update(overrides)
    return {k: v for k, v in fields.items() if v is not None}


def verify_access_token(token: str, issuer: DevIssuer, audience: str) -> dict[str, Any]:
    header = jwt.get_unverified_header(token)
    assert header["typ"] == "at+jwt"
    jwks = issuer.state.jwks()
    key = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    return jwt.decode(
        token,
        jwt.PyJWK(key).key,
        algorithms=[header["alg"]],
        audience=audience,
        issuer=ISSUER_URL,
        options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
    )


async def test_discovery_names_the_endpoints(http: httpx.AsyncClient) -> None:
    answer = await http.get("/.well-known/openid-configuration")
    assert answer.status_code == 200
    metadata = answer.json()
    assert metadata["issuer"] == ISSUER_URL
    assert metadata["token_endpoint"] == TOKEN_URL
    assert metadata["jwks_uri"] == ISSUER_URL + "/jwks"
    assert metadata["token_endpoint_auth_methods_supported"] == ["private_key_jwt"]
    assert set(metadata["token_endpoint_auth_signing_alg_values_supported"]) == {"ES256", "RS256"}
    assert "client_credentials" in metadata["grant_types_supported"]


async def test_jwks_publishes_only_the_public_key(
    http: httpx.AsyncClient, issuer: DevIssuer
) -> None:
    answer = await http.get("/jwks")
    keys = answer.json()["keys"]
    assert [k["kid"] for k in keys] == [issuer.state.kid]
    assert all("d" not in k for k in keys)
    assert keys[0]["alg"] == "ES256"


@pytest.mark.parametrize("key_name", ["es_key", "rs_key"])
async def test_token_for_a_valid_assertion(
    http: httpx.AsyncClient,
    issuer: DevIssuer,
    clock: FakeClock,
    key_name: str,
    request: pytest.FixtureRequest,
) -> None:
    key = request.getfixturevalue(key_name)
    client_id = "coordinator-notices" if key_name == "es_key" else "coordinator-review"
    scope = "messages:send" if key_name == "es_key" else "review-requests:write"
    answer = await http.post("/token", data=form(assertion(key, clock, client_id), scope=scope))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 300
    assert answer.headers["cache-control"] == "no-store"
    claims = verify_access_token(body["access_token"], issuer, RESOURCE)
    assert claims["sub"] == claims["client_id"] == client_id
    assert claims["aud"] == RESOURCE
    assert claims["scope"] == scope
    assert claims["iat"] == claims["nbf"] == int(clock())
    assert claims["exp"] == int(clock()) + 300
    assert isinstance(claims["jti"], str) and claims["jti"]


async def test_scope_defaults_to_everything_the_client_may_have(
    http: httpx.AsyncClient, issuer: DevIssuer, clock: FakeClock, es_key: dict[str, Any]
) -> None:
    answer = await http.post("/token", data=form(assertion(es_key, clock), scope=None))
    claims = verify_access_token(answer.json()["access_token"], issuer, RESOURCE)
    assert claims["scope"] == "messages:send receipts:read"


def _other_key_same_kid() -> dict[str, Any]:
    return generate_private_jwk("ES256", kid="notices-1")


@pytest.mark.parametrize(
    ("make_form", "status", "error"),
    [
        pytest.param(
            lambda k, c: form(assertion(k, c, aud="http://elsewhere.test/token")),
            401,
            "invalid_client",
            id="aud-other-token-endpoint",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, aud=ISSUER_URL + "/")),
            401,
            "invalid_client",
            id="aud-issuer-not-exact",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, aud=RESOURCE)),
            401,
            "invalid_client",
            id="aud-resource",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, aud=["http://elsewhere.test", RESOURCE])),
            401,
            "invalid_client",
            id="aud-list-without-us",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, aud=[])), 401, "invalid_client", id="aud-empty-list"
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, aud=None)), 401, "invalid_client", id="no-aud"
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, exp=int(c()) - 30)),
            401,
            "invalid_client",
            id="expired",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, exp=int(c()) + 600)),
            401,
            "invalid_client",
            id="exp-too-far",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, exp=None)), 401, "invalid_client", id="no-exp"
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, jti=None)), 401, "invalid_client", id="no-jti"
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, sub="someone-else")),
            401,
            "invalid_client",
            id="sub-differs",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c, client_id="stranger")),
            401,
            "invalid_client",
            id="unknown-client",
        ),
        pytest.param(
            lambda k, c: form(assertion(_other_key_same_kid(), c)),
            401,
            "invalid_client",
            id="wrong-key",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c), client_id="coordinator-review"),
            401,
            "invalid_client",
            id="client-id-mismatch",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c), scope="messages:send review-requests:write"),
            400,
            "invalid_scope",
            id="scope-not-allowed",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c), resource=None),
            400,
            "invalid_target",
            id="no-resource",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c), resource=[RESOURCE, RESOURCE + "/2"]),
            400,
            "invalid_target",
            id="two-resources",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c), resource="messaging"),
            400,
            "invalid_target",
            id="relative-resource",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c), grant_type="password"),
            400,
            "unsupported_grant_type",
            id="grant-type",
        ),
        pytest.param(
            lambda k, c: form(assertion(k, c), client_assertion_type="urn:other"),
            401,
            "invalid_client",
            id="assertion-type",
        ),
        pytest.param(lambda k, c: form("not-a-jwt"), 401, "invalid_client", id="garbage-assertion"),
    ],
)
async def test_token_endpoint_refuses(
    http: httpx.AsyncClient,
    clock: FakeClock,
    es_key: dict[str, Any],
    make_form: Any,
    status: int,
    error: str,
) -> None:
    fields = make_form(es_key, clock)
    answer = await http.post("/token", data=fields)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"] == error
    # The description names the failed check and never repeats the assertion.
    assert fields["client_assertion"] not in answer.text


@pytest.mark.parametrize(
    "aud",
    [
        pytest.param(TOKEN_URL, id="token-endpoint"),
        pytest.param(ISSUER_URL, id="issuer"),
        pytest.param([TOKEN_URL], id="list-token-endpoint"),
        pytest.param([ISSUER_URL], id="list-issuer"),
        pytest.param([RESOURCE, ISSUER_URL], id="list-with-issuer"),
    ],
)
async def test_assertion_audience_may_be_token_endpoint_or_issuer(
    http: httpx.AsyncClient,
    issuer: DevIssuer,
    clock: FakeClock,
    es_key: dict[str, Any],
    aud: str | list[str],
) -> None:
    # RFC 7523 names the token endpoint; FAPI 2.0 issuers want their issuer identifier
    # (deployment.authentication.clientAssertionAudience: issuer).
    answer = await http.post("/token", data=form(assertion(es_key, clock, aud=aud)))
    assert answer.status_code == 200, answer.text
    claims = verify_access_token(answer.json()["access_token"], issuer, RESOURCE)
    assert claims["client_id"] == "coordinator-notices"


async def test_wrong_assertion_audience_names_both_accepted_ones(
    http: httpx.AsyncClient, clock: FakeClock, es_key: dict[str, Any]
) -> None:
    answer = await http.post(
        "/token", data=form(assertion(es_key, clock, aud="http://elsewhere.test"))
    )
    assert answer.status_code == 401
    assert answer.json() == {
        "error": "invalid_client",
        "error_description": "the assertion aud must be the token endpoint or the issuer "
        "identifier",
    }
    assert answer.headers["www-authenticate"] == 'Bearer error="invalid_client"'


async def test_replayed_assertion_is_refused(
    http: httpx.AsyncClient, clock: FakeClock, es_key: dict[str, Any]
) -> None:
    signed = assertion(es_key, clock)
    first = await http.post("/token", data=form(signed))
    assert first.status_code == 200
    second = await http.post("/token", data=form(signed))
    assert second.status_code == 401
    assert second.json()["error"] == "invalid_client"
    assert "already used" in second.json()["error_description"]


async def test_assertion_expiring_later_is_refused_once_time_passes(
    http: httpx.AsyncClient, clock: FakeClock, es_key: dict[str, Any]
) -> None:
    signed = assertion(es_key, clock)
    clock.advance(120)
    answer = await http.post("/token", data=form(signed))
    assert answer.status_code == 401
    assert "expired" in answer.json()["error_description"]


async def test_form_body_is_required(http: httpx.AsyncClient) -> None:
    answer = await http.post("/token", json={"grant_type": "client_credentials"})
    assert answer.status_code == 400
    assert answer.json()["error"] == "invalid_request"


def test_client_registrations_round_trip(tmp_path: Path, es_key: dict[str, Any]) -> None:
    client = RegisteredClient(
        "coordinator-notices",
        (public_jwk(es_key),),
        frozenset({"messages:send"}),
        frozenset({RESOURCE}),
    )
    path = tmp_path / "clients.json"
    path.write_text(json.dumps(clients_document([client])))
    assert load_clients(path) == (client,)
    assert '"d"' not in path.read_text()


def test_client_registration_keeps_only_public_members(
    tmp_path: Path, es_key: dict[str, Any]
) -> None:
    # A careless registration file holding a private key must not make the issuer keep it.
    path = tmp_path / "clients.json"
    path.write_text(json.dumps({"clients": {"c": {"jwks": {"keys": [es_key]}, "scopes": []}}}))
    (client,) = load_clients(path)
    assert "d" not in client.keys[0]
    assert client.keys[0]["kid"] == es_key["kid"]


def test_client_registration_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    path.write_text(json.dumps({"clients": {"x": {"jwks": {"keys": [{"kty": "EC"}]}}}}))
    with pytest.raises(ValueError, match=r"clients\.json"):
        load_clients(path)


async def test_registered_resources_limit_the_audience(
    tmp_path: Path, clock: FakeClock, es_key: dict[str, Any]
) -> None:
    client = RegisteredClient(
        "coordinator-notices",
        (public_jwk(es_key),),
        frozenset({"messages:send"}),
        frozenset({RESOURCE}),
    )
    issuer = make_issuer(tmp_path / "issuer", [client], clock)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=issuer.app), base_url=ISSUER_URL
    ) as http:
        elsewhere = await http.post(
            "/token",
            data=form(assertion(es_key, clock), scope="messages:send", resource="https://x.test"),
        )
        allowed = await http.post(
            "/token", data=form(assertion(es_key, clock), scope="messages:send")
        )
    assert elsewhere.json()["error"] == "invalid_target"
    assert allowed.status_code == 200


def test_state_folder_is_reused_and_owner_only(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    first = IssuerState.create(folder, ISSUER_URL)
    again = IssuerState.create(folder, ISSUER_URL)
    assert again.signing_jwk == first.signing_jwk
    assert IssuerState.open(folder).kid == first.kid
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="another issuer URL"):
        IssuerState.create(folder, "http://elsewhere.test")


def test_minted_token_file_is_owner_only_and_verifies(tmp_path: Path, issuer: DevIssuer) -> None:
    out = tmp_path / "operator-token"
    out.write_text("old")
    out.chmod(0o644)
    code = mint.main(
        [
            "--issuer-state",
            str(issuer.state.folder),
            "--client-id",
            "platform-operators",
            "--sub",
            "alice",
            "--audience",
            "http://127.0.0.1:8108",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    text = out.read_text()
    assert text.endswith("\n") and text.count("\n") == 1
    claims = verify_access_token(text.strip(), issuer, "http://127.0.0.1:8108")
    assert claims["client_id"] == "platform-operators"
    assert claims["sub"] == "alice"
    assert claims["exp"] - claims["iat"] == mint.DEFAULT_LIFETIME_SECONDS


def test_mint_without_state_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = mint.main(
        [
            "--issuer-state",
            str(tmp_path / "missing"),
            "--client-id",
            "c",
            "--sub",
            "s",
            "--audience",
            "http://127.0.0.1:8108",
            "--out",
            str(tmp_path / "token"),
        ]
    )
    assert code == 1
    assert "missing" in capsys.readouterr().err
    assert not (tmp_path / "token").exists()


async def test_keys_only_registration_file_grants_requested_scopes(
    tmp_path: Path, clock: FakeClock, es_key: dict[str, Any]
) -> None:
    # The shape devstack.runtime_file writes: client id → JWKS of public keys, no scopes.
    path = tmp_path / "clients.json"
    path.write_text(json.dumps({"coordinator-notices": {"keys": [public_jwk(es_key)]}}))
    (client,) = load_clients(path)
    assert client.scopes is None
    issuer = make_issuer(tmp_path / "issuer", [client], clock)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=issuer.app), base_url=ISSUER_URL
    ) as http:
        answer = await http.post("/token", data=form(assertion(es_key, clock), scope="anything:x"))
    assert answer.status_code == 200
    claims = verify_access_token(answer.json()["access_token"], issuer, RESOURCE)
    assert claims["scope"] == "anything:x"


def test_issuer_command_refuses_a_missing_state_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devstack.issuer import main

    clients = tmp_path / "clients.json"
    clients.write_text(json.dumps({"clients": {}}))
    code = main(["--state", str(tmp_path / "none"), "--clients", str(clients)])
    assert code == 1
    assert "not a readable issuer state folder" in capsys.readouterr().err
