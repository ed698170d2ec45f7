"""A development OpenID Connect issuer for the local stack and the tests.

It does only what the coordinator and the stand-ins need from an issuer (CONTRACT §9.3,
§14): discovery, a JWKS, and a token endpoint for the client credentials grant where the
client proves itself with ``private_key_jwt`` (RFC 7523; the assertion's ``aud`` is the token
endpoint URL or the issuer identifier) and names one ``resource`` (RFC 8707). Tokens are
RFC 9068 JWT access tokens.

The signing key lives in a state folder (:class:`IssuerState`) so that a running issuer and
``python -m devstack.mint`` sign with the same key, and tokens minted for operators and
producers verify against the JWKS the issuer serves.

Error answers of the token endpoint use the OAuth 2.0 shape (RFC 6749 §5.2); their
descriptions name which check failed and never echo a value from the request.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

Clock = Callable[[], float]
"""Seconds since the Unix epoch; tests pass a fake one."""

ALGORITHMS = ("ES256", "RS256")
"""Asymmetric algorithms accepted for client assertions and used for signing."""

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
MAX_ASSERTION_SECONDS = 300
"""A client assertion may not claim to be valid further ahead than this (CONTRACT §9.3)."""

ACCESS_TOKEN_TYPE = "at+jwt"  # noqa: S105 - a JOSE typ value, not a secret
_SIGNING_KEY_FILE = "signing-key.jwk"
_ISSUER_FILE = "issuer.json"
_MAX_FORM_BYTES = 16 * 1024


# ---------------------------------------------------------------------------------------------
# Keys


def generate_private_jwk(alg: str = "ES256", kid: str | None = None) -> dict[str, Any]:
    """A fresh private JWK (with ``kid``, ``alg`` and ``use``) for ES256 or RS256."""
    if alg == "ES256":
        jwk = ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1()), as_dict=True)
    elif alg == "RS256":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = RSAAlgorithm.to_jwk(key, as_dict=True)
    else:
        raise ValueError("only ES256 and RS256 keys are supported")
    jwk.update({"kid": kid or uuid.uuid4().hex[:16], "alg": alg, "use": "sig"})
    return dict(jwk)


# key_ops goes too: PyJWT writes ["sign"] into a private RSA JWK, and a public key that says
# it only signs is, rightly, no key to verify with (oidc-provider finds "no applicable key").
_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k", "key_ops"})


def public_jwk(private: Mapping[str, Any]) -> dict[str, Any]:
    """The public half of a JWK: the same members without the private ones (and without
    the private key's ``key_ops``)."""
    return {name: value for name, value in private.items() if name not in _PRIVATE_MEMBERS}


def _signing_key(jwk: Mapping[str, Any]) -> Any:
    """The cryptography key object for a JWK (private or public)."""
    return jwt.PyJWK(dict(jwk), algorithm=str(jwk.get("alg"))).key


def _write_owner_only(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by the owner alone, even if it existed before."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, data)
    finally:
        os.close(descriptor)


def format_token_file(token: str) -> bytes:
    """Bytes of a token file: the token and one newline (readers strip one newline)."""
    return token.encode("ascii") + b"\n"


def write_token_file(path: Path, token: str) -> None:
    """Write a bearer token to an owner-only (0600) file."""
    _write_owner_only(path, format_token_file(token))


# ---------------------------------------------------------------------------------------------
# State folder and token minting


@dataclass(frozen=True)
class IssuerState:
    """The issuer's durable state: its URL and its private signing key."""

    folder: Path
    issuer: str
    signing_jwk: Mapping[str, Any]

    @classmethod
    def create(cls, folder: Path, issuer: str, alg: str = "ES256") -> IssuerState:
        """Create (or open, if it already exists for the same URL) a state folder."""
        if (folder / _ISSUER_FILE).exists():
            state = cls.open(folder)
            if state.issuer != issuer:
                raise ValueError(f"{folder}: the state folder belongs to another issuer URL")
            return state
        _check_issuer_url(issuer)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder.chmod(0o700)
        jwk = generate_private_jwk(alg)
        _write_owner_only(folder / _SIGNING_KEY_FILE, json.dumps(jwk).encode())
        _write_owner_only(folder / _ISSUER_FILE, json.dumps({"issuer": issuer}).encode())
        return cls(folder, issuer, jwk)

    @classmethod
    def open(cls, folder: Path) -> IssuerState:
        """Open an existing state folder."""
        try:
            issuer = json.loads((folder / _ISSUER_FILE).read_text())["issuer"]
            jwk = json.loads((folder / _SIGNING_KEY_FILE).read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{folder}: not a readable issuer state folder") from exc
        if not isinstance(issuer, str) or not isinstance(jwk, dict) or "kid" not in jwk:
            raise ValueError(f"{folder}: not a readable issuer state folder")
        return cls(folder, issuer, jwk)

    @property
    def kid(self) -> str:
        """Key id of the signing key, as published in the JWKS."""
        return str(self.signing_jwk["kid"])

    @property
    def alg(self) -> str:
        """Algorithm of the signing key."""
        return str(self.signing_jwk["alg"])

    @property
    def token_endpoint(self) -> str:
        """The token endpoint URL; a client assertion's ``aud`` names it or :attr:`issuer`."""
        return self.issuer.rstrip("/") + "/token"

    @property
    def jwks_uri(self) -> str:
        """Where the public keys are published."""
        return self.issuer.rstrip("/") + "/jwks"

    def jwks(self) -> dict[str, Any]:
        """The public JWKS document."""
        return {"keys": [public_jwk(self.signing_jwk)]}

    def mint(
        self,
        *,
        client_id: str,
        subject: str,
        audience: str | Sequence[str],
        scope: str = "",
        lifetime_seconds: int = 300,
        now: float | None = None,
    ) -> str:
        """Sign an RFC 9068 access token (``typ: at+jwt``) with the issuer's key."""
        issued = int(time.time() if now is None else now)
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": subject,
            "client_id": client_id,
            "aud": audience if isinstance(audience, str) else list(audience),
            "iat": issued,
            "nbf": issued,
            "exp": issued + lifetime_seconds,
            "jti": secrets.token_urlsafe(18),
        }
        if scope:
            claims["scope"] = scope
        return jwt.encode(
            claims,
            _signing_key(self.signing_jwk),
            algorithm=self.alg,
            headers={"kid": self.kid, "typ": ACCESS_TOKEN_TYPE},
        )


def _check_issuer_url(issuer: str) -> None:
    parts = urlsplit(issuer)
    if parts.scheme not in {"http", "https"} or not parts.netloc or parts.query or parts.fragment:
        raise ValueError("the issuer URL must be an absolute http(s) URL without query")


# ---------------------------------------------------------------------------------------------
# Client registrations


@dataclass(frozen=True)
class RegisteredClient:
    """One OAuth client: its public keys, the scopes it may ask for, its resources."""

    client_id: str
    keys: tuple[Mapping[str, Any], ...]
    """Public JWKs, each with ``kid`` and ``alg`` (ES256 or RS256)."""
    scopes: frozenset[str] | None
    """Scopes it may be granted; ``None`` grants whatever it asks for (local stacks whose
    registration file lists keys only)."""
    resources: frozenset[str] | None = None
    """Resources (token audiences) it may ask for; ``None`` allows any absolute URI."""

    def key(self, kid: str) -> Mapping[str, Any] | None:
        """The registered key with this ``kid``, if any."""
        return next((k for k in self.keys if k.get("kid") == kid), None)


def load_clients(path: Path) -> tuple[RegisteredClient, ...]:
    """Read client registrations from a JSON file, in either of two shapes.

    Full: ``{"clients": {"<clientId>": {"jwks": {"keys": [...]}, "scopes": [...],
    "resources"?: [...]}}}``. Keys only: ``{"<clientId>": {"keys": [...]}}`` (what
    ``devstack.runtime_file`` writes), where every scope may be granted.
    """
    try:
        document = json.loads(path.read_text())
        if "clients" in document:
            entries = document["clients"]
        else:
            entries = {client_id: {"jwks": jwks} for client_id, jwks in document.items()}
        clients = []
        for client_id, entry in entries.items():
            keys = tuple(public_jwk(k) for k in entry["jwks"]["keys"])
            for k in keys:
                if k.get("alg") not in ALGORITHMS or not isinstance(k.get("kid"), str):
                    raise ValueError("each client key needs a kid and alg ES256 or RS256")
            scopes, resources = entry.get("scopes"), entry.get("resources")
            clients.append(
                RegisteredClient(
                    client_id=str(client_id),
                    keys=keys,
                    scopes=None if scopes is None else frozenset(map(str, scopes)),
                    resources=None if resources is None else frozenset(map(str, resources)),
                )
            )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a valid client registration file") from exc
    return tuple(clients)


def clients_document(clients: Iterable[RegisteredClient]) -> dict[str, Any]:
    """The JSON document :func:`load_clients` reads, for the given registrations."""
    out: dict[str, Any] = {}
    for client in clients:
        entry: dict[str, Any] = {"jwks": {"keys": [dict(k) for k in client.keys]}}
        if client.scopes is not None:
            entry["scopes"] = sorted(client.scopes)
        if client.resources is not None:
            entry["resources"] = sorted(client.resources)
        out[client.client_id] = entry
    return {"clients": out}


# ---------------------------------------------------------------------------------------------
# The token endpoint


class _OAuthError(Exception):
    """An RFC 6749 error answer; ``description`` names the failed check only."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(f"{error}: {description}")
        self.error = error
        self.description = description
        self.status = status


class DevIssuer:
    """The issuer application: discovery, JWKS and the token endpoint.

    ``app`` is the Starlette application. ``clock`` drives every time check and the
    issued tokens' times, so tests move time instead of waiting.
    """

    def __init__(
        self,
        state: IssuerState,
        clients: Iterable[RegisteredClient],
        *,
        clock: Clock = time.time,
        token_lifetime_seconds: int = 300,
        leeway_seconds: int = 5,
    ) -> None:
        self.state = state
        self.clock = clock
        self.token_lifetime_seconds = token_lifetime_seconds
        self.leeway_seconds = leeway_seconds
        self._clients = {c.client_id: c for c in clients}
        self._seen_jti: dict[tuple[str, str], float] = {}
        self.issued: list[dict[str, Any]] = []
        """Claims of every token issued (never the token itself), for tests."""
        self.app = Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self._discovery, methods=["GET"]),
                Route("/jwks", self._jwks, methods=["GET"]),
                Route("/token", self._token, methods=["POST"]),
            ]
        )

    def register(self, client: RegisteredClient) -> None:
        """Add or replace a client registration."""
        self._clients[client.client_id] = client

    def metadata(self) -> dict[str, Any]:
        """The OpenID discovery document."""
        return {
            "issuer": self.state.issuer,
            "jwks_uri": self.state.jwks_uri,
            "token_endpoint": self.state.token_endpoint,
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["private_key_jwt"],
            "token_endpoint_auth_signing_alg_values_supported": list(ALGORITHMS),
            "id_token_signing_alg_values_supported": [self.state.alg],
            "response_types_supported": ["token"],
            "subject_types_supported": ["public"],
            "scopes_supported": sorted(
                {s for c in self._clients.values() for s in (c.scopes or ())}
            ),
        }

    async def _discovery(self, request: Request) -> Response:
        return JSONResponse(self.metadata())

    async def _jwks(self, request: Request) -> Response:
        return JSONResponse(self.state.jwks(), headers={"Cache-Control": "max-age=60"})

    async def _token(self, request: Request) -> Response:
        try:
            form = await _read_form(request)
            body = self.grant(form)
        except _OAuthError as exc:
            headers = {"Cache-Control": "no-store"}
            if exc.status == 401:
                headers["WWW-Authenticate"] = 'Bearer error="invalid_client"'
            return JSONResponse(
                {"error": exc.error, "error_description": exc.description},
                status_code=exc.status,
                headers=headers,
            )
        return JSONResponse(body, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})

    def grant(self, form: Mapping[str, list[str]]) -> dict[str, Any]:
        """Judge one token request (form fields → values) and issue a token."""
        now = self.clock()
        if _single(form, "grant_type") != "client_credentials":
            raise _OAuthError("unsupported_grant_type", "only client_credentials is supported")
        if _single(form, "client_assertion_type") != ASSERTION_TYPE:
            raise _OAuthError("invalid_client", "a jwt-bearer client assertion is required", 401)
        assertion = _single(form, "client_assertion")
        if not assertion:
            raise _OAuthError("invalid_client", "client_assertion is missing", 401)
        client = self._authenticate(assertion, _single(form, "client_id"), now)
        scope = self._granted_scope(client, _single(form, "scope"))
        resource = self._resource(client, form.get("resource", []))
        issued = int(now)
        claims: dict[str, Any] = {
            "iss": self.state.issuer,
            "sub": client.client_id,
            "client_id": client.client_id,
            "aud": resource,
            "scope": scope,
            "iat": issued,
            "nbf": issued,
            "exp": issued + self.token_lifetime_seconds,
            "jti": secrets.token_urlsafe(18),
        }
        token = jwt.encode(
            claims,
            _signing_key(self.state.signing_jwk),
            algorithm=self.state.alg,
            headers={"kid": self.state.kid, "typ": ACCESS_TOKEN_TYPE},
        )
        self.issued.append(claims)
        return {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": self.token_lifetime_seconds,
            "scope": scope,
        }

    def _authenticate(
        self, assertion: str, form_client_id: str | None, now: float
    ) -> RegisteredClient:
        try:
            header = jwt.get_unverified_header(assertion)
            unverified = jwt.decode(assertion, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise _OAuthError("invalid_client", "the client assertion is not a JWT", 401) from exc
        client_id = unverified.get("iss")
        client = self._clients.get(client_id) if isinstance(client_id, str) else None
        if client is None:
            raise _OAuthError("invalid_client", "unknown client", 401)
        if form_client_id is not None and form_client_id != client.client_id:
            raise _OAuthError("invalid_client", "client_id does not match the assertion", 401)
        alg, kid = header.get("alg"), header.get("kid")
        key = client.key(kid) if isinstance(kid, str) else None
        if key is None or alg not in ALGORITHMS or key.get("alg") != alg:
            raise _OAuthError("invalid_client", "no registered key for the assertion", 401)
        try:
            claims = jwt.decode(
                assertion,
                _signing_key(key),
                algorithms=[alg],
                options={
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": False,
                    "verify_iss": False,
                },
            )
        except jwt.PyJWTError as exc:
            raise _OAuthError("invalid_client", "the assertion signature is invalid", 401) from exc
        if claims.get("sub") != client.client_id:
            raise _OAuthError("invalid_client", "the assertion sub must equal iss", 401)
        if not self._names_this_issuer(claims.get("aud")):
            raise _OAuthError(
                "invalid_client",
                "the assertion aud must be the token endpoint or the issuer identifier",
                401,
            )
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            raise _OAuthError("invalid_client", "the assertion has no exp", 401)
        if exp <= now - self.leeway_seconds:
            raise _OAuthError("invalid_client", "the assertion has expired", 401)
        if exp > now + MAX_ASSERTION_SECONDS + self.leeway_seconds:
            raise _OAuthError("invalid_client", "the assertion expires too far ahead", 401)
        for name in ("nbf", "iat"):
            value = claims.get(name)
            if isinstance(value, int | float) and value > now + self.leeway_seconds:
                raise _OAuthError("invalid_client", f"the assertion {name} is in the future", 401)
        jti = claims.get("jti")
        if not isinstance(jti, str) or not jti:
            raise _OAuthError("invalid_client", "the assertion has no jti", 401)
        self._forget_expired(now)
        if (client.client_id, jti) in self._seen_jti:
            raise _OAuthError("invalid_client", "the assertion was already used", 401)
        self._seen_jti[(client.client_id, jti)] = float(exp) + self.leeway_seconds
        return client

    def _names_this_issuer(self, aud: object) -> bool:
        # RFC 7523 lets a client name the token endpoint; FAPI 2.0 (and RFC 7523bis) want the
        # issuer identifier. The coordinator sends either, as clientAssertionAudience says.
        accepted = {self.state.token_endpoint, self.state.issuer}
        if isinstance(aud, str):
            return aud in accepted
        return isinstance(aud, list) and any(isinstance(v, str) and v in accepted for v in aud)

    def _forget_expired(self, now: float) -> None:
        # An expired assertion is refused on its exp alone, so its jti need not be kept.
        for entry in [k for k, until in self._seen_jti.items() if until < now]:
            del self._seen_jti[entry]

    @staticmethod
    def _granted_scope(client: RegisteredClient, requested: str | None) -> str:
        if requested is None or not requested.strip():
            return " ".join(sorted(client.scopes or ()))
        wanted = requested.split()
        if client.scopes is not None and any(s not in client.scopes for s in wanted):
            raise _OAuthError("invalid_scope", "a requested scope is not allowed for the client")
        return " ".join(dict.fromkeys(wanted))

    @staticmethod
    def _resource(client: RegisteredClient, values: list[str]) -> str:
        if len(values) != 1:
            raise _OAuthError("invalid_target", "exactly one resource is required")
        resource = values[0]
        parts = urlsplit(resource)
        if not parts.scheme or not parts.netloc or parts.fragment:
            raise _OAuthError("invalid_target", "the resource must be an absolute URI")
        if client.resources is not None and resource not in client.resources:
            raise _OAuthError("invalid_target", "the resource is not allowed for the client")
        return resource


def _single(form: Mapping[str, list[str]], name: str) -> str | None:
    values = form.get(name, [])
    if len(values) > 1:
        raise _OAuthError("invalid_request", f"{name} appears more than once")
    return values[0] if values else None


async def _read_form(request: Request) -> dict[str, list[str]]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise _OAuthError("invalid_request", "the body must be application/x-www-form-urlencoded")
    raw = await request.body()
    if len(raw) > _MAX_FORM_BYTES:
        raise _OAuthError("invalid_request", "the body is too large")
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=bool(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _OAuthError("invalid_request", "the body is not a valid form") from exc
    form: dict[str, list[str]] = {}
    for name, value in pairs:
        form.setdefault(name, []).append(value)
    return form


# ---------------------------------------------------------------------------------------------
# Command line: python -m devstack.issuer --state DIR --clients FILE --bind HOST:PORT
# [--certificate PEM --key PEM]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the development issuer under uvicorn until interrupted."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m devstack.issuer", description=main.__doc__)
    parser.add_argument("--state", type=Path, required=True, help="issuer state folder")
    parser.add_argument("--clients", type=Path, required=True, help="client registrations (JSON)")
    parser.add_argument("--bind", default="127.0.0.1:9100", help="HOST:PORT to listen on")
    parser.add_argument("--issuer-url", help="issuer URL when creating a new state folder")
    parser.add_argument("--certificate", type=Path, help="serve HTTPS with this PEM chain")
    parser.add_argument("--key", type=Path, help="the certificate's private key (PEM)")
    args = parser.parse_args(argv)
    if (args.certificate is None) != (args.key is None):
        parser.error("--certificate and --key go together")
    host, _, port = args.bind.rpartition(":")
    try:
        if args.issuer_url:
            state = IssuerState.create(args.state, args.issuer_url)
        else:
            state = IssuerState.open(args.state)
        clients = load_clients(args.clients)
    except ValueError as exc:
        print(f"devstack.issuer: {exc}", file=sys.stderr)
        return 1
    issuer = DevIssuer(state, clients)
    uvicorn.run(
        issuer.app,
        host=host,
        port=int(port),
        log_level="warning",
        lifespan="off",
        ssl_certfile=None if args.certificate is None else str(args.certificate),
        ssl_keyfile=None if args.key is None else str(args.key),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
