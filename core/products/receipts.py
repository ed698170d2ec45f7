"""Reading a product's receipt of one command key, for reconcile (CONTRACT §10.1, §14).

Messaging and Scheduling answer ``GET <baseUrl>/v1/profiles/{profile}/receipts/{key}``. The
read goes out with the connection's own access token, outside any database transaction, and
its answer is sorted into one of four kinds:

- ``found``: 200 with a JSON object — the product processed the command; the body is what a
  live answer would have carried and is mapped like one.
- ``not-seen``: 404 whose problem code is ``receipt.not-found`` — the product never received
  the key and can say so within its receipt window. A bare 404 (a proxy, a wrong route) is
  no such proof and counts as ``unavailable``.
- ``expired``: 410 — the receipt is older than the window. That proves nothing either way.
- ``unavailable``: anything else, including no answer at all and no token. Its reason names
  why in a word: a product or issuer that failed TLS verification reads ``tls-refused``, so
  what reconcile logs tells an untrusted endpoint from one that is merely away. Nothing
  else changes for it: the step being reconciled keeps its own cause (why its effect is
  unknown), and its run is held with attention already.

A 401 first gets one more read with a fresh token, as a command does: the product may only
have judged a stale token. Nothing here logs or raises with a token, a body or a value;
``reason`` names the status, problem code or failure class only.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from core.canonical import parse_json
from core.errors import CoordinatorError
from core.products.http import ExchangeFailure, Exchanger
from core.products.token_client import TokenUnavailable
from core.workflow.catalogue import Operation, fill_path

FOUND: Final = "found"
NOT_SEEN: Final = "not-seen"
EXPIRED: Final = "expired"
UNAVAILABLE: Final = "unavailable"

NOT_FOUND_CODE: Final = "receipt.not-found"
_CODE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


class TokenSource(Protocol):
    """Where access tokens come from (:class:`core.products.tokens.ConnectionTokens`)."""

    async def token(self, connection: str) -> str:
        """A current access token for ``connection``."""
        ...

    def invalidate(self, connection: str) -> None:
        """Forget ``connection``'s cached token."""
        ...


@dataclass(frozen=True)
class Receipt:
    """What a receipt read learnt."""

    kind: str
    """found, not-seen, expired or unavailable."""
    reason: str
    """A short, value-free description for logs (``404 receipt.not-found``)."""
    status: int | None = None
    """The HTTP status, when there was an answer."""
    body: dict[str, Any] | None = field(default=None, repr=False)
    """The receipt of a ``found`` read; never logged."""


def receipt_url(base_url: str, op: Operation, profile: str, key: str) -> str:
    """The receipt route of ``key`` under the run's recorded base URL.

    ``ValueError`` when the operation keeps no receipts or a value is not one path segment.
    """
    if op.receipt_path is None:
        raise ValueError(f"{op.name} has no receipts")
    return base_url.rstrip("/") + fill_path(op.receipt_path, {"profile": profile, "key": key})


def _json(body: bytes) -> Any:
    try:
        return parse_json(body)
    except (UnicodeDecodeError, ValueError):
        return None


def _problem_code(body: bytes) -> str | None:
    document = _json(body)
    code = document.get("code") if isinstance(document, dict) else None
    return code if isinstance(code, str) and _CODE.fullmatch(code) else None


def classify_receipt(status: int, body: bytes) -> Receipt:
    """Sort one HTTP answer to a receipt read."""
    if status == 200:
        document = _json(body)
        if isinstance(document, dict):
            return Receipt(FOUND, "200", status, document)
        return Receipt(UNAVAILABLE, "200 with a body that is not a JSON object", status)
    code = _problem_code(body)
    described = f"{status} {code}" if code else str(status)
    if status == 404 and code == NOT_FOUND_CODE:
        return Receipt(NOT_SEEN, described, status)
    if status == 410:
        return Receipt(EXPIRED, described, status)
    return Receipt(UNAVAILABLE, described, status)


async def _get(
    http: Exchanger, url: str, token: str, timeout: float, tls: ssl.SSLContext | None
) -> Receipt:
    try:
        answer = await http.exchange(
            "GET",
            url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            tls=tls,
        )
    except ExchangeFailure as exc:
        return Receipt(UNAVAILABLE, f"no answer ({exc.cause})")
    return classify_receipt(answer.status, answer.body)


async def _token(tokens: TokenSource, connection: str, failed: str) -> str | Receipt:
    """The connection's access token, or the unavailable receipt saying ``failed`` and, when
    the issuer could not be reached, why (``tls-refused``, ``never-connected``...)."""
    try:
        return await tokens.token(connection)
    except TokenUnavailable as exc:
        return Receipt(UNAVAILABLE, failed if exc.cause is None else f"{failed} ({exc.cause})")
    except CoordinatorError:
        return Receipt(UNAVAILABLE, failed)


async def read_receipt(
    http: Exchanger,
    tokens: TokenSource,
    connection: str,
    url: str,
    *,
    timeout: float,
    tls: ssl.SSLContext | None = None,
) -> Receipt:
    """Read the receipt at ``url`` as ``connection``'s client; never raises for the answer."""
    token = await _token(tokens, connection, "no access token for the connection")
    if isinstance(token, Receipt):
        return token
    receipt = await _get(http, url, token, timeout, tls)
    if receipt.status == 401:
        tokens.invalidate(connection)
        fresh = await _token(tokens, connection, "401, and no fresh access token")
        if isinstance(fresh, Receipt):
            return fresh
        receipt = await _get(http, url, fresh, timeout, tls)
    return receipt


__all__ = [
    "EXPIRED",
    "FOUND",
    "NOT_SEEN",
    "UNAVAILABLE",
    "Receipt",
    "TokenSource",
    "classify_receipt",
    "read_receipt",
    "receipt_url",
]
