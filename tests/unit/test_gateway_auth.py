"""Access token verification: one test (at least) per rule of CONTRACT §8.1."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from core.codes import Code
from core.config.model import Authentication, SigningKeys
from core.errors import CoordinatorError
from core.secrets import SecretRef, SecretResolver
from gateway.auth import (
    MAX_TOKEN_BYTES,
    AuthenticationRefused,
    HttpJwksSource,
    JwksUnavailable,
    StaticJwksSource,
    TokenVerifier,
    bearer_token,
    jwks_source_for,
)

ISS = "https://issuer.example.org"
AUD = "https://coordinator.example.org"
JWKS_URL = "https://issuer.example.org/jwks"
NOW = 1_800_000_000.0
SKEW = 60

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
ATTACKER_KEY = ec.generate_private_key(ec.SECP256R1())
ROTATED_KEY = ec.generate_private_key(ec.SECP256R1())


def public_jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    algorithm = RSAAlgorithm if alg.startswith("RS") else ECAlgorithm
    jwk = algorithm.to_jwk(key.public_key(), as_dict=True)
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


def jwks(*extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "keys": [public_jwk(RSA_KEY, "rsa-1", "RS256"), public_jwk(EC_KEY, "ec-1", "ES256"), *extra]
    }


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISS,
        "aud": AUD,
        "sub": "portal-user-7",
        "client_id": "intake-portal",
        "iat": int(NOW) - 10,
        "exp": int(NOW) + 300,
        "jti": "token-1",
        "scope": "runs:start runs:read",
    }
    for name, value in changes.items():
        if value is _DROP:
            base.pop(name, None)
        else:
            base[name] = value
    return base


_DROP = object()


def mint(
    payload: Mapping[str, Any] | None = None,
    *,
    key: Any = RSA_KEY,
    alg: str = "RS256",
    kid: str | None = "rsa-1",
    typ: str | None = "at+jwt",
    **header: Any,
) -> str:
    headers: dict[str, Any] = {"typ": typ, **header}
    if kid is not None:
        headers["kid"] = kid
    # Sign the JSON ourselves: PyJWT's JWT encoder refuses some of the bad claims we test.
    body = json.dumps(dict(payload or claims())).encode()
    return jwt.api_jws.encode(body, key, algorithm=alg, headers=headers)


def unsigned(header: Mapping[str, Any], payload: Mapping[str, Any], signature: bytes) -> str:
    head = b64(json.dumps(header).encode()) + "." + b64(json.dumps(payload).encode())
    return head + "." + b64(signature)


class FakeSource:
    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.fetches = 0
        self.fail = False

    async def fetch(self) -> Mapping[str, Any]:
        self.fetches += 1
        if self.fail:
            raise JwksUnavailable("issuer unreachable")
        return self.document


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_verifier(
    source: Any,
    monotonic: Monotonic | None = None,
    algorithms: tuple[str, ...] = ("RS256", "ES256"),
) -> TokenVerifier:
    return TokenVerifier(
        issuer=ISS,
        audience=AUD,
        algorithms=algorithms,
        clock_skew_seconds=SKEW,
        source=source,
        clock=lambda: NOW,
        monotonic=monotonic or Monotonic(),
    )


@pytest.fixture
def source() -> FakeSource:
    return FakeSource(jwks())


@pytest.fixture
def verifier(source: FakeSource) -> TokenVerifier:
    return make_verifier(source)


async def refused(verifier: TokenVerifier, token: str) -> AuthenticationRefused:
    with pytest.raises(AuthenticationRefused) as caught:
        await verifier.verify(token)
    error = caught.value
    assert error.code == Code.AUTHENTICATION_REFUSED
    # The caller learns nothing from the detail, and the token never appears in it.
    assert error.detail == "the access token is missing or not acceptable"
    for part in [token, *token.split(".")]:
        if len(part) > 3:
            assert part not in str(error)
            assert part not in error.reason
    return error


# -- accepted tokens ----------------------------------------------------------------------------


async def test_a_valid_rs256_token_is_accepted(verifier: TokenVerifier) -> None:
    token = await verifier.verify(mint())
    assert token.iss == ISS and token.sub == "portal-user-7"
    assert token.client_id == "intake-portal"
    assert token.scopes == ("runs:start", "runs:read")
    assert token.audiences == (AUD,)
    assert token.principal == (ISS, "portal-user-7")
    assert token.jti == "token-1"


async def test_a_valid_es256_token_is_accepted(verifier: TokenVerifier) -> None:
    token = await verifier.verify(mint(key=EC_KEY, alg="ES256", kid="ec-1"))
    assert token.client_id == "intake-portal"


@pytest.mark.parametrize("typ", ["at+jwt", "AT+JWT", "application/at+jwt", "Application/At+JWT"])
async def test_typ_variants_are_accepted(verifier: TokenVerifier, typ: str) -> None:
    assert (await verifier.verify(mint(typ=typ))).sub == "portal-user-7"


async def test_aud_may_be_a_list_containing_the_audience(verifier: TokenVerifier) -> None:
    token = await verifier.verify(mint(claims(aud=["https://other.example", AUD])))
    assert token.audiences == ("https://other.example", AUD)


async def test_times_within_the_skew_are_accepted(verifier: TokenVerifier) -> None:
    inside = claims(exp=NOW - SKEW + 1, iat=NOW + SKEW - 1, nbf=NOW + SKEW - 1)
    assert (await verifier.verify(mint(inside))).expires_at == NOW - SKEW + 1


async def test_authorization_header_parsing(verifier: TokenVerifier) -> None:
    token = mint()
    assert (await verifier.verify_authorization(f"Bearer {token}")).sub == "portal-user-7"
    assert (await verifier.verify_authorization(f"bearer  {token} ")).sub == "portal-user-7"


# -- missing and malformed --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "no bearer token"),
        ("", "no bearer token"),
        ("Basic dXNlcjpwYXNz", "not the bearer scheme"),
        ("Bearer", "malformed bearer credentials"),
        ("Bearer a.b.c d", "malformed bearer credentials"),
    ],
)
def test_missing_or_malformed_authorization(header: str | None, reason: str) -> None:
    with pytest.raises(AuthenticationRefused) as caught:
        bearer_token(header)
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("not-a-jwt", "not a compact JWS"),
        ("a.b", "not a compact JWS"),
        ("a..c", "not a compact JWS"),
        ("a.b.c.d", "not a compact JWS"),
        ("eyJ+.e30.abc", "not a compact JWS"),
        ("e30x.e30.abcd", "header is not readable"),
        (b64(b"[1]") + ".e30.abcd", "header is not readable"),
    ],
)
async def test_malformed_tokens(verifier: TokenVerifier, token: str, reason: str) -> None:
    assert (await refused(verifier, token)).reason == reason


async def test_an_oversized_token_is_refused_before_parsing(
    verifier: TokenVerifier, source: FakeSource
) -> None:
    token = mint(claims(padding="x" * MAX_TOKEN_BYTES))
    assert len(token) > MAX_TOKEN_BYTES
    assert (await refused(verifier, token)).reason == "token too large"
    assert source.fetches == 0


async def test_a_token_just_under_the_bound_is_parsed(verifier: TokenVerifier) -> None:
    # Grow a claim until the token is as large as allowed; it must still verify.
    # base64url turns 3 bytes of claims into 4 characters of token.
    padding = (MAX_TOKEN_BYTES - len(mint(claims(padding="")))) * 3 // 4 - 100
    token = mint(claims(padding="x" * padding))
    assert MAX_TOKEN_BYTES - 300 < len(token) <= MAX_TOKEN_BYTES
    assert (await verifier.verify(token)).sub == "portal-user-7"


# -- header rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "typ", ["JWT", "jwt", None, "at+jwt; charset=x", "application/jwt", "x/at+jwt"]
)
async def test_other_typ_values_are_refused(verifier: TokenVerifier, typ: str | None) -> None:
    assert (await refused(verifier, mint(typ=typ))).reason == "typ is not at+jwt"


async def test_alg_none_is_refused(verifier: TokenVerifier) -> None:
    header = {"alg": "none", "typ": "at+jwt", "kid": "rsa-1"}
    # With an empty signature segment the token is not even a compact JWS here …
    bare = unsigned(header, claims(), b"")
    assert bare.endswith(".")
    assert (await refused(verifier, bare)).reason == "not a compact JWS"
    # … and with some bytes in it the algorithm itself is refused.
    assert (await refused(verifier, unsigned(header, claims(), b"sig"))).reason == (
        "alg is not allowed"
    )


async def test_hs256_signed_with_the_issuers_public_key_is_refused(
    verifier: TokenVerifier,
) -> None:
    public_pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "at+jwt", "kid": "rsa-1"}
    head = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims()).encode())
    signature = hmac.new(public_pem, head.encode(), hashlib.sha256).digest()
    token = head + "." + b64(signature)
    assert (await refused(verifier, token)).reason == "alg is not allowed"
    # Even the JWK form of the public key as an "oct" secret gets nowhere.
    jwk_secret = json.dumps(public_jwk(RSA_KEY, "rsa-1", "RS256")).encode()
    signature = hmac.new(jwk_secret, head.encode(), hashlib.sha256).digest()
    assert (await refused(verifier, head + "." + b64(signature))).reason == "alg is not allowed"


@pytest.mark.parametrize("algorithms", [("none",), ("HS256",), ("RS256", "HS512"), ()])
def test_symmetric_or_none_algorithms_cannot_be_configured(algorithms: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="asymmetric"):
        make_verifier(FakeSource(jwks()), algorithms=algorithms)


async def test_an_algorithm_outside_the_allow_list_is_refused(source: FakeSource) -> None:
    verifier = make_verifier(source, algorithms=("RS256",))
    token = mint(key=EC_KEY, alg="ES256", kid="ec-1")
    assert (await refused(verifier, token)).reason == "alg is not allowed"


async def test_a_kid_of_another_key_type_is_refused(verifier: TokenVerifier) -> None:
    # An ES256 token naming the RSA key's kid: the key says RS256.
    token = mint(key=EC_KEY, alg="ES256", kid="rsa-1")
    assert (await refused(verifier, token)).reason == "key is for another algorithm"


async def test_a_key_without_alg_still_must_fit_the_algorithm(source: FakeSource) -> None:
    loose = public_jwk(RSA_KEY, "loose", "RS256")
    del loose["alg"]
    source.document = jwks(loose)
    verifier = make_verifier(source)
    assert (await verifier.verify(mint(kid="loose"))).sub == "portal-user-7"
    token = mint(key=EC_KEY, alg="ES256", kid="loose")
    assert (await refused(verifier, token)).reason == "key does not fit the algorithm"


async def test_a_missing_kid_is_refused(verifier: TokenVerifier) -> None:
    assert (await refused(verifier, mint(kid=None))).reason == "header names no kid"


async def test_a_crit_header_is_refused(verifier: TokenVerifier) -> None:
    # PyJWT's own header reader already rejects an unknown critical extension; either way
    # the token is refused before any key is looked at.
    token = mint(crit=["exp"])
    assert (await refused(verifier, token)).reason in {
        "header is not readable",
        "header asks for an unsupported extension",
    }


async def test_a_signature_by_another_key_is_refused(verifier: TokenVerifier) -> None:
    token = mint(key=ATTACKER_KEY, alg="ES256", kid="ec-1")
    assert (await refused(verifier, token)).reason == "signature does not verify"


async def test_a_tampered_payload_is_refused(verifier: TokenVerifier) -> None:
    head, _, signature = mint().split(".")
    forged = b64(json.dumps(claims(client_id="case-operators")).encode())
    token = f"{head}.{forged}.{signature}"
    assert (await refused(verifier, token)).reason == "signature does not verify"


def recording_client(document: Mapping[str, Any]) -> tuple[httpx.AsyncClient, list[str]]:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if str(request.url) == JWKS_URL:
            return httpx.Response(200, json=document)
        return httpx.Response(200, json={"keys": [public_jwk(ATTACKER_KEY, "evil", "ES256")]})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle)), seen


async def test_jku_x5u_and_jwk_headers_are_never_followed() -> None:
    client, seen = recording_client(jwks())
    async with client:
        verifier = make_verifier(HttpJwksSource(JWKS_URL, client))
        evil = "https://attacker.example/jwks"
        embedded = public_jwk(ATTACKER_KEY, "evil", "ES256")
        attack = mint(key=ATTACKER_KEY, alg="ES256", kid="evil", jku=evil, x5u=evil, jwk=embedded)
        assert (await refused(verifier, attack)).reason == "kid is not among the issuer's keys"
        # A genuine token that carries a jku is verified with the configured keys only.
        genuine = await verifier.verify(mint(jku=evil))
        assert genuine.sub == "portal-user-7"
    assert seen == [JWKS_URL]


# -- claims -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "issuer",
    [
        "https://issuer.example",  # a prefix of the issuer
        "issuer.example.org",  # a suffix of the issuer
        "https://issuer.example.org/",
        "https://issuer.example.org.attacker.example",
        "HTTPS://ISSUER.EXAMPLE.ORG",
        [ISS],
        None,
    ],
)
async def test_any_other_issuer_is_refused(verifier: TokenVerifier, issuer: Any) -> None:
    payload = claims(iss=issuer) if issuer is not None else claims(iss=_DROP)
    assert (await refused(verifier, mint(payload))).reason == "iss is not the issuer"


@pytest.mark.parametrize(
    ("audience", "reason"),
    [
        ("https://other.example", "aud does not contain the audience"),
        (["https://other.example"], "aud does not contain the audience"),
        ("https://coordinator.example", "aud does not contain the audience"),
        ([], "aud does not contain the audience"),
        ([AUD, 7], "aud is missing or malformed"),
        (_DROP, "aud is missing or malformed"),
    ],
)
async def test_wrong_audience_is_refused(
    verifier: TokenVerifier, audience: Any, reason: str
) -> None:
    assert (await refused(verifier, mint(claims(aud=audience)))).reason == reason


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"exp": NOW - SKEW}, "token expired"),
        ({"exp": NOW - 3600}, "token expired"),
        ({"exp": _DROP}, "exp is missing or malformed"),
        ({"exp": "tomorrow"}, "exp is missing or malformed"),
        ({"exp": True}, "exp is missing or malformed"),
        ({"nbf": NOW + SKEW + 1}, "token not yet valid"),
        ({"nbf": "soon"}, "nbf is malformed"),
        ({"iat": NOW + SKEW + 1}, "iat is in the future"),
        ({"iat": _DROP}, "iat is missing or malformed"),
    ],
)
async def test_time_claims_outside_the_skew_are_refused(
    verifier: TokenVerifier, changes: dict[str, Any], reason: str
) -> None:
    assert (await refused(verifier, mint(claims(**changes)))).reason == reason


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"sub": _DROP}, "sub is missing"),
        ({"sub": ""}, "sub is missing"),
        ({"sub": 42}, "sub is missing"),
        ({"client_id": _DROP}, "client_id is missing"),
        ({"client_id": ""}, "client_id is missing"),
        ({"scope": ["runs:start"]}, "scope is malformed"),
    ],
)
async def test_required_identity_claims(
    verifier: TokenVerifier, changes: dict[str, Any], reason: str
) -> None:
    assert (await refused(verifier, mint(claims(**changes)))).reason == reason


async def test_a_payload_that_is_not_an_object_is_refused(verifier: TokenVerifier) -> None:
    token = jwt.api_jws.encode(
        b"[1,2]", RSA_KEY, algorithm="RS256", headers={"typ": "at+jwt", "kid": "rsa-1"}
    )
    assert (await refused(verifier, token)).reason == "payload is not a JSON object"


# -- key set: refresh, pacing, availability ---------------------------------------------------


async def test_unknown_kid_refreshes_at_most_once_per_minute() -> None:
    source = FakeSource(jwks())
    clock = Monotonic()
    verifier = make_verifier(source, clock)
    await verifier.verify(mint())
    assert source.fetches == 1

    clock.now += 61
    stranger = mint(key=ROTATED_KEY, alg="ES256", kid="ec-2")
    assert (await refused(verifier, stranger)).reason == "kid is not among the issuer's keys"
    assert source.fetches == 2  # the unknown kid triggered one refresh

    clock.now += 1
    other = mint(key=ROTATED_KEY, alg="ES256", kid="ec-3")
    await refused(verifier, other)
    assert source.fetches == 2  # a second unknown kid within 60 s does not refetch

    # The issuer publishes the rotated key; it is picked up once the minute has passed.
    source.document = jwks(public_jwk(ROTATED_KEY, "ec-2", "ES256"))
    clock.now += 30
    await refused(verifier, stranger)
    assert source.fetches == 2
    clock.now += 30
    assert (await verifier.verify(stranger)).sub == "portal-user-7"
    assert source.fetches == 3
    # Known kids never cause a fetch.
    await verifier.verify(mint())
    assert source.fetches == 3


async def test_concurrent_unknown_kids_share_one_refresh() -> None:
    source = FakeSource(jwks())
    clock = Monotonic()
    verifier = make_verifier(source, clock)
    assert await verifier.refresh()
    clock.now += 120
    tokens = [mint(key=ROTATED_KEY, alg="ES256", kid=f"new-{n}") for n in range(10)]
    results = await asyncio.gather(*(verifier.verify(t) for t in tokens), return_exceptions=True)
    assert all(isinstance(r, AuthenticationRefused) for r in results)
    assert source.fetches == 2


async def test_unreachable_jwks_without_keys_is_service_unavailable() -> None:
    source = FakeSource(jwks())
    source.fail = True
    clock = Monotonic()
    verifier = make_verifier(source, clock)
    assert not await verifier.refresh()
    assert not verifier.ready
    token = mint()
    with pytest.raises(CoordinatorError) as caught:
        await verifier.verify(token)
    assert caught.value.code == Code.SERVICE_UNAVAILABLE
    assert token not in str(caught.value)
    # The issuer returns; after the short retry pause the verifier recovers by itself.
    source.fail = False
    clock.now += 6
    assert (await verifier.verify(token)).sub == "portal-user-7"
    assert verifier.ready


async def test_unreachable_jwks_with_cached_keys_keeps_verifying() -> None:
    source = FakeSource(jwks())
    clock = Monotonic()
    verifier = make_verifier(source, clock)
    await verifier.verify(mint())
    source.fail = True
    clock.now += 7200  # the cache is stale: the old keys serve while it is refetched
    assert (await verifier.verify(mint())).sub == "portal-user-7"
    assert await verifier.refresh()  # joins that refetch, which fails: the old keys stay
    assert source.fetches == 2
    assert (await verifier.verify(mint())).sub == "portal-user-7"
    # An unknown kid cannot be judged while the issuer cannot be asked (it may have just
    # published that key): an outage, not a refusal.
    clock.now += 61
    stranger = mint(key=ROTATED_KEY, alg="ES256", kid="ec-9")
    with pytest.raises(CoordinatorError) as caught:
        await verifier.verify(stranger)
    assert caught.value.code == Code.SERVICE_UNAVAILABLE
    assert source.fetches == 3
    # Once the issuer answers again, the unknown kid is a refusal.
    source.fail = False
    clock.now += 61
    assert (await refused(verifier, stranger)).reason == "kid is not among the issuer's keys"
    assert source.fetches == 4


async def test_a_stale_key_set_is_refetched(source: FakeSource) -> None:
    clock = Monotonic()
    verifier = make_verifier(source, clock)
    await verifier.verify(mint())
    source.document = {"keys": [public_jwk(EC_KEY, "ec-1", "ES256")]}  # rsa-1 withdrawn
    clock.now += 3601
    # The held keys serve the request that finds the set stale; the refetch runs behind it.
    assert (await verifier.verify(mint())).sub == "portal-user-7"
    assert await verifier.refresh()  # joins that refetch
    assert source.fetches == 2
    assert (await refused(verifier, mint())).reason == "kid is not among the issuer's keys"


async def test_unusable_jwks_entries_are_ignored(source: FakeSource) -> None:
    private = {**public_jwk(RSA_KEY, "private", "RS256"), "d": "AAAA"}
    symmetric = {"kty": "oct", "k": b64(b"secret-secret-secret-secret-32by"), "kid": "sym"}
    encryption = {**public_jwk(EC_KEY, "enc", "ES256"), "use": "enc"}
    duplicate = public_jwk(ATTACKER_KEY, "ec-1", "ES256")  # a second key under a known kid
    source.document = {"keys": [*jwks()["keys"], private, symmetric, encryption, duplicate, 7]}
    verifier = make_verifier(source)
    for kid in ("private", "sym", "enc"):
        error = await refused(verifier, mint(kid=kid))
        assert error.reason == "kid is not among the issuer's keys"
    forged = mint(key=ATTACKER_KEY, alg="ES256", kid="ec-1")
    assert (await refused(verifier, forged)).reason == "signature does not verify"


# -- key sources --------------------------------------------------------------------------------


async def test_http_source_fetches_the_configured_url() -> None:
    client, seen = recording_client(jwks())
    async with client:
        document = await HttpJwksSource(JWKS_URL, client).fetch()
    assert [key["kid"] for key in document["keys"]] == ["rsa-1", "ec-1"]
    assert seen == [JWKS_URL]


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(500, json={"keys": []}),
        httpx.Response(302, headers={"Location": "https://attacker.example/jwks"}),
        httpx.Response(200, content=b"not json"),
        httpx.Response(200, json=["keys"]),
        httpx.Response(200, content=b'{"keys":[' + b'{"k":"' + b"a" * 300_000 + b'"}]}'),
    ],
    ids=["500", "redirect", "not-json", "not-object", "too-large"],
)
async def test_http_source_failures(response: httpx.Response) -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return response

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        with pytest.raises(JwksUnavailable):
            await HttpJwksSource(JWKS_URL, client).fetch()
    assert seen == [JWKS_URL]


async def test_http_source_asks_for_the_key_set_uncompressed_and_refuses_it_compressed() -> None:
    # A compressed answer would be inflated by the client before the cap could count it.
    asked: list[str | None] = []
    packed = gzip.compress(json.dumps(jwks()).encode())

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("Accept-Encoding"))
        return httpx.Response(200, content=packed, headers={"Content-Encoding": "gzip"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        with pytest.raises(JwksUnavailable) as caught:
            await HttpJwksSource(JWKS_URL, client).fetch()
    assert asked == ["identity"]
    assert "compressed" in str(caught.value)


async def test_http_source_connection_failure_is_unavailable() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        verifier = make_verifier(HttpJwksSource(JWKS_URL, client))
        with pytest.raises(CoordinatorError) as caught:
            await verifier.verify(mint())
    assert caught.value.code == Code.SERVICE_UNAVAILABLE


def authentication(jwks_url: str | None, jwks_ref: SecretRef | None) -> Authentication:
    return Authentication(
        issuer=ISS,
        audience=AUD,
        signing_keys=SigningKeys(jwks_url=jwks_url, jwks_ref=jwks_ref),
        algorithms=("ES256",),
        clock_skew_seconds=SKEW,
        policies={},
    )


async def test_jwks_ref_content_is_used_without_any_fetch(tmp_path: Path) -> None:
    root = tmp_path / "secrets"
    root.mkdir(mode=0o700)
    path = root / "issuer-jwks.json"
    path.write_text(json.dumps(jwks()) + "\n")
    path.chmod(0o600)
    settings = authentication(None, SecretRef("file", "issuer-jwks.json"))
    client, seen = recording_client(jwks())
    async with client:
        source = jwks_source_for(
            settings, SecretResolver(file_root=root, environment=False), client
        )
        verifier = TokenVerifier.from_settings(settings, source, clock=lambda: NOW)
        assert verifier.algorithms == ("ES256",)
        token = await verifier.verify(mint(key=EC_KEY, alg="ES256", kid="ec-1"))
    assert token.sub == "portal-user-7"
    assert seen == []


async def test_jwks_url_setting_builds_an_http_source() -> None:
    client, seen = recording_client(jwks())
    async with client:
        source = jwks_source_for(
            authentication(JWKS_URL, None),
            SecretResolver(file_root=None, environment=False),
            client,
        )
        assert isinstance(source, HttpJwksSource)
        await source.fetch()
    assert seen == [JWKS_URL]


async def test_a_broken_jwks_ref_is_refused_at_startup(tmp_path: Path) -> None:
    root = tmp_path / "secrets"
    root.mkdir(mode=0o700)
    path = root / "issuer-jwks.json"
    path.write_text('{"no": "keys"}')
    path.chmod(0o600)
    settings = authentication(None, SecretRef("file", "issuer-jwks.json"))
    resolver = SecretResolver(file_root=root, environment=False)
    async with httpx.AsyncClient() as client:
        with pytest.raises(CoordinatorError) as caught:
            jwks_source_for(settings, resolver, client)
    assert caught.value.code == "secret.malformed"
    assert "secret:file/issuer-jwks.json" in caught.value.detail


async def test_static_source_accepts_text_and_mappings() -> None:
    for document in (json.dumps(jwks()), json.dumps(jwks()).encode(), jwks()):
        fetched = await StaticJwksSource(document).fetch()
        assert [key["kid"] for key in fetched["keys"]] == ["rsa-1", "ec-1"]
    with pytest.raises(JwksUnavailable):
        StaticJwksSource("[]")


# -- remembered verifications ---------------------------------------------------------------


class CountingJws(jwt.api_jws.PyJWS):
    """Counts signature checks, to see which verifications were remembered."""

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0

    def decode_complete(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.checks += 1
        return super().decode_complete(*args, **kwargs)


def counting(verifier: TokenVerifier) -> CountingJws:
    jws = CountingJws()
    verifier._jws = jws  # the verifier's one signature checker
    return jws


async def test_the_same_token_again_skips_the_signature_but_not_the_claims() -> None:
    wall = [NOW]
    verifier = TokenVerifier(
        issuer=ISS,
        audience=AUD,
        algorithms=("RS256", "ES256"),
        clock_skew_seconds=SKEW,
        source=FakeSource(jwks()),
        clock=lambda: wall[0],
        monotonic=Monotonic(),
    )
    jws = counting(verifier)
    token = mint(claims(exp=int(NOW) + 300, nbf=int(NOW) + 30))
    wall[0] = NOW + 30  # valid from within the skew
    assert (await verifier.verify(token)).sub == "portal-user-7"
    assert (await verifier.verify(token)).client_id == "intake-portal"
    assert jws.checks == 1
    # Expiry is checked at every use, remembered or not.
    wall[0] = NOW + 300 + SKEW
    assert (await refused(verifier, token)).reason == "token expired"
    # Another token (a different signature over the same claims) is checked on its own.
    wall[0] = NOW + 60
    other = mint(claims(exp=int(NOW) + 300, nbf=int(NOW) + 30), key=EC_KEY, alg="ES256", kid="ec-1")
    await verifier.verify(other)
    assert jws.checks == 2


async def test_a_remembered_token_is_verified_again_after_the_key_set_changes(
    source: FakeSource,
) -> None:
    clock = Monotonic()
    verifier = make_verifier(source, clock)
    jws = counting(verifier)
    token = mint()
    await verifier.verify(token)
    clock.now += 3601  # the key set is reloaded (same keys): its key objects are new
    await verifier.verify(token)  # with the keys held, while the reload runs
    assert await verifier.refresh()  # joins the reload
    await verifier.verify(token)
    assert (jws.checks, source.fetches) == (2, 2)
    await verifier.verify(token)
    assert jws.checks == 2


async def test_a_forged_token_is_never_remembered(verifier: TokenVerifier) -> None:
    jws = counting(verifier)
    forged = mint(key=ATTACKER_KEY, alg="ES256", kid="ec-1")
    for _ in range(2):
        assert (await refused(verifier, forged)).reason == "signature does not verify"
    assert jws.checks == 2
