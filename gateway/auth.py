"""Verification of callers' RFC 9068 access tokens (CONTRACT §8.1).

The order of the checks is chosen so an attacker's input costs little and teaches nothing:

1. the token is at most :data:`MAX_TOKEN_BYTES` long and has three non-empty base64url
   segments — before anything is decoded;
2. the protected header: ``typ`` is ``at+jwt`` (any case, with or without ``application/``),
   ``alg`` is in the configured allow-list (asymmetric only: ``none`` and ``HS*`` can never
   be configured), ``kid`` names a key, and no ``crit`` extension is asked for;
3. the signature, with the issuer's key of that ``kid`` and exactly the header's algorithm.
   Keys come only from the configured JWKS (``jwksUrl`` or ``jwksRef``): ``jku``, ``x5u``,
   ``jwk`` and ``x5c`` headers are never read, so a token cannot point at its own key;
4. the claims: ``iss`` equal to the issuer, ``aud`` containing the audience, ``exp``/``iat``
   (and ``nbf`` when present) numbers a double holds, within the clock skew, ``sub`` and
   ``client_id`` present as text that UTF-8 can encode.

Every refusal is one :class:`AuthenticationRefused` with the same generic detail; the
``reason`` attribute says which rule failed, for the server's own log and for tests, and
never contains token material. When no key set was ever obtained the verifier raises
``service.unavailable`` instead: the token might be fine, the service cannot tell.

Key set cache: fetched on first use, refetched when a token names an unknown ``kid`` (at
most once per :data:`JWKS_REFRESH_SECONDS`) and when the cached set is older than
``max_age_seconds``. A failed refetch keeps the keys already held.

The issuer never holds a request longer than one fetch's deadline
(:data:`JWKS_FETCH_DEADLINE_SECONDS`, connecting and the whole body). At most one fetch runs
at a time, as a task of its own; a request joins it rather than starting another. A token
whose ``kid`` is held is verified with the keys held and never waits for a fetch, so an
issuer that answers a byte at a time slows nobody whose key is known. A token that needs
the fetch (no key set yet, or an unknown ``kid``) waits for it, at most that deadline; if the
fetch failed the verifier cannot tell whether the issuer has just published that key, and
answers ``service.unavailable`` rather than a refusal.

Verified tokens: a token whose signature verified is remembered (up to
:data:`VERIFIED_CACHE_SIZE`, the oldest dropped first) with the key that verified it, so the
same token sent again skips the header parse and the signature check — but only while that
key is still the issuer's current one, and its claims (``exp``, ``nbf``, ``iat``, issuer,
audience) are checked again on every use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import httpx
import jwt
from jwt.api_jws import PyJWS

from core.codes import Code
from core.errors import CoordinatorError
from core.secrets import SecretError

if TYPE_CHECKING:
    from core.config.model import Authentication
    from core.secrets import SecretResolver

WWW_AUTHENTICATE: Final = 'Bearer error="invalid_token"'
"""The ``WWW-Authenticate`` value of every 401 the gateway answers for a token."""

MAX_TOKEN_BYTES: Final = 8 * 1024
MAX_JWKS_BYTES: Final = 256 * 1024
JWKS_REFRESH_SECONDS: Final = 60.0
JWKS_FETCH_DEADLINE_SECONDS: Final = 10.0
"""How long one fetch of the issuer's key set may take, from connecting to the last byte of
the body; the longest a request ever waits for the issuer.

A healthy issuer answers its JWKS (at most :data:`MAX_JWKS_BYTES`) in well under a second;
ten seconds leaves room for a slow network and still ends a trickling answer before callers'
own timeouts do, so they see a prompt 503 they can retry rather than a hung connection."""
JWKS_MAX_AGE_SECONDS: Final = 3600.0
UNAVAILABLE_RETRY_SECONDS: Final = 5.0
VERIFIED_CACHE_SIZE: Final = 4096

SUPPORTED_ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
"""Asymmetric JWS algorithms a deployment may allow; ``none`` and ``HS*`` are not among them."""

_KEY_TYPES: Final = frozenset({"RSA", "EC", "OKP"})
_COMPACT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_GENERIC_DETAIL: Final = "the access token is missing or not acceptable"

log = logging.getLogger("coordinator.gateway")


class AuthenticationRefused(CoordinatorError):
    """401 ``authentication.refused``; ``reason`` is for logs only, never for the caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(Code.AUTHENTICATION_REFUSED, _GENERIC_DETAIL)
        self.reason = reason


