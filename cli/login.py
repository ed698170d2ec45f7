"""``coordinatorctl login``: an access token for the API from the deployment's issuer.

Two ways in, both found through the issuer's OpenID discovery document:

- **A person** (the default): the OAuth device authorization grant (RFC 8628) as a public
  client. The command prints the verification URL and the user code, the person signs in on
  the issuer's own pages in any browser, and the command polls the token endpoint at the
  interval the issuer asks for (5 s when it names none, 5 s more after each ``slow_down``)
  until the code expires. A refresh token, when the issuer issues one, is kept beside the
  token file (``<token file>.refresh``); the next ``login`` spends it first and falls back
  to the device flow when the issuer no longer takes it (``--device`` skips it).
- **Automation**: the client credentials grant, the client authenticating with
  ``private_key_jwt`` (RFC 7523) with a private JWK from a file only its owner may read. The
  assertion's ``aud`` is the token endpoint, or the issuer identifier when the deployment's
  ``clientAssertionAudience`` is ``issuer``.

Every request asks for the API's audience as the RFC 8707 ``resource``. Before anything is
written, the access token is checked for the shape the API accepts (CONTRACT §8.1: a JWT
whose header ``typ`` is ``at+jwt``, ``iss`` the issuer, ``aud`` holding the audience, ``sub``
and ``client_id`` present): a token the API would refuse is refused here, naming what is
wrong, so an issuer configured for another token shape shows at login and not as a bare 401
later. The signature is not checked here; the gateway does that.

Files are written as the API commands read them: the token and a newline, mode 0600, owned
by the caller, replaced atomically (a new file in the same folder, then a rename), so a
command reading the token file never sees half a token.

Nothing here prints or raises with a token, a code verifier, an assertion or a key: errors
name the issuer, the client id and the OAuth error code.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt

from cli.api import client_tls, read_token_file
from core.codes import Code
from core.config.reader import is_loopback_host
from core.errors import CoordinatorError
from core.products.token_client import OAUTH_ERRORS
from core.secrets import SecretError, SecretRef, SecretResolver

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
DEFAULT_SCOPE = "openid offline_access"
"""What a person's login asks for: ``offline_access`` is how most issuers are asked for a
refresh token; ``openid`` is required by some before they run the device flow at all."""
DEFAULT_INTERVAL_SECONDS = 5
"""RFC 8628 §3.2: the polling interval when the issuer names none."""
SLOW_DOWN_SECONDS = 5
"""RFC 8628 §3.5: added to the interval after each ``slow_down``."""
ASSERTION_LIFETIME_SECONDS = 60
TIMEOUT_SECONDS = 15.0
REFRESH_SUFFIX = ".refresh"
_FORM = {"Accept": "application/json"}
# OAuth error codes safe to repeat: the token endpoint's, and the device grant's (RFC 8628 §3.5).
_KNOWN_ERRORS = OAUTH_ERRORS | {
    "access_denied",
    "expired_token",
    "authorization_pending",
    "slow_down",
}

Sleep = Callable[[float], None]
Clock = Callable[[], float]
Say = Callable[[str], None]


def refused(detail: str) -> CoordinatorError:
    """A login refusal (``coordinator.auth.login-refused``)."""
    return CoordinatorError(Code.AUTH_LOGIN_REFUSED, detail)


def refresh_file(token_file: Path) -> Path:
    """Where the refresh token of ``token_file`` is kept."""
    return token_file.with_name(token_file.name + REFRESH_SUFFIX)


def check_url(value: str, what: str) -> str:
    """An https:// URL, or http:// to a loopback host (as the runtime file allows)."""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise refused(f"{what} must be an https:// URL")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise refused(f"{what} must be https:// (http:// is allowed only to a loopback host)")
    return value


# ------------------------------------------------------------------------------ discovery


@dataclass(frozen=True)
class Issuer:
    """What discovery says about the issuer."""

    issuer: str
    token_endpoint: str
    device_authorization_endpoint: str | None


