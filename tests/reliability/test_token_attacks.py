"""Token attacks against the running gateway, made with the real provider's keys (issue 27,
item 2).

The target is a deployed coordinator whose issuer is panva's ``oidc-provider`` (the stack of
``test_oidc_provider``, without the stand-ins: nothing here dispatches): the gateway fetches
the provider's JWKS over HTTP like in production, and every attack is a request a client
sends to its main listener, ``GET /v1/runs`` with ``Authorization: Bearer <token>``. The
tokens are the provider's own (taken apart, re-signed, cut, swapped) or forged with the
provider's private signing key, so that an attack which gets past the signature check reaches
the one claim or header it is about.

Every attack must be answered as :func:`assert_refused` says (CONTRACT §8.1 and §8): 401, an
RFC 9457 problem with code ``authentication.refused``, ``WWW-Authenticate: Bearer
error="invalid_token"``, and nothing of the token in the body or the headers. Every attack
also checks that no URL a token names was fetched: ``jku`` and ``x5u`` point at a listening
socket (which must see no connection) and at a marked path of the provider (which must see no
request). The coordinator runs at log level info, where the gateway logs which rule refused
a token (never the token): each attack must be refused by the rule it is about, not by an
earlier accident of its making. Controls show the same requests succeed with an untouched
token, with a token the forge signed unchanged, and with times inside the skew and a size
inside the limit.

A flood of tokens naming random ``kid``s must leave the JWKS fetches, counted at the
provider, within CONTRACT §8.1's "at most once per 60 s". Broken variants: a verifier with
its ``iss`` check removed accepts the ``iss`` attacks and :func:`assert_refused` fails on each;
a verifier with no refresh pacing fetches the JWKS for every random ``kid`` and
:func:`check_jwks_fetches` fails on it.

Figures (attacks tried / refused, the flood and its fetches) go to
``.cache/reliability/token-attacks.json`` and the test output. ``COORDINATOR_RELIABILITY_LONG``
(any value but ``0``) makes the flood last over two refresh periods (125 s), when the gateway
must refresh once per period and not more.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import hmac
import json
import math
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from core.codes import Code
from core.config.check import check_runtime_file
from core.config.load import load_runtime_file
from core.config.model import Policy
from core.deploy import apply
from core.workflow.package import build_package
from devstack.oidc_provider import OidcProvider, OidcProviders, ProviderStack, Resource
from devstack.postgres import PostgresCluster
from gateway.app import create_app
from gateway.auth import (
    MAX_TOKEN_BYTES,
    WWW_AUTHENTICATE,
    AuthenticationRefused,
    HttpJwksSource,
    TokenVerifier,
    VerifiedToken,
)
from gateway.routes import GatewayContext
from tests.helpers.gateway_kit import FakeBackend, client_for
from tests.reliability.exposure import EXPOSURE

pytestmark = pytest.mark.slow

ROOT: Final = Path(__file__).resolve().parents[2]
FAMILY: Final = "token-attacks"
FIGURES: Final = ROOT / ".cache" / "reliability" / f"{FAMILY}.json"
LONG: Final = os.environ.get("COORDINATOR_RELIABILITY_LONG", "") not in ("", "0")
FLOOD_SIZE: Final = 200
LONG_FLOOD_SECONDS: Final = 125.0 if LONG else 0.0
"""How long the flood goes on (batches of :data:`FLOOD_SIZE`) in the long run."""
FLOOD_CONCURRENCY: Final = 16
CONTRACT_REFRESH_SECONDS: Final = 60.0
"""CONTRACT §8.1: the JWKS is "refreshed on unknown ``kid`` at most once per 60 s"."""
TARGET_PATH: Final = "/v1/runs"
"""What every attack asks for: the operator's run list (200 with a valid token)."""
ANOTHER_RESOURCE: Final = "http://127.0.0.1:9/another-resource-server"
"""A second resource the provider issues tokens for: its tokens name it in ``aud``."""
MARGIN_SECONDS: Final = 120
"""How far past the skew a time claim is put: no clock drift between here and the gateway
comes near it."""

DROP: Final = object()
"""A header or claim value meaning "leave this member out"."""


# ------------------------------------------------------------------------------ the target


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def segment(document: Mapping[str, Any]) -> str:
    return b64(json.dumps(document, separators=(",", ":")).encode("utf-8"))


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


Signer = Callable[[bytes], bytes]


def rsa_signer(key: rsa.RSAPrivateKey) -> Signer:
    algorithm = RSAAlgorithm(RSAAlgorithm.SHA256)
    return lambda data: algorithm.sign(data, key)


def hmac_signer(secret: bytes) -> Signer:
    return lambda data: hmac.new(secret, data, hashlib.sha256).digest()


def compact(header: Mapping[str, Any], claims: Mapping[str, Any], sign: Signer | None) -> str:
    """A compact JWS of exactly ``header`` and ``claims``; no signature when ``sign`` is None."""
    signing_input = segment(header) + "." + segment(claims)
    signature = b"" if sign is None else sign(signing_input.encode("ascii"))
    return signing_input + "." + b64(signature)