class VerifierUnavailable(CoordinatorError):
    """503 ``service.unavailable``: the issuer's keys could not be obtained."""

    def __init__(self) -> None:
        super().__init__(Code.SERVICE_UNAVAILABLE, "the access token verifier has no issuer keys")


class JwksUnavailable(Exception):
    """A key set could not be fetched or was not a usable JWKS document."""


@dataclass(frozen=True)
class VerifiedToken:
    """The facts the gateway uses from a verified access token."""

    iss: str
    """The issuer, equal to the configured one."""
    sub: str
    """The subject; with ``iss`` the principal a run belongs to."""
    client_id: str
    """The OAuth client; policies are keyed by it."""
    scopes: tuple[str, ...]
    """The ``scope`` claim split on spaces (empty when absent)."""
    audiences: tuple[str, ...]
    """Every ``aud`` value."""
    expires_at: float
    """``exp`` in seconds since the epoch."""
    jti: str | None
    """The token id, when the issuer sets one."""

    @property
    def principal(self) -> tuple[str, str]:
        """``(iss, sub)``."""
        return (self.iss, self.sub)


class JwksSource(Protocol):
    """Where the issuer's public keys come from."""

    async def fetch(self) -> Mapping[str, Any]:
        """The current JWKS document; raise :class:`JwksUnavailable` when it cannot be had."""
        ...


def issuer_client(timeout_seconds: float) -> httpx.AsyncClient:
    """The gateway's HTTP client for the issuer's JWKS (``timeout_seconds`` for each phase).

    Proxy settings in the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, in
    either case) are ignored, as by every outbound client (CONTRACT §9.3): a proxy on the
    path could answer with keys of its own. The roots a TLS issuer must chain to are still
    the ones named by ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` when set, else certifi's bundle:
    that is how an operator trusts an issuer's private CA, and it names no other host.
    Redirects are not followed.
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_seconds),
        follow_redirects=False,
        trust_env=False,
        verify=httpx.create_ssl_context(trust_env=True),
    )


class HttpJwksSource:
    """A JWKS fetched from ``jwksUrl`` with the caller's :class:`httpx.AsyncClient`
    (:func:`issuer_client` in the gateway).

    Redirects are not followed and the body is read as a stream that stops at
    :data:`MAX_JWKS_BYTES`. The whole fetch is bounded by the verifier's deadline.
    """

    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self.url = url
        self._client = client

    async def fetch(self) -> Mapping[str, Any]:
        try:
            async with self._client.stream(
                "GET",
                self.url,
                headers={
                    "Accept": "application/jwk-set+json, application/json",
                    # A key set is a few kilobytes: asked for as it is, so that a
                    # small compressed answer cannot inflate past the cap before it is counted
                    # (one that comes compressed all the same is refused below).
                    "Accept-Encoding": "identity",
                },
                follow_redirects=False,
            ) as response:
                if response.status_code != 200:
                    raise JwksUnavailable(f"JWKS answered HTTP {response.status_code}")
                encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise JwksUnavailable("JWKS answered compressed, though asked for identity")
                body = bytearray()
                async for chunk in response.aiter_bytes():  # identity: as sent
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise JwksUnavailable("JWKS document is too large")
        except httpx.HTTPError as exc:
            raise JwksUnavailable(f"JWKS fetch failed: {exc.__class__.__name__}") from None
        return _json_object(bytes(body))


class StaticJwksSource:
    """A JWKS document given locally (``signingKeys.jwksRef``)."""

    def __init__(self, document: str | bytes | Mapping[str, Any]) -> None:
        if isinstance(document, str | bytes):
            document = _json_object(document)
        _parse_jwks(document)  # refuse an unusable document now, not at the first request
        self._document = dict(document)

    async def fetch(self) -> Mapping[str, Any]:
        return self._document


def jwks_source_for(
    authentication: Authentication, resolver: SecretResolver, client: httpx.AsyncClient
) -> JwksSource:
    """The key source the runtime file names: the ``jwksRef`` content or ``jwksUrl``."""
    keys = authentication.signing_keys
    if keys.jwks_ref is not None:
        text = resolver.read_text(keys.jwks_ref, max_len=MAX_JWKS_BYTES)
        try:
            return StaticJwksSource(text)
        except JwksUnavailable as exc:
            raise SecretError(
                Code.SECRET_MALFORMED, keys.jwks_ref, f"not a usable JWKS document ({exc})"
            ) from None
    if keys.jwks_url is None:
        raise ValueError("signingKeys names neither jwksUrl nor jwksRef")
    return HttpJwksSource(keys.jwks_url, client)


def _json_object(data: str | bytes) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError:
        raise JwksUnavailable("JWKS is not JSON") from None
    if not isinstance(document, dict):
        raise JwksUnavailable("JWKS is not a JSON object")
    return document


def _parse_jwks(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Public signing keys by ``kid``; keys without a kid, private or symmetric are skipped."""
    entries = document.get("keys")
    if not isinstance(entries, list):
        raise JwksUnavailable("JWKS has no keys list")
    keys: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid or kid in keys:
            continue  # a repeated kid keeps its first key: no ambiguity about which one signs
        if entry.get("kty") not in _KEY_TYPES:
            continue  # symmetric ("oct") keys would turn a public value into an HMAC secret
        if "d" in entry or entry.get("use", "sig") != "sig":
            continue
        keys[kid] = dict(entry)
    return keys


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    if authorization is None or not authorization.strip():
        raise AuthenticationRefused("no bearer token")
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise AuthenticationRefused("not the bearer scheme")
    token = rest.strip(" ")
    if not token or " " in token:
        raise AuthenticationRefused("malformed bearer credentials")
    return token


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        # An integer of hundreds of digits: JSON has no limit, a double does.
        return None
    return number if math.isfinite(number) else None