def discover(http: httpx.Client, issuer: str) -> Issuer:
    """Read ``<issuer>/.well-known/openid-configuration``; it must name ``issuer`` exactly
    (the API compares ``iss`` with it exactly, so a token from any other name is refused)."""
    check_url(issuer, "the issuer")
    document = _get_json(http, issuer.rstrip("/") + "/.well-known/openid-configuration", issuer)
    named = document.get("issuer")
    if named != issuer:
        raise refused(
            f"the discovery document of {issuer} names the issuer {named!r}: set "
            "deployment.authentication.issuer (or --issuer) to exactly that"
        )
    token_endpoint = document.get("token_endpoint")
    if not isinstance(token_endpoint, str):
        raise refused(f"the discovery document of {issuer} names no token_endpoint")
    device = document.get("device_authorization_endpoint")
    return Issuer(
        issuer=issuer,
        token_endpoint=check_url(token_endpoint, "the token endpoint"),
        device_authorization_endpoint=(
            check_url(device, "the device authorization endpoint")
            if isinstance(device, str)
            else None
        ),
    )


def _get_json(http: httpx.Client, url: str, issuer: str) -> dict[str, Any]:
    try:
        answer = http.get(url, headers={"Accept": "application/json"})
    except httpx.HTTPError:
        raise refused(f"cannot reach the issuer at {issuer}") from None
    if answer.status_code != 200:
        raise refused(f"the issuer at {issuer} answered discovery with HTTP {answer.status_code}")
    try:
        document = answer.json()
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise refused(f"the discovery document of {issuer} is not a JSON object")
    return document


# ------------------------------------------------------------------------------ the grants


@dataclass(frozen=True)
class Tokens:
    """A token answer. ``repr`` shows neither token."""

    access_token: str
    refresh_token: str | None
    grant: str

    def __repr__(self) -> str:
        return f"Tokens(grant={self.grant!r}, refresh={self.refresh_token is not None})"


