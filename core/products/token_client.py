"""The coordinator's OAuth client for one connection (CONTRACT §9.3).

Each connection calls its product with an access token from the deployment's issuer. The
token endpoint is found through OpenID discovery; the request is the client credentials
grant, authenticated with ``private_key_jwt`` (RFC 7523), asking for the connection's scopes
and, as one RFC 8707 ``resource``, its audience (the ``baseUrl`` unless configured). Tokens
are cached until shortly before they expire; :meth:`TokenClient.invalidate` drops the cached
one after a product answered 401, so the one resend carries a fresh token.

A definite refusal by the issuer (``invalid_client``, ``invalid_scope``, ``invalid_target``…)
and a token granting fewer scopes than the connection asked for are both
:class:`TokenUnavailable` with ``retryable`` False and an ``error`` code: the caller sends
nothing with such a token, and makes the refusal visible (CONTRACT §8.4 ``token-refused``).
An issuer that cannot be reached is :class:`TokenUnavailable` with ``retryable`` True and the
exchange's ``cause``; one whose TLS certificate fails verification has the cause
``tls-refused``, which the caller also makes visible (CONTRACT §9.3, "Untrusted endpoints
are visible"), since it will not mend by itself. The client assertion's ``aud`` is the
token endpoint URL, or the issuer identifier when
``deployment.authentication.clientAssertionAudience`` is ``issuer``.

Nothing here logs or raises with a token, an assertion or a key in the message: errors name
the issuer, the client id and the OAuth error code only.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jwt

from core.products.http import Answer, ExchangeFailure, Exchanger

if TYPE_CHECKING:
    from core.config.model import Connection

Clock = Callable[[], float]

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_LIFETIME_SECONDS = 60
"""Lifetime of a client assertion; the contract allows at most 300."""
DEFAULT_EXPIRES_IN = 60
"""Assumed token lifetime when the issuer's answer gives no ``expires_in``."""
ISSUER_TIMEOUT_SECONDS = 10.0
"""The bound on one exchange with the issuer (discovery or a token request)."""
SCOPE_NARROWED = "scope-narrowed"
"""The error of a token that grants fewer scopes than the connection's ``scopes``."""
UNRECOGNISED = "unrecognised-error"
"""The error of a refusal whose OAuth error code is not one of the known ones."""
_FORM = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
_ALGORITHMS = ("ES256", "RS256")
# OAuth error codes (RFC 6749 §5.2, RFC 8707) safe to repeat in a message (coordinatorctl
# login adds the device grant's).
OAUTH_ERRORS = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "invalid_target",
    }
)


class TokenUnavailable(Exception):
    """No token could be obtained.

    ``retryable`` is True when the issuer could not be reached or answered 429/5xx (nothing
    was sent to the product; try later), False when the issuer refused the client (a
    configuration problem). The message never holds a token or key.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        error: str | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.error = error
        """The issuer's OAuth error code, :data:`SCOPE_NARROWED` or :data:`UNRECOGNISED`, when
        the issuer definitely refused; never a token or a value."""
        self.cause = cause
        """Why the issuer could not be reached, when it could not (the exchange's cause:
        ``never-connected``, ``tls-refused``, ...); None when it answered."""


@dataclass(frozen=True)
class ClientCredentials:
    """What one connection authenticates with."""

    client_id: str
    private_jwk: Mapping[str, Any] = field(repr=False)
    """Private JWK with ``kid`` and ``alg`` (ES256 or RS256)."""
    scopes: tuple[str, ...]
    audience: str
    """Requested as the one ``resource``; the connection's ``baseUrl`` unless configured."""
    assertion_audience: str = "token-endpoint"
    """The client assertion's ``aud``: ``token-endpoint`` (its URL) or ``issuer``."""