def _encodable(text: str) -> bool:
    # ``sub`` and ``client_id`` travel to the components (protobuf, UTF-8) and into the
    # audit journal: a lone surrogate can be read from JSON but never written on.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _typ_is_access_token(typ: object) -> bool:
    if not isinstance(typ, str):
        return False
    value = typ.lower()
    value = value.removeprefix("application/")
    return value == "at+jwt"


class TokenVerifier:
    """Verifies access tokens for one issuer and audience.

    ``clock`` gives wall time in seconds since the epoch (for ``exp``/``iat``/``nbf``);
    ``monotonic`` paces key set refreshes. Both are injectable for tests, as is
    ``fetch_deadline_seconds`` (:data:`JWKS_FETCH_DEADLINE_SECONDS`), which the running event
    loop measures.
    """

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        algorithms: tuple[str, ...] | list[str],
        clock_skew_seconds: int,
        source: JwksSource,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        refresh_interval: float = JWKS_REFRESH_SECONDS,
        max_age_seconds: float = JWKS_MAX_AGE_SECONDS,
        unavailable_retry_seconds: float = UNAVAILABLE_RETRY_SECONDS,
        fetch_deadline_seconds: float = JWKS_FETCH_DEADLINE_SECONDS,
    ) -> None:
        unsupported = [alg for alg in algorithms if alg not in SUPPORTED_ALGORITHMS]
        if unsupported or not algorithms:
            raise ValueError("the allowed algorithms must be asymmetric JWS algorithms")
        self.issuer = issuer
        self.audience = audience
        self.algorithms = tuple(algorithms)
        self.skew = float(clock_skew_seconds)
        self._source = source
        self._clock = clock
        self._monotonic = monotonic
        self._refresh_interval = refresh_interval
        self._max_age = max_age_seconds
        self._unavailable_retry = unavailable_retry_seconds
        self._fetch_deadline = fetch_deadline_seconds
        self._keys: dict[str, dict[str, Any]] | None = None
        self._prepared: dict[tuple[str, str], jwt.PyJWK] = {}
        self._loaded_at = 0.0
        self._last_attempt: float | None = None
        self._last_failed = False
        # The one fetch that may be running, and the event loop time it must end by;
        # requests that need it join it.
        self._refreshing: asyncio.Task[None] | None = None
        self._refresh_ends = 0.0
        self._jws = PyJWS()
        # Tokens whose signature verified, with the key that did it and their claims: a
        # client sends the same token until it expires, and the signature check was most
        # of a request's verification cost. Only verified tokens enter it.
        self._verified: dict[str, tuple[str, str, jwt.PyJWK, dict[str, Any]]] = {}

    @classmethod
    def from_settings(
        cls, authentication: Authentication, source: JwksSource, **options: Any
    ) -> TokenVerifier:
        """A verifier for ``deployment.authentication``."""
        return cls(
            issuer=authentication.issuer,
            audience=authentication.audience,
            algorithms=authentication.algorithms,
            clock_skew_seconds=authentication.clock_skew_seconds,
            source=source,
            **options,
        )

    @property
    def ready(self) -> bool:
        """True once a key set is held (``/ready`` reports the verifier otherwise)."""
        return self._keys is not None

    async def refresh(self) -> bool:
        """Fetch the key set now (for startup), or join the fetch already running; True when
        a key set is held afterwards. Returns within the fetch deadline."""
        await self._wait(self._refresh_if(lambda now: True))
        return self.ready

    async def close(self) -> None:
        """Stop a fetch that is running (the gateway is stopping)."""
        running = self._refreshing
        if running is not None and not running.done():
            running.cancel()
            await asyncio.wait({running})

    async def verify_authorization(self, authorization: str | None) -> VerifiedToken:
        """Verify the token of an ``Authorization`` header value."""
        return await self.verify(bearer_token(authorization))

    async def verify(self, token: str) -> VerifiedToken:
        """Verify one compact JWS access token; see the module docstring for the rules."""
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationRefused("token too large")
        if not _COMPACT.fullmatch(token):
            raise AuthenticationRefused("not a compact JWS")
        known = self._verified.get(token)
        if known is not None:
            kid, alg, verified_with, claims = known
            # Only while the key that verified it is still the issuer's current one (a key
            # set reload prepares new key objects); the claims are checked again every time.
            if await self._key(kid, alg) is verified_with:
                return self._claims(claims)
            del self._verified[token]
        header = self._header(token)
        alg = header["alg"]
        kid = header["kid"]
        key = await self._key(kid, alg)
        try:
            decoded = self._jws.decode_complete(token, key=key, algorithms=[alg])
        except (jwt.PyJWTError, ValueError):
            raise AuthenticationRefused("signature does not verify") from None
        try:
            claims = json.loads(decoded["payload"])
        except (ValueError, RecursionError):
            # RecursionError: nested deeper than the reader goes.
            raise AuthenticationRefused("payload is not JSON") from None
        if not isinstance(claims, dict):
            raise AuthenticationRefused("payload is not a JSON object")
        verified = self._claims(claims)
        self._remember(token, (kid, alg, key, claims))
        return verified

    def _remember(self, token: str, entry: tuple[str, str, jwt.PyJWK, dict[str, Any]]) -> None:
        if len(self._verified) >= VERIFIED_CACHE_SIZE:
            del self._verified[next(iter(self._verified))]  # the oldest
        self._verified[token] = entry

    def _header(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthenticationRefused("header is not readable") from None
        if not _typ_is_access_token(header.get("typ")):
            raise AuthenticationRefused("typ is not at+jwt")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise AuthenticationRefused("alg is not allowed")
        if "crit" in header or "b64" in header:
            raise AuthenticationRefused("header asks for an unsupported extension")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise AuthenticationRefused("header names no kid")
        return header

    async def _key(self, kid: str, alg: str) -> jwt.PyJWK:
        settled = True
        if self._keys is None:
            settled = await self._wait(self._refresh_if(self._may_load))
        elif kid not in self._keys:
            settled = await self._wait(self._refresh_if(self._may_refetch))
        elif self._monotonic() - self._loaded_at >= self._max_age:
            # Not awaited: the keys held serve this token while the old set is refetched.
            self._refresh_if(self._may_refetch)
        if self._keys is None:
            raise VerifierUnavailable()
        jwk = self._keys.get(kid)
        if jwk is None:
            if self._last_failed or not settled:
                # The issuer could not be asked: it may have just published this key.
                raise VerifierUnavailable()
            raise AuthenticationRefused("kid is not among the issuer's keys")
        if jwk.get("alg", alg) != alg:
            raise AuthenticationRefused("key is for another algorithm")
        prepared = self._prepared.get((kid, alg))
        if prepared is None:
            try:
                prepared = jwt.PyJWK(jwk, algorithm=alg)
            except (jwt.PyJWTError, ValueError, KeyError, TypeError):
                raise AuthenticationRefused("key does not fit the algorithm") from None
            self._prepared[(kid, alg)] = prepared
        return prepared

    def _may_load(self, now: float) -> bool:
        if self._keys is not None:
            return False
        return self._last_attempt is None or now - self._last_attempt >= self._unavailable_retry

    def _may_refetch(self, now: float) -> bool:
        return self._last_attempt is None or now - self._last_attempt >= self._refresh_interval

    def _refresh_if(self, wanted: Callable[[float], bool]) -> asyncio.Task[None] | None:
        """The fetch running, else a new one when ``wanted(now)`` allows it, else None."""
        running = self._refreshing
        if running is not None and not running.done():
            return running
        now = self._monotonic()
        if not wanted(now):
            return None
        self._last_attempt = now
        self._refresh_ends = asyncio.get_running_loop().time() + self._fetch_deadline
        self._refreshing = asyncio.create_task(self._fetch(now), name="gateway-jwks-fetch")
        return self._refreshing

    async def _wait(self, fetch: asyncio.Task[None] | None) -> bool:
        """Wait for ``fetch`` until its deadline; False when it is still running then."""
        if fetch is None:
            return True
        # asyncio.wait, not the task itself: a request that gives up (its caller went away)
        # must not cancel the fetch other requests share. The fetch ends itself at the same
        # instant; this timeout also holds against a source that ignores cancellation.
        remaining = self._refresh_ends - asyncio.get_running_loop().time()
        await asyncio.wait({fetch}, timeout=max(remaining, 0.0))
        return fetch.done()

    async def _fetch(self, started: float) -> None:
        try:
            async with asyncio.timeout_at(self._refresh_ends):
                document = await self._source.fetch()
            keys = _parse_jwks(document)
        except TimeoutError:
            self._last_failed = True
            log.warning(
                "the issuer's signing keys were not fetched within %g s", self._fetch_deadline
            )
            return
        except JwksUnavailable as exc:
            self._last_failed = True
            log.warning("the issuer's signing keys could not be fetched: %s", exc)
            return
        except Exception as exc:
            # Nobody may be waiting for this task: say what failed (its type only, its
            # message could name the URL) rather than leave it to the garbage collector.
            self._last_failed = True
            log.error("fetching the issuer's signing keys failed: %s", type(exc).__name__)
            return
        self._keys = keys
        self._prepared = {}
        self._loaded_at = started
        self._last_failed = False

    def _claims(self, claims: dict[str, Any]) -> VerifiedToken:
        now = self._clock()
        if claims.get("iss") != self.issuer or not isinstance(claims.get("iss"), str):
            raise AuthenticationRefused("iss is not the issuer")
        audience = claims.get("aud")
        audiences = (audience,) if isinstance(audience, str) else audience
        if not isinstance(audiences, list | tuple) or not all(
            isinstance(item, str) for item in audiences
        ):
            raise AuthenticationRefused("aud is missing or malformed")
        if self.audience not in audiences:
            raise AuthenticationRefused("aud does not contain the audience")
        expires = _number(claims.get("exp"))
        if expires is None:
            raise AuthenticationRefused("exp is missing or malformed")
        if now >= expires + self.skew:
            raise AuthenticationRefused("token expired")
        issued = _number(claims.get("iat"))
        if issued is None:
            raise AuthenticationRefused("iat is missing or malformed")
        if issued > now + self.skew:
            raise AuthenticationRefused("iat is in the future")
        if "nbf" in claims:
            not_before = _number(claims["nbf"])
            if not_before is None:
                raise AuthenticationRefused("nbf is malformed")
            if not_before > now + self.skew:
                raise AuthenticationRefused("token not yet valid")
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise AuthenticationRefused("sub is missing")
        client_id = claims.get("client_id")
        if not isinstance(client_id, str) or not client_id:
            raise AuthenticationRefused("client_id is missing")
        if not _encodable(sub) or not _encodable(client_id):
            raise AuthenticationRefused("sub or client_id is not Unicode text")
        scope = claims.get("scope", "")
        if not isinstance(scope, str):
            raise AuthenticationRefused("scope is malformed")
        jti = claims.get("jti")
        return VerifiedToken(
            iss=self.issuer,
            sub=sub,
            client_id=client_id,
            scopes=tuple(scope.split()),
            audiences=tuple(audiences),
            expires_at=expires,
            jti=jti if isinstance(jti, str) else None,
        )