class OAuthRefusal(Exception):
    """The token or device endpoint answered an OAuth error (``error`` is a known code, or
    ``unrecognised``)."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(f"{status} {error}")
        self.status = status
        self.error = error


def _post(http: httpx.Client, url: str, form: Mapping[str, str], issuer: str) -> dict[str, Any]:
    try:
        answer = http.post(url, data=dict(form), headers=_FORM)
    except httpx.HTTPError:
        raise refused(f"cannot reach the issuer at {issuer}") from None
    try:
        document = answer.json()
    except ValueError:
        document = None
    if answer.status_code == 200 and isinstance(document, dict):
        return document
    error = document.get("error") if isinstance(document, dict) else None
    raise OAuthRefusal(answer.status_code, error if error in _KNOWN_ERRORS else "unrecognised")


def _tokens(document: Mapping[str, Any], grant: str, issuer: str) -> Tokens:
    access = document.get("access_token")
    token_type = document.get("token_type")
    if not isinstance(access, str) or not access:
        raise refused(f"the issuer at {issuer} answered without an access token")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise refused(f"the issuer at {issuer} answered a token that is not a bearer token")
    refresh = document.get("refresh_token")
    return Tokens(access, refresh if isinstance(refresh, str) and refresh else None, grant)


@dataclass(frozen=True)
class DeviceLogin:
    """One device flow: the endpoints, who asks, and how the wait is measured."""

    issuer: Issuer
    client_id: str
    audience: str
    scope: str = DEFAULT_SCOPE
    clock: Clock = time.monotonic
    sleep: Sleep = time.sleep

    def run(self, http: httpx.Client, say: Say) -> Tokens:
        """Ask for a code, tell the person where to enter it, and poll until they did."""
        endpoint = self.issuer.device_authorization_endpoint
        who = f"client {self.client_id} at {self.issuer.issuer}"
        if endpoint is None:
            raise refused(
                f"the issuer at {self.issuer.issuer} offers no device authorization endpoint: "
                "enable the device grant there, or use --private-key-file"
            )
        form = {"client_id": self.client_id, "scope": self.scope, "resource": self.audience}
        try:
            start = _post(http, endpoint, form, self.issuer.issuer)
        except OAuthRefusal as refusal:
            raise refused(f"{who}: device authorization refused ({refusal})") from None
        device_code = start.get("device_code")
        user_code = start.get("user_code")
        verification = start.get("verification_uri")
        if not all(isinstance(v, str) and v for v in (device_code, user_code, verification)):
            raise refused(f"{who}: the device authorization answer is incomplete")
        assert isinstance(device_code, str)
        complete = start.get("verification_uri_complete")
        expires_in = _seconds(start.get("expires_in"), 600)
        interval = _seconds(start.get("interval"), DEFAULT_INTERVAL_SECONDS)
        say(f"To sign in, open {verification} and enter the code {user_code}")
        if isinstance(complete, str) and complete:
            say(f"(or open {complete})")
        say(f"Waiting for the sign-in; the code expires in {expires_in} s.")
        deadline = self.clock() + expires_in
        poll = {
            "grant_type": DEVICE_CODE_GRANT,
            "device_code": device_code,
            "client_id": self.client_id,
            "resource": self.audience,
        }
        while True:
            self.sleep(interval)
            try:
                return _tokens(
                    _post(http, self.issuer.token_endpoint, poll, self.issuer.issuer),
                    "device_code",
                    self.issuer.issuer,
                )
            except OAuthRefusal as refusal:
                if refusal.error == "authorization_pending":
                    pass
                elif refusal.error == "slow_down":
                    interval += SLOW_DOWN_SECONDS
                elif refusal.error == "access_denied":
                    raise refused(f"{who}: the sign-in was declined") from None
                elif refusal.error == "expired_token":
                    raise refused(
                        f"{who}: the code expired before the sign-in; log in again"
                    ) from None
                else:
                    raise refused(f"{who}: token request refused ({refusal})") from None
            if self.clock() + interval > deadline:
                raise refused(f"{who}: the code expired before the sign-in; log in again")


def _seconds(value: object, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 86_400:
        return value
    return default


def refresh(
    http: httpx.Client, issuer: Issuer, client_id: str, audience: str, refresh_token: str
) -> Tokens | None:
    """Spend a refresh token; ``None`` when the issuer no longer takes it."""
    form = {
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "client_id": client_id,
        "resource": audience,
    }
    try:
        document = _post(http, issuer.token_endpoint, form, issuer.issuer)
    except OAuthRefusal as refusal:
        if refusal.error in ("invalid_grant", "invalid_request", "invalid_target"):
            return None
        raise refused(
            f"client {client_id} at {issuer.issuer}: refresh refused ({refusal})"
        ) from None
    tokens = _tokens(document, "refresh_token", issuer.issuer)
    # An issuer that does not rotate refresh tokens keeps the old one valid.
    return (
        tokens if tokens.refresh_token else Tokens(tokens.access_token, refresh_token, tokens.grant)
    )


def read_private_jwk(path: Path) -> dict[str, Any]:
    """A private JWK (RS256 or ES256, with ``kid``) from a regular file of the caller's own,
    mode 0600 or stricter, not a symbolic link (the secret files' rules, CONTRACT §7)."""
    resolver = SecretResolver(file_root=path.parent, environment=False)
    try:
        return resolver.read_jwk(SecretRef("file", path.name))
    except SecretError as error:
        raise CoordinatorError(error.code, f"{path}: {error.reason}") from None


def client_assertion(jwk: Mapping[str, Any], client_id: str, audience: str, now: float) -> str:
    """An RFC 7523 client assertion signed with ``jwk``."""
    issued = int(now)
    claims = {
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": issued,
        "exp": issued + ASSERTION_LIFETIME_SECONDS,
        "jti": secrets.token_urlsafe(24),
    }
    key = jwt.PyJWK(dict(jwk), algorithm=str(jwk["alg"])).key
    return jwt.encode(claims, key, algorithm=str(jwk["alg"]), headers={"kid": str(jwk["kid"])})


def client_credentials(
    http: httpx.Client,
    issuer: Issuer,
    client_id: str,
    audience: str,
    jwk: Mapping[str, Any],
    *,
    assertion_audience: str = "token-endpoint",
    scope: str | None = None,
) -> Tokens:
    """The client credentials grant with ``private_key_jwt``."""
    target = issuer.issuer if assertion_audience == "issuer" else issuer.token_endpoint
    form = {
        "grant_type": "client_credentials",
        "client_assertion_type": ASSERTION_TYPE,
        "client_assertion": client_assertion(jwk, client_id, target, time.time()),
        "resource": audience,
    }
    if scope:
        form["scope"] = scope
    try:
        document = _post(http, issuer.token_endpoint, form, issuer.issuer)
    except OAuthRefusal as refusal:
        raise refused(
            f"client {client_id} at {issuer.issuer}: token request refused ({refusal})"
        ) from None
    return _tokens(document, "client_credentials", issuer.issuer)


# ------------------------------------------------------------------------------ the token


@dataclass(frozen=True)
class TokenFacts:
    """What the access token says about itself (read, not verified)."""

    client_id: str
    subject: str
    expires_at: int | None


def token_facts(
    token: str, issuer: str, audience: str, algorithms: tuple[str, ...] = ()
) -> TokenFacts:
    """Refuse a token the API would refuse for its shape (CONTRACT §8.1), or for an ``alg``
    outside ``algorithms`` when the deployment's allow-list is known; say what it is."""
    parts = token.split(".")
    if len(parts) != 3:
        raise refused(
            "the issuer's access token is not a JWT (an opaque token): configure the issuer "
            "to issue JWT access tokens for the audience (see docs/issuers.md)"
        )
    header, claims = _segment(parts[0]), _segment(parts[1])
    typ = header.get("typ")
    if not isinstance(typ, str) or typ.lower() not in ("at+jwt", "application/at+jwt"):
        raise refused(
            f"the issuer's access token has header typ {typ!r}; the API needs 'at+jwt' "
            "(RFC 9068, see docs/issuers.md)"
        )
    if algorithms and header.get("alg") not in algorithms:
        raise refused(
            f"the issuer's access token is signed with {header.get('alg')!r}, which "
            f"deployment.authentication.algorithms does not allow ({', '.join(algorithms)})"
        )
    if claims.get("iss") != issuer:
        raise refused(f"the issuer's access token names iss {claims.get('iss')!r}, not {issuer!r}")
    aud = claims.get("aud")
    audiences = aud if isinstance(aud, list) else [aud]
    if audience not in audiences:
        raise refused(
            f"the issuer's access token is not for the audience {audience!r} (its aud: "
            f"{aud!r}); configure an audience for it at the issuer"
        )
    missing = [name for name in ("sub", "client_id") if not isinstance(claims.get(name), str)]
    if missing:
        raise refused(
            f"the issuer's access token has no {' and no '.join(missing)} claim; the API "
            "needs both (see docs/issuers.md)"
        )
    exp = claims.get("exp")
    return TokenFacts(
        client_id=str(claims["client_id"]),
        subject=str(claims["sub"]),
        expires_at=exp if isinstance(exp, int) and not isinstance(exp, bool) else None,
    )


def _segment(text: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError):
        value = None
    if not isinstance(value, dict):
        raise refused("the issuer's access token is not a readable JWT")
    return value


def expiry_text(expires_at: int | None) -> str | None:
    """An RFC 3339 instant, or ``None``."""
    if expires_at is None:
        return None
    return datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------ the files


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` and a newline, mode 0600."""
    folder = path.parent
    temporary = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        descriptor = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise CoordinatorError(
            Code.AUTH_TOKEN_FILE, f"{path}: cannot write beside it ({exc.strerror})"
        ) from None
    try:
        try:
            os.fchmod(descriptor, 0o600)
            os.write(descriptor, (text + "\n").encode("ascii"))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise CoordinatorError(
            Code.AUTH_TOKEN_FILE, f"{path}: cannot be written ({exc.strerror})"
        ) from None
    with contextlib.suppress(OSError):
        directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def store(token_file: Path, tokens: Tokens) -> Path | None:
    """Write the access token (and the refresh token, or remove a stale one); return the
    refresh token's file when one was written."""
    write_private(token_file, tokens.access_token)
    kept = refresh_file(token_file)
    if tokens.refresh_token is None:
        with contextlib.suppress(FileNotFoundError):
            kept.unlink()
        return None
    write_private(kept, tokens.refresh_token)
    return kept


def stored_refresh_token(token_file: Path) -> str | None:
    """The kept refresh token, if there is one (read by the access token file's rules)."""
    kept = refresh_file(token_file)
    if not kept.exists():
        return None
    return read_token_file(kept)


def http_client() -> httpx.Client:
    """The client for the issuer: the same trust roots as the API commands', no proxy from
    the environment (see :func:`cli.api.client_tls`), no redirects followed."""
    return httpx.Client(timeout=TIMEOUT_SECONDS, trust_env=False, verify=client_tls())