def _changed(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    document = dict(base)
    for name, value in changes.items():
        if value is DROP:
            document.pop(name, None)
        else:
            document[name] = value
    return document


def self_signed_chain(key: rsa.RSAPrivateKey) -> list[str]:
    """An ``x5c`` value: one self-signed certificate of ``key`` (base64 DER)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "attacker.example")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return [base64.b64encode(certificate.public_bytes(serialization.Encoding.DER)).decode()]


@dataclass
class Target:
    """The running stack, its provider, and what an attacker can learn from the outside."""

    stack: ProviderStack
    provider: OidcProvider
    skew: int
    policies: Mapping[str, Policy]
    algorithms: tuple[str, ...]
    trap: socket.socket
    """A listening socket ``jku``/``x5u`` point at; any connection to it is a fetch."""
    marker: str
    """A path part that only the ``jku``/``x5u`` URLs pointing at the provider carry."""
    served_jwks: dict[str, Any]
    """The JWKS document as the provider serves it to anyone."""
    operator_token: str
    producer_token: str
    other_resource_token: str
    """The provider's token for the operator client and :data:`ANOTHER_RESOURCE`."""
    attacker_key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    @property
    def issuer(self) -> str:
        return self.provider.issuer

    @property
    def audience(self) -> str:
        return self.stack.url

    @property
    def kid(self) -> str:
        return str(self.provider.signing_jwk["kid"])

    @property
    def trap_url(self) -> str:
        return f"http://127.0.0.1:{self.trap.getsockname()[1]}/keys.json"

    def send(self, token: str) -> httpx.Response:
        return httpx.get(
            self.audience + TARGET_PATH, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )

    def log_mark(self) -> int:
        """Where the coordinator's log ends now."""
        return len(self.stack.log_text("coordinator"))

    def refusals_since(self, mark: int) -> list[str]:
        """The reasons the gateway logged for the tokens it refused after ``mark``."""
        text = self.stack.log_text("coordinator")[mark:]
        return re.findall(r"access token refused: (.*)$", text, re.MULTILINE)

    def assert_nothing_fetched(self) -> None:
        """No connection reached the trap and no request the provider's marked path."""
        with contextlib.suppress(BlockingIOError):
            connection, _ = self.trap.accept()
            connection.close()
            raise AssertionError("a URL named in a token header was fetched (the trap socket)")
        marked = [path for path in self.provider.requests() if self.marker in path]
        assert not marked, f"a URL named in a token header was fetched: {marked}"


class Forge:
    """Tokens shaped like the provider's operator token, signed as an attack wants."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.real_claims: dict[str, Any] = jwt.decode(
            target.operator_token, options={"verify_signature": False}
        )
        key = jwt.PyJWK(dict(target.provider.signing_jwk), algorithm="RS256").key
        assert isinstance(key, rsa.RSAPrivateKey)
        self.issuer_key: rsa.RSAPrivateKey = key

    def header(self, **changes: Any) -> dict[str, Any]:
        return _changed({"alg": "RS256", "typ": "at+jwt", "kid": self.target.kid}, changes)

    def claims(self, **changes: Any) -> dict[str, Any]:
        return _changed(self.real_claims, changes)

    def by_issuer(self, header: Mapping[str, Any], claims: Mapping[str, Any]) -> str:
        """Signed with the provider's own private key: the signature verifies."""
        return compact(header, claims, rsa_signer(self.issuer_key))

    def by_attacker(self, header: Mapping[str, Any], claims: Mapping[str, Any]) -> str:
        return compact(header, claims, rsa_signer(self.target.attacker_key))

    def attacker_jwk(self, kid: str) -> dict[str, Any]:
        public = RSAAlgorithm.to_jwk(self.target.attacker_key.public_key(), as_dict=True)
        return {**public, "kid": kid, "alg": "RS256", "use": "sig"}

    def issuer_public_pem(self) -> bytes:
        return self.issuer_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def issuer_public_jwk_text(self) -> bytes:
        [served] = [k for k in self.target.served_jwks["keys"] if k["kid"] == self.target.kid]
        return json.dumps(served, separators=(",", ":")).encode()

    def oversized(self, total: int) -> str:
        """A token signed by the provider's key, padded to ``total`` characters or one or
        two beyond (each padding byte adds four thirds of a character)."""
        unpadded = self.by_issuer(self.header(), self.claims(pad=""))
        room = max(0, total - len(unpadded))
        token = self.by_issuer(self.header(), self.claims(pad="x" * (room * 3 // 4)))
        while len(token) < total:
            room += 1
            token = self.by_issuer(self.header(), self.claims(pad="x" * (room * 3 // 4)))
        return token

    @staticmethod
    def now() -> int:
        return int(time.time())


# ------------------------------------------------------------------------------ the check


def token_parts(token: str, known: tuple[str, ...] = ()) -> list[str]:
    """What of ``token`` an answer must not show: the token, each segment, every string
    (and long number) in its header and claims — except the values in ``known``."""
    parts = [token, *[s for s in token.split(".") if len(s) >= 8]]
    for encoded in token.split(".")[:2]:
        try:
            document = json.loads(unb64(encoded))
        except (ValueError, RecursionError):
            continue
        values = document.values() if isinstance(document, dict) else []
        for value in values:
            for item in value if isinstance(value, list) else [value]:
                text = str(item) if isinstance(item, str | int) else ""
                if len(text) >= 8 and text not in known:
                    parts.append(text)
    return parts


def assert_refused(response: httpx.Response, token: str, known: tuple[str, ...] = ()) -> None:
    """The answer CONTRACT §8.1 gives a bad token, with nothing of the token in it.

    ``known`` are the gateway's own settings (its public URL is in every problem's
    ``instance``): they are blanked out of the answer before it is searched, so a token
    value that merely contains one (``aud`` with a trailing slash) is still looked for."""
    assert response.status_code == 401, f"answered {response.status_code}, not 401"
    assert response.headers.get("content-type", "").startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == Code.AUTHENTICATION_REFUSED.value, problem
    assert problem["status"] == 401 and problem["type"] == Code.AUTHENTICATION_REFUSED.type_uri
    assert isinstance(problem["title"], str) and isinstance(problem["detail"], str)
    assert response.headers.get_list("www-authenticate") == [WWW_AUTHENTICATE]
    shown = response.text + "\n" + "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    for setting in sorted(known, key=len, reverse=True):
        shown = shown.replace(setting, "\0")
    echoed = [part for part in token_parts(token, known) if part in shown]
    assert not echoed, f"the answer shows {len(echoed)} part(s) of the token"


def check_jwks_fetches(fetched: int, elapsed: float) -> None:
    """A flood lasting ``elapsed`` seconds may cause one fetch, then one per 60 s."""
    bound = 1 + math.floor(elapsed / CONTRACT_REFRESH_SECONDS)
    assert fetched <= bound, (
        f"{fetched} JWKS fetches during {elapsed:.1f} s of unknown kids; CONTRACT allows {bound}"
    )


# ------------------------------------------------------------------------------ the attacks


def _alg_none(f: Forge) -> str:
    return compact(f.header(alg="none"), f.claims(), None)


def _alg_none_with_signature(f: Forge) -> str:
    # The provider's real signature kept, the header switched to "none".
    real_signature = f.target.operator_token.rsplit(".", 1)[1]
    unsigned = compact(f.header(alg="none"), f.real_claims, None)
    return unsigned + real_signature


def _alg_none_capitalised(f: Forge) -> str:
    return compact(f.header(alg="NONE"), f.claims(), None)


def _hs256_public_pem(f: Forge) -> str:
    return compact(f.header(alg="HS256"), f.claims(), hmac_signer(f.issuer_public_pem()))


def _hs256_public_jwk(f: Forge) -> str:
    return compact(f.header(alg="HS256"), f.claims(), hmac_signer(f.issuer_public_jwk_text()))


def _es256_under_the_rsa_kid(f: Forge) -> str:
    # Another algorithm the deployment allows, naming the issuer's RSA key.
    key = ec.generate_private_key(ec.SECP256R1())
    algorithm = ECAlgorithm(ECAlgorithm.SHA256)
    return compact(f.header(alg="ES256"), f.claims(), lambda data: algorithm.sign(data, key))


def _unpublished_key_issuer_kid(f: Forge) -> str:
    return f.by_attacker(f.header(), f.claims())


def _unpublished_key_own_kid(f: Forge) -> str:
    return f.by_attacker(f.header(kid=f"attacker-{uuid.uuid4().hex}"), f.claims())


def _kid_not_in_jwks(f: Forge) -> str:
    return f.by_issuer(f.header(kid=f"retired-{uuid.uuid4().hex}"), f.claims())


def _kid_missing(f: Forge) -> str:
    return f.by_issuer(f.header(kid=DROP), f.claims())


def _jku(f: Forge) -> str:
    kid = f"attacker-{uuid.uuid4().hex}"
    return f.by_attacker(f.header(kid=kid, jku=f.target.trap_url), f.claims())


def _jku_at_the_issuer_host(f: Forge) -> str:
    kid = f"attacker-{uuid.uuid4().hex}"
    url = f"{f.target.issuer}/{f.target.marker}/jwks"
    return f.by_attacker(f.header(kid=kid, jku=url), f.claims())


def _x5u(f: Forge) -> str:
    kid = f"attacker-{uuid.uuid4().hex}"
    return f.by_attacker(f.header(kid=kid, x5u=f.target.trap_url), f.claims())


def _x5u_at_the_issuer_host(f: Forge) -> str:
    kid = f"attacker-{uuid.uuid4().hex}"
    url = f"{f.target.issuer}/{f.target.marker}/cert.pem"
    return f.by_attacker(f.header(kid=kid, x5u=url), f.claims())


def _embedded_jwk(f: Forge) -> str:
    kid = f"attacker-{uuid.uuid4().hex}"
    return f.by_attacker(f.header(kid=kid, jwk=f.attacker_jwk(kid)), f.claims())


def _embedded_jwk_under_the_issuers_kid(f: Forge) -> str:
    return f.by_attacker(f.header(jwk=f.attacker_jwk(f.target.kid)), f.claims())


def _embedded_x5c(f: Forge) -> str:
    chain = self_signed_chain(f.target.attacker_key)
    return f.by_attacker(f.header(kid=f"attacker-{uuid.uuid4().hex}", x5c=chain), f.claims())


def _typ_jwt(f: Forge) -> str:
    return f.by_issuer(f.header(typ="JWT"), f.claims())


def _typ_absent(f: Forge) -> str:
    return f.by_issuer(f.header(typ=DROP), f.claims())


def _crit_unknown(f: Forge) -> str:
    extension = "urn:attack:must-understand"
    return f.by_issuer(f.header(crit=[extension], **{extension: True}), f.claims())


def _iss(value: Callable[[str], Any]) -> Callable[[Forge], str]:
    return lambda f: f.by_issuer(f.header(), f.claims(iss=value(f.target.issuer)))


def _aud(value: Callable[[Target], Any]) -> Callable[[Forge], str]:
    return lambda f: f.by_issuer(f.header(), f.claims(aud=value(f.target)))


def _exp_past_skew(f: Forge) -> str:
    now, skew = f.now(), f.target.skew
    return f.by_issuer(
        f.header(), f.claims(exp=now - skew - MARGIN_SECONDS, iat=now - skew - 2 * MARGIN_SECONDS)
    )


def _nbf_future(f: Forge) -> str:
    return f.by_issuer(f.header(), f.claims(nbf=f.now() + f.target.skew + MARGIN_SECONDS))


def _iat_future(f: Forge) -> str:
    return f.by_issuer(f.header(), f.claims(iat=f.now() + f.target.skew + MARGIN_SECONDS))


def _id_token(audience: Callable[[Target], str]) -> Callable[[Forge], str]:
    # Client credentials issue no ID token, so this one is made as the provider makes them
    # (no typ, aud the client, nonce, auth_time, at_hash) and signed with its key.
    def build(f: Forge) -> str:
        now, claims = f.now(), f.real_claims
        id_claims = {
            "iss": f.target.issuer,
            "sub": claims["sub"],
            "aud": audience(f.target),
            "azp": claims["client_id"],
            "exp": now + 300,
            "iat": now,
            "auth_time": now - 5,
            "nonce": uuid.uuid4().hex,
            "at_hash": b64(hashlib.sha256(uuid.uuid4().bytes).digest()[:16]),
        }
        return f.by_issuer({"alg": "RS256", "kid": f.target.kid}, id_claims)

    return build


def _over_the_size_limit(f: Forge) -> str:
    token = f.oversized(MAX_TOKEN_BYTES + 1)
    assert MAX_TOKEN_BYTES < len(token) <= MAX_TOKEN_BYTES + 4
    return token


DEEP: Final = "[" * 2500 + "]" * 2500
"""JSON nested deeper than Python's reader goes (its recursion limit), within the size limit."""


def _raw_by_issuer(f: Forge, header: str, claims: str) -> str:
    signing_input = b64(header.encode()) + "." + b64(claims.encode())
    return signing_input + "." + b64(rsa_signer(f.issuer_key)(signing_input.encode()))


def _header_nested_too_deep(f: Forge) -> str:
    header = json.dumps(f.header())[:-1] + ', "x": ' + DEEP + "}"
    return _raw_by_issuer(f, header, json.dumps(f.claims()))


def _payload_nested_too_deep(f: Forge) -> str:
    claims = json.dumps(f.claims())[:-1] + ', "x": ' + DEEP + "}"
    return _raw_by_issuer(f, json.dumps(f.header()), claims)


def _truncated_signature(f: Forge) -> str:
    # The provider's signature without its last 16 bytes, still well-formed base64url.
    head, signature = f.target.operator_token.rsplit(".", 1)
    return head + "." + b64(unb64(signature)[:-16])


def _signature_cut_mid_character(f: Forge) -> str:
    # Cut as text, 330 characters of signature left: the last one holds 4 bits past the
    # 247th byte, which an encoder writes as zeros. Made non-zero here (B is 1, C is 2), as a
    # cut through random text leaves them 15 times out of 16.
    cut = f.target.operator_token[:-12]
    assert len(cut.rsplit(".", 1)[1]) % 4 == 2
    return cut[:-1] + ("C" if cut[-1] == "B" else "B")


def _signature_over_another_payload(f: Forge) -> str:
    # The provider's signature of the operator token on a payload naming the producer.
    header, _payload, signature = f.target.operator_token.split(".")
    producer = jwt.decode(f.target.producer_token, options={"verify_signature": False})
    payload = segment(f.claims(sub=producer["sub"], client_id=producer["client_id"]))
    return f"{header}.{payload}.{signature}"


def _signature_of_another_real_token(f: Forge) -> str:
    # Two genuine tokens of the provider: one's header and payload, the other's signature.
    head = f.target.operator_token.rsplit(".", 1)[0]
    return head + "." + f.target.other_resource_token.rsplit(".", 1)[1]


# Each attack, with the rule it is refused by (the ``reason`` the gateway logs at info level;
# :mod:`gateway.auth` keeps those words for the server's log and for tests).
ALG: Final = "alg is not allowed"
TYP: Final = "typ is not at+jwt"
UNKNOWN_KID: Final = "kid is not among the issuer's keys"
SIGNATURE: Final = "signature does not verify"
ISS: Final = "iss is not the issuer"
AUD_NOT_OURS: Final = "aud does not contain the audience"
EXP_UNUSABLE: Final = "exp is missing or malformed"
NOT_COMPACT: Final = "not a compact JWS"
"""An empty signature segment (``alg: none``) is refused before anything is decoded."""
UNREADABLE: Final = "header is not readable"

ATTACKS: Final[dict[str, tuple[Callable[[Forge], str], str]]] = {
    "alg-none": (_alg_none, NOT_COMPACT),
    "alg-none-keeping-the-signature": (_alg_none_with_signature, ALG),
    "alg-NONE": (_alg_none_capitalised, NOT_COMPACT),
    "hs256-keyed-with-the-rsa-public-pem": (_hs256_public_pem, ALG),
    "hs256-keyed-with-the-rsa-public-jwk": (_hs256_public_jwk, ALG),
    "es256-under-the-issuers-rsa-kid": (_es256_under_the_rsa_kid, "key is for another algorithm"),
    "unpublished-key-under-the-issuers-kid": (_unpublished_key_issuer_kid, SIGNATURE),
    "unpublished-key-under-its-own-kid": (_unpublished_key_own_kid, UNKNOWN_KID),
    "kid-not-in-the-jwks": (_kid_not_in_jwks, UNKNOWN_KID),
    "kid-missing": (_kid_missing, "header names no kid"),
    "jku-header": (_jku, UNKNOWN_KID),
    "jku-header-at-the-issuers-host": (_jku_at_the_issuer_host, UNKNOWN_KID),
    "x5u-header": (_x5u, UNKNOWN_KID),
    "x5u-header-at-the-issuers-host": (_x5u_at_the_issuer_host, UNKNOWN_KID),
    "embedded-jwk-header": (_embedded_jwk, UNKNOWN_KID),
    "embedded-jwk-under-the-issuers-kid": (_embedded_jwk_under_the_issuers_kid, SIGNATURE),
    "embedded-x5c-header": (_embedded_x5c, UNKNOWN_KID),
    "typ-JWT": (_typ_jwt, TYP),
    "typ-absent": (_typ_absent, TYP),
    # PyJWT refuses an unknown critical extension as it reads the header.
    "crit-unknown-extension": (_crit_unknown, UNREADABLE),
    "iss-trailing-slash": (_iss(lambda issuer: issuer + "/"), ISS),
    "iss-a-prefix-of-the-issuer": (_iss(lambda issuer: issuer[:-1]), ISS),
    "iss-prefixed": (_iss(lambda issuer: "https://attacker.example/" + issuer), ISS),
    "iss-suffixed-path": (_iss(lambda issuer: issuer + "/tenant"), ISS),
    "iss-suffixed-port-digit": (_iss(lambda issuer: issuer + "0"), ISS),
    "iss-other-case": (_iss(lambda issuer: issuer.upper()), ISS),
    "iss-missing": (_iss(lambda issuer: DROP), ISS),
    "iss-in-an-array": (_iss(lambda issuer: [issuer]), ISS),
    "aud-missing": (_aud(lambda t: DROP), "aud is missing or malformed"),
    "aud-another-resource": (_aud(lambda t: ANOTHER_RESOURCE), AUD_NOT_OURS),
    "aud-array-without-ours": (_aud(lambda t: [ANOTHER_RESOURCE, t.issuer]), AUD_NOT_OURS),
    "aud-trailing-slash": (_aud(lambda t: t.audience + "/"), AUD_NOT_OURS),
    "aud-real-token-for-another-resource": (lambda f: f.target.other_resource_token, AUD_NOT_OURS),
    "exp-past-skew": (_exp_past_skew, "token expired"),
    "exp-missing": (lambda f: f.by_issuer(f.header(), f.claims(exp=DROP)), EXP_UNUSABLE),
    "exp-of-400-digits": (lambda f: f.by_issuer(f.header(), f.claims(exp=10**400)), EXP_UNUSABLE),
    "nbf-future-past-skew": (_nbf_future, "token not yet valid"),
    "iat-future-past-skew": (_iat_future, "iat is in the future"),
    "sub-missing": (lambda f: f.by_issuer(f.header(), f.claims(sub=DROP)), "sub is missing"),
    "client-id-missing": (
        lambda f: f.by_issuer(f.header(), f.claims(client_id=DROP)),
        "client_id is missing",
    ),
    "id-token-for-the-client": (_id_token(lambda t: t.stack.summary["operatorClientId"]), TYP),
    "id-token-for-the-gateways-audience": (_id_token(lambda t: t.audience), TYP),
    "header-nested-too-deep": (_header_nested_too_deep, UNREADABLE),
    "payload-nested-too-deep": (_payload_nested_too_deep, "payload is not JSON"),
    "over-the-size-limit": (_over_the_size_limit, "token too large"),
    "truncated-signature": (_truncated_signature, SIGNATURE),
    "signature-cut-mid-character": (_signature_cut_mid_character, UNREADABLE),
    "signature-over-another-payload": (_signature_over_another_payload, SIGNATURE),
    "signature-of-another-real-token": (_signature_of_another_real_token, SIGNATURE),
}
ISS_ATTACKS: Final = tuple(name for name in ATTACKS if name.startswith("iss-"))

TRIED: dict[str, int] = {}
REFUSED: dict[str, int] = {}
FLOOD: dict[str, float] = {}


# ------------------------------------------------------------------------------ fixtures


def _keep(target: Target, database: Any) -> None:
    """What the family used and showed, for the tier's secrets check (item 7)."""
    stack = target.stack
    EXPOSURE.keep_logs(FAMILY, stack)
    EXPOSURE.keep_secret_files(FAMILY, stack)
    EXPOSURE.keep_database(FAMILY, database)
    for client_id, secret in stack.caller_secrets.items():
        EXPOSURE.keep_secret(f"{FAMILY}/client-secret-{client_id}", secret)
    EXPOSURE.keep_secret(f"{FAMILY}/provider-signing-key", str(target.provider.signing_jwk["d"]))
    for name in ("operator_token", "producer_token", "other_resource_token"):
        EXPOSURE.keep_secret(f"{FAMILY}/{name}", getattr(target, name))
    with contextlib.suppress(httpx.HTTPError):
        EXPOSURE.keep_response(f"{FAMILY}/metrics", httpx.get(stack.metrics_url + "/metrics"))


@pytest.fixture(scope="module")
def target(postgres_server: PostgresCluster, oidc_providers: OidcProviders) -> Iterator[Target]:
    # A short folder: the coordinator's Unix sockets live under it.
    workdir = Path(tempfile.mkdtemp(prefix="rcta-", dir="/tmp"))
    name = f"coordinator_token_attacks_{os.getpid()}"
    database = postgres_server.create_database(name)
    stack: ProviderStack | None = None
    trap = socket.socket()
    try:
        built = build_package(ROOT / "examples" / "approval-notice", workdir / "packages")
        stack = ProviderStack.prepare(
            workdir / "stack", packages=[(built.path, built.digest)], database=database
        )
        clients, resources = stack.registrations()
        callers = tuple(stack.caller_secrets)
        resources.append(Resource(ANOTHER_RESOURCE, ANOTHER_RESOURCE, (), callers))
        provider = oidc_providers.start(
            workdir / "provider",
            issuer=stack.summary["issuer"],
            clients=clients,
            resources=resources,
        )
        stack.provider = provider
        asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
        # At info level the gateway logs why it refused each token (never the token).
        stack.start_coordinator("--log-level", "info")
        authentication = load_runtime_file(stack.runtime_file).deployment.authentication
        trap.bind(("127.0.0.1", 0))
        trap.listen(16)
        trap.setblocking(False)
        operator = str(stack.summary["operatorClientId"])
        made = Target(
            stack=stack,
            provider=provider,
            skew=authentication.clock_skew_seconds,
            policies=authentication.policies,
            algorithms=tuple(authentication.algorithms),
            trap=trap,
            marker=f"never-fetch-{uuid.uuid4().hex}",
            served_jwks=httpx.get(provider.jwks_uri, timeout=10).json(),
            operator_token=stack.caller_token("operator"),
            producer_token=stack.caller_token("producer"),
            other_resource_token=provider.access_token(operator, resource=ANOTHER_RESOURCE),
        )
        yield made
        _keep(made, database)
    finally:
        trap.close()
        if stack is not None:
            stack.stop()
        postgres_server.drop_database(name)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def forge(target: Target) -> Forge:
    return Forge(target)


# ------------------------------------------------------------------------------ controls


def test_a_token_of_the_provider_is_accepted(target: Target) -> None:
    answer = target.send(target.operator_token)
    assert answer.status_code == 200, answer.text
    assert answer.json()["runs"] == []
    header = jwt.get_unverified_header(target.operator_token)
    assert (header["typ"], header["alg"], header["kid"]) == ("at+jwt", "RS256", target.kid)


def test_a_repeated_authorization_header_is_refused_and_logged(target: Target) -> None:
    """Two Authorization headers, each with a good token: refused as every token refusal
    is, with its reason in the gateway's log."""
    logged = target.log_mark()
    token = target.operator_token
    answer = httpx.get(
        target.audience + TARGET_PATH,
        headers=[("Authorization", f"Bearer {token}"), ("Authorization", f"Bearer {token}")],
        timeout=10,
    )
    assert_refused(answer, token, known=(target.audience, target.issuer))
    assert target.refusals_since(logged) == ["repeated Authorization header"]


def test_a_token_the_forge_signs_unchanged_is_accepted(forge: Forge) -> None:
    """The forge's tokens verify: each attack is refused for its one change."""
    answer = forge.target.send(forge.by_issuer(forge.header(), forge.claims()))
    assert answer.status_code == 200, answer.text


def test_times_within_the_skew_and_a_size_within_the_limit_are_accepted(forge: Forge) -> None:
    now, inside = forge.now(), forge.target.skew // 2
    within_skew = forge.by_issuer(
        forge.header(), forge.claims(exp=now - inside, nbf=now + inside, iat=now + inside)
    )
    largest = forge.oversized(MAX_TOKEN_BYTES - 3)
    assert MAX_TOKEN_BYTES - 3 <= len(largest) <= MAX_TOKEN_BYTES
    for token in (within_skew, largest):
        answer = forge.target.send(token)
        assert answer.status_code == 200, answer.text


# ------------------------------------------------------------------------------ attacks


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_attack_is_refused(forge: Forge, attack: str) -> None:
    target = forge.target
    build, reason = ATTACKS[attack]
    token = build(forge)
    TRIED[attack] = TRIED.get(attack, 0) + 1
    EXPOSURE.keep_secret(f"{FAMILY}/attack/{attack}", token)
    logged = target.log_mark()

    answer = target.send(token)

    EXPOSURE.keep_response(f"{FAMILY}/answers", answer)
    assert_refused(answer, token, known=(target.audience, target.issuer))
    target.assert_nothing_fetched()
    assert target.refusals_since(logged) == [reason]
    REFUSED[attack] = REFUSED.get(attack, 0) + 1


async def _flood(target: Target, forge: Forge, size: int) -> list[tuple[str, httpx.Response]]:
    kids = [f"flood-{uuid.uuid4().hex}" for _ in range(size)]
    signer = rsa_signer(forge.issuer_key)
    tokens = [compact(forge.header(kid=kid), forge.claims(), signer) for kid in kids]
    limits = httpx.Limits(max_connections=FLOOD_CONCURRENCY)
    gate = asyncio.Semaphore(FLOOD_CONCURRENCY)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def one(token: str) -> tuple[str, httpx.Response]:
            async with gate:
                headers = {"Authorization": f"Bearer {token}"}
                return token, await client.get(target.audience + TARGET_PATH, headers=headers)

        return await asyncio.gather(*(one(token) for token in tokens))


@pytest.mark.timeout(int(LONG_FLOOD_SECONDS) + 120)
def test_a_flood_of_random_kids_leaves_the_jwks_fetches_rate_limited(
    target: Target, forge: Forge
) -> None:
    before = target.provider.requests().get("GET /jwks", 0)
    logged = target.log_mark()
    started = time.monotonic()
    answers = asyncio.run(_flood(target, forge, FLOOD_SIZE))
    # The long run floods for more than two refresh periods: then the pacing must still
    # let the gateway refresh (a rotated key is found), once per period.
    while time.monotonic() - started < LONG_FLOOD_SECONDS:
        answers += asyncio.run(_flood(target, forge, FLOOD_SIZE))
    elapsed = time.monotonic() - started
    fetched = target.provider.requests().get("GET /jwks", 0) - before
    assert target.refusals_since(logged) == [UNKNOWN_KID] * len(answers)

    refused = 0
    for token, answer in answers:
        assert_refused(answer, token, known=(target.audience, target.issuer))
        refused += 1
    for number, (token, answer) in enumerate(answers[:5]):
        EXPOSURE.keep_secret(f"{FAMILY}/flood-{number}", token)
        EXPOSURE.keep_response(f"{FAMILY}/flood-answers", answer)
    FLOOD.update(
        {"sent": len(answers), "refused": refused, "jwksFetches": fetched, "seconds": elapsed}
    )
    check_jwks_fetches(fetched, elapsed)
    # ... and not fewer: the k-th refresh comes with the first unknown kid a period after
    # the (k-1)-th, so by k periods and a batch's time (the long flood keeps 5 s of slack).
    assert fetched >= math.floor(elapsed / CONTRACT_REFRESH_SECONDS)
    # The gateway still takes the provider's tokens after the flood.
    assert target.send(target.operator_token).status_code == 200


# ------------------------------------------------------------------------------ broken variants


class IssuerUnchecked(TokenVerifier):
    """A verifier that lost its ``iss`` check: whatever the token says, it is our issuer."""

    def _claims(self, claims: dict[str, Any]) -> VerifiedToken:
        return super()._claims({**claims, "iss": self.issuer})


@contextlib.asynccontextmanager
async def in_process_gateway(
    target: Target, kind: type[TokenVerifier], **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app in this process with a verifier of ``kind`` that fetches the
    provider's JWKS, the deployment's policies, and a fake backend behind it."""
    async with httpx.AsyncClient() as fetcher:
        verifier = kind(
            issuer=target.issuer,
            audience=target.audience,
            algorithms=target.algorithms,
            clock_skew_seconds=target.skew,
            source=HttpJwksSource(target.provider.jwks_uri, fetcher),
            **options,
        )
        ctx = GatewayContext(
            backend=FakeBackend(),
            verifier=verifier,
            policies=target.policies,
            public_url=target.audience,
        )
        async with client_for(create_app(ctx)) as client:
            yield client


async def test_a_verifier_without_its_iss_check_fails_the_iss_attacks(forge: Forge) -> None:
    target = forge.target
    known = (target.audience, target.issuer)
    headers = {"Authorization": f"Bearer {target.operator_token}"}
    async with (
        in_process_gateway(target, TokenVerifier) as intact,
        in_process_gateway(target, IssuerUnchecked) as broken,
    ):
        # Both take the provider's token; only the intact one refuses the iss attacks.
        assert (await intact.get(TARGET_PATH, headers=headers)).status_code == 200
        assert (await broken.get(TARGET_PATH, headers=headers)).status_code == 200
        for attack in ISS_ATTACKS:
            token = ATTACKS[attack][0](forge)
            headers = {"Authorization": f"Bearer {token}"}
            assert_refused(await intact.get(TARGET_PATH, headers=headers), token, known)
            accepted = await broken.get(TARGET_PATH, headers=headers)
            with pytest.raises(AssertionError, match="answered 200, not 401"):
                assert_refused(accepted, token, known)


async def _paced_flood(forge: Forge, refresh_interval: float) -> tuple[int, float]:
    """Rounds of unknown kids, a refresh period and a second apart on an injected monotonic
    clock, against an in-process verifier fetching the provider's JWKS: the fetches the
    provider counted after the start-up load, and the (injected) time the flood lasted."""
    target, rounds, size = forge.target, 3, 10
    signer = rsa_signer(forge.issuer_key)
    now = [0.0]
    async with httpx.AsyncClient() as fetcher:
        verifier = TokenVerifier(
            issuer=target.issuer,
            audience=target.audience,
            algorithms=target.algorithms,
            clock_skew_seconds=target.skew,
            source=HttpJwksSource(target.provider.jwks_uri, fetcher),
            monotonic=lambda: now[0],
            refresh_interval=refresh_interval,
        )
        assert await verifier.refresh()  # the load at start-up, as the gateway does
        before = target.provider.requests().get("GET /jwks", 0)
        for round_number in range(rounds):
            now[0] = round_number * (CONTRACT_REFRESH_SECONDS + 1)
            for _ in range(size):
                kid = f"flood-{uuid.uuid4().hex}"
                with pytest.raises(AuthenticationRefused):
                    await verifier.verify(compact(forge.header(kid=kid), forge.claims(), signer))
    return target.provider.requests().get("GET /jwks", 0) - before, now[0]


async def test_the_flood_check_passes_a_paced_verifier_and_fails_an_unpaced_one(
    forge: Forge,
) -> None:
    paced, paced_seconds = await _paced_flood(forge, CONTRACT_REFRESH_SECONDS)
    unpaced, unpaced_seconds = await _paced_flood(forge, 0.0)

    # Paced: one refresh in each later period (the first one's came with the start-up load).
    assert paced == 2
    check_jwks_fetches(paced, paced_seconds)
    # Without pacing every unknown kid costs the issuer a fetch.
    assert unpaced == 30
    with pytest.raises(AssertionError, match="JWKS fetches"):
        check_jwks_fetches(unpaced, unpaced_seconds)


def test_the_echo_check_finds_a_token_part_in_an_answer(forge: Forge) -> None:
    """:func:`assert_refused` fails on a 401 that shows a piece of the token."""
    token = _kid_not_in_jwks(forge)
    kid = jwt.get_unverified_header(token)["kid"]
    for shown in (token.split(".")[2], kid):
        problem = {
            "type": Code.AUTHENTICATION_REFUSED.type_uri,
            "title": "Authentication refused",
            "status": 401,
            "detail": f"cannot use {shown}",
            "code": Code.AUTHENTICATION_REFUSED.value,
        }
        answer = httpx.Response(
            401,
            json=problem,
            headers={
                "content-type": "application/problem+json",
                "www-authenticate": WWW_AUTHENTICATE,
            },
        )
        with pytest.raises(AssertionError, match="shows 1 part"):
            assert_refused(answer, token)


# ------------------------------------------------------------------------------ figures


def test_figures_every_attack_tried_was_refused() -> None:
    """Runs last in the module: the family's figures, written and printed."""
    figures = {
        "attacksTried": len(TRIED),
        "attacksRefused": len(REFUSED),
        "attacksNotRefused": sorted(set(TRIED) - set(REFUSED)),
        "flood": FLOOD,
        "floodRefreshBound": 1 + math.floor(FLOOD.get("seconds", 0.0) / CONTRACT_REFRESH_SECONDS),
    }
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\ntoken attacks: {json.dumps(figures)}")
    assert len(TRIED) >= 20, "run the whole module: fewer than 20 attacks were tried"
    assert set(REFUSED) == set(TRIED) == set(ATTACKS)
    assert FLOOD.get("sent") == FLOOD.get("refused")
    assert FLOOD.get("sent", 0) >= FLOOD_SIZE