class IssuerDiscovery:
    """The issuer's OpenID metadata, fetched once and shared by the connections' clients."""

    def __init__(self, http: Exchanger, issuer: str) -> None:
        self._http = http
        self.issuer = issuer
        self._token_endpoint: str | None = None
        self._lock = asyncio.Lock()

    async def token_endpoint(self) -> str:
        """The token endpoint URL, from ``/.well-known/openid-configuration``."""
        if self._token_endpoint is not None:
            return self._token_endpoint
        async with self._lock:
            if self._token_endpoint is None:
                self._token_endpoint = await self._discover()
        return self._token_endpoint

    async def _discover(self) -> str:
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            answer = await self._http.exchange(
                "GET", url, headers={"Accept": "application/json"}, timeout=ISSUER_TIMEOUT_SECONDS
            )
        except ExchangeFailure as exc:
            raise TokenUnavailable(
                f"issuer {self.issuer}: discovery unreachable ({exc.cause})",
                retryable=True,
                cause=exc.cause,
            ) from None
        if answer.status != 200:
            raise TokenUnavailable(
                f"issuer {self.issuer}: discovery answered {answer.status}",
                retryable=answer.status == 429 or answer.status >= 500,
            )
        try:
            metadata = json.loads(answer.body)
            issuer, endpoint = metadata["issuer"], metadata["token_endpoint"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenUnavailable(
                f"issuer {self.issuer}: discovery document is malformed", retryable=False
            ) from exc
        # OpenID Connect Discovery §4.3: the document must name the issuer it was asked for.
        if issuer != self.issuer or not isinstance(endpoint, str) or not endpoint:
            raise TokenUnavailable(
                f"issuer {self.issuer}: discovery document names another issuer or no endpoint",
                retryable=False,
            )
        return endpoint


class TokenClient:
    """Access tokens for one connection's OAuth client, cached until shortly before expiry."""

    def __init__(
        self,
        http: Exchanger,
        discovery: IssuerDiscovery,
        credentials: ClientCredentials,
        *,
        clock: Clock = time.time,
        refresh_margin_seconds: float = 30.0,
    ) -> None:
        alg = credentials.private_jwk.get("alg")
        if alg not in _ALGORITHMS or not isinstance(credentials.private_jwk.get("kid"), str):
            raise ValueError(
                f"client {credentials.client_id}: the signing key needs a kid and alg ES256/RS256"
            )
        self._http = http
        self._discovery = discovery
        self._credentials = credentials
        self._clock = clock
        self._margin = refresh_margin_seconds
        self._key = jwt.PyJWK(dict(credentials.private_jwk), algorithm=str(alg)).key
        self._alg = str(alg)
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"TokenClient(client_id={self._credentials.client_id!r})"

    @property
    def client_id(self) -> str:
        """The OAuth client id this client authenticates as."""
        return self._credentials.client_id

    async def token(self) -> str:
        """A current access token, from the cache or freshly requested."""
        if self._token is not None and self._clock() < self._renew_at:
            return self._token
        async with self._lock:
            # Another caller may have refreshed while this one waited for the lock.
            if self._token is None or self._clock() >= self._renew_at:
                await self._refresh()
            assert self._token is not None
            return self._token

    def cached(self) -> str | None:
        """The cached access token while it is current; ``None`` when :meth:`token` would
        have to ask the issuer."""
        if self._token is not None and self._clock() < self._renew_at:
            return self._token
        return None

    def invalidate(self) -> None:
        """Forget the cached token (after a product's 401), so the next call fetches one."""
        self._token = None
        self._renew_at = 0.0

    def client_assertion(self, token_endpoint: str) -> str:
        """A fresh RFC 7523 client assertion for ``token_endpoint`` (or for the issuer,
        when the credentials say so)."""
        now = int(self._clock())
        audience = (
            self._discovery.issuer
            if self._credentials.assertion_audience == "issuer"
            else token_endpoint
        )
        claims = {
            "iss": self._credentials.client_id,
            "sub": self._credentials.client_id,
            "aud": audience,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME_SECONDS,
            "jti": secrets.token_urlsafe(24),
        }
        return jwt.encode(
            claims,
            self._key,
            algorithm=self._alg,
            headers={"kid": str(self._credentials.private_jwk["kid"])},
        )

    async def _refresh(self) -> None:
        endpoint = await self._discovery.token_endpoint()
        form = {
            "grant_type": "client_credentials",
            "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": self.client_assertion(endpoint),
            "scope": " ".join(self._credentials.scopes),
            "resource": self._credentials.audience,
        }
        asked_at = self._clock()
        who = f"client {self._credentials.client_id} at issuer {self._discovery.issuer}"
        try:
            answer = await self._http.exchange(
                "POST",
                endpoint,
                headers=_FORM,
                body=urllib.parse.urlencode(form).encode("ascii"),
                timeout=ISSUER_TIMEOUT_SECONDS,
            )
        except ExchangeFailure as exc:
            raise TokenUnavailable(
                f"{who}: token endpoint unreachable ({exc.cause})",
                retryable=True,
                cause=exc.cause,
            ) from None
        if answer.status != 200:
            retryable = answer.status == 429 or answer.status >= 500
            error = _error_code(answer)
            raise TokenUnavailable(
                f"{who}: token request refused ({answer.status} {error})",
                retryable=retryable,
                error=None if retryable else error,
            )
        try:
            body = json.loads(answer.body)
            token = body["access_token"]
            token_type = body.get("token_type", "")
            expires_in = body.get("expires_in", DEFAULT_EXPIRES_IN)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TokenUnavailable(f"{who}: token answer is malformed", retryable=False) from exc
        valid_type = isinstance(token_type, str) and token_type.lower() == "bearer"
        valid_lifetime = isinstance(expires_in, int | float) and not isinstance(expires_in, bool)
        if not isinstance(token, str) or not token or not valid_type or not valid_lifetime:
            raise TokenUnavailable(f"{who}: token answer is malformed", retryable=False)
        if not token.isascii() or not token.isprintable():
            # It would go out in a header: a line break there would forge another one.
            raise TokenUnavailable(f"{who}: token answer is malformed", retryable=False)
        granted = body.get("scope")
        if granted is not None:
            # RFC 6749 §5.1: the issuer names the scopes when they differ from those asked.
            narrowed = not isinstance(granted, str) or not set(self._credentials.scopes) <= set(
                granted.split()
            )
            if narrowed:
                raise TokenUnavailable(
                    f"{who}: the token grants fewer scopes than the connection's scopes",
                    retryable=False,
                    error=SCOPE_NARROWED,
                )
        # Renew a margin before expiry, but never sooner than half-way through a short token.
        lifetime = max(float(expires_in), 0.0)
        self._token = token
        self._renew_at = asked_at + lifetime - min(self._margin, lifetime / 2)


def _error_code(answer: Answer) -> str:
    try:
        error = json.loads(answer.body).get("error")
    except (ValueError, AttributeError):
        return UNRECOGNISED
    return error if error in OAUTH_ERRORS else UNRECOGNISED


def credentials_for(
    connection: Connection,
    private_jwk: Mapping[str, Any],
    assertion_audience: str = "token-endpoint",
) -> ClientCredentials:
    """Credentials of a runtime-file connection, given its private JWK (read by the caller)
    and the deployment's ``clientAssertionAudience``."""
    return ClientCredentials(
        client_id=connection.authorization.client_id,
        private_jwk=dict(private_jwk),
        scopes=tuple(connection.authorization.scopes),
        audience=connection.token_audience,
        assertion_audience=assertion_audience,
    )
