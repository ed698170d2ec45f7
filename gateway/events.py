"""``POST /v1/events``: signed events that start runs (CONTRACT §9.6).

The body is a CloudEvents JSON document, ``{"specversion": "1.0", "id", "source", "type",
"time", "data": {…}}``, and the header ``registry-event-signature: t=<unix seconds>,
v1=<hex HMAC-SHA-256>`` signs ``"<t>.<raw body>"`` with the key of the event source whose
``source`` the body names. The request is authenticated when that source is configured,
one ``v1`` value equals the expected MAC (compared in constant time) and ``t`` lies within
300 s of now; otherwise — including a body too malformed to name a source — the answer is
401 ``authentication.refused``, the same for every reason, and nothing is started.

From then on the event is an audited action (``event-start``) of the principal
``("event-source", <source>)`` with no client: a malformed event is 400, a recovery-only
instance answers 409 ``admission.recovery-only``, and admission starts the source's
workflow with ``data`` as the input (422 ``input.invalid`` when it does not fit), answering
201 with the run's status — or 200 with the same run when the event (same source and
``id``) is delivered again.

Keys are read from their secret references when the gateway starts; a key that cannot be
read (or is shorter than 32 bytes) is logged by reference and its source accepts nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from core import clock
from core.callers import EVENT_ISSUER
from core.codes import Code
from core.config.model import RuntimeConfig
from core.errors import CoordinatorError
from core.runs import StartResult, refuse_recovery_only
from core.secrets import SecretResolver
from gateway import bodies
from gateway.backend import AuditRecord
from gateway.completions import audited
from gateway.routes import GatewayContext

log = logging.getLogger("coordinator.gateway")

SIGNATURE_HEADER: Final = "registry-event-signature"
TOLERANCE_SECONDS: Final = 300
MIN_KEY_BYTES: Final = 32
AUDIT_ACTION: Final = "event-start"
SPEC_VERSION: Final = "1.0"

_TIMESTAMP = re.compile(r"[0-9]{1,15}")
_MAC = re.compile(r"[0-9a-f]{64}")

StartFromEvent = Callable[[str, str, str], Awaitable[StartResult]]
"""Hands a verified event (source name, event id, data JSON) to admission."""


@dataclass(frozen=True)
class EventSourceKey:
    """One configured event source with its signing key read."""

    name: str
    """The key under ``eventSources``."""
    source: str
    """The events' ``source`` attribute."""
    key: bytes = field(repr=False)


def load_sources(config: RuntimeConfig, resolver: SecretResolver) -> tuple[EventSourceKey, ...]:
    """The signing keys of every configured event source that can be read."""
    found: list[EventSourceKey] = []
    for name, source in sorted(config.event_sources.items()):
        try:
            key = resolver.read_bytes(source.signing_key_ref, min_len=MIN_KEY_BYTES)
        except CoordinatorError as exc:
            log.error(
                "eventSources.%s.signingKeyRef cannot be used (%s); its events are refused",
                name,
                exc.code,
            )
            continue
        found.append(EventSourceKey(name=name, source=source.source, key=key))
    return tuple(found)


@dataclass(frozen=True)
class Signature:
    """A parsed ``registry-event-signature`` header."""

    timestamp: str
    """``t`` exactly as sent (it is part of the signed text)."""
    macs: tuple[str, ...]
    """Every ``v1`` value (more than one lets a producer roll its key over)."""


def parse_signature(header: str) -> Signature | None:
    """``t=<seconds>,v1=<64 hex>[,v1=…]``; ``None`` when malformed. Other schemes are ignored."""
    timestamp: str | None = None
    macs: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            return None
        if name == "t":
            if timestamp is not None or not _TIMESTAMP.fullmatch(value):
                return None
            timestamp = value
        elif name == "v1":
            if not _MAC.fullmatch(value):
                return None
            macs.append(value)
    if timestamp is None or not macs:
        return None
    return Signature(timestamp, tuple(macs))


def expected_mac(key: bytes, timestamp: str, body: bytes) -> str:
    """The hex HMAC-SHA-256 of ``"<t>.<raw body>"`` under ``key``."""
    return hmac.new(key, timestamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def sign(key: bytes, body: bytes, timestamp: int) -> str:
    """The header value a producer sends for ``body`` at ``timestamp`` (tools and tests)."""
    return f"t={timestamp},v1={expected_mac(key, str(timestamp), body)}"


def signature_valid(key: bytes, signature: Signature, body: bytes) -> bool:
    """Whether one of the ``v1`` values is the MAC of the body; each compared in constant time."""
    expected = expected_mac(key, signature.timestamp, body)
    valid = False
    for mac in signature.macs:
        valid |= hmac.compare_digest(expected, mac)
    return valid


def fresh(signature: Signature, now: float) -> bool:
    """Whether ``t`` lies within :data:`TOLERANCE_SECONDS` of ``now``, either way."""
    return abs(int(signature.timestamp) - now) <= TOLERANCE_SECONDS


def _refused() -> CoordinatorError:
    return CoordinatorError(Code.AUTHENTICATION_REFUSED, "the event is not accepted")


def authenticate(
    sources: Sequence[EventSourceKey], headers: Sequence[str], body: bytes, now: float
) -> tuple[EventSourceKey, dict[str, Any]]:
    """The verified source and the parsed event; 401 for every failure, the same way."""
    signature = parse_signature(headers[0]) if len(headers) == 1 else None
    try:
        # Its values are judged once it is authenticated: a signed event holding a number
        # beyond the double range is 400, an unsigned one 401 like any other.
        document = bodies.parse_json_object(body, check_values=False)
    except CoordinatorError:
        raise _refused() from None
    named = document.get("source")
    source = next((s for s in sources if isinstance(named, str) and s.source == named), None)
    if signature is None or source is None:
        raise _refused()
    if not signature_valid(source.key, signature, body) or not fresh(signature, now):
        raise _refused()
    return source, document


@dataclass(frozen=True)
class Event:
    """The members of a verified event that admission needs."""

    id: str
    data_json: str


def event_of(document: Mapping[str, Any]) -> Event:
    """Check the CloudEvents members; a refusal names the member, never its value."""
    bodies.refuse_unkept(document)
    if document.get("specversion") != SPEC_VERSION:
        raise bodies.RequestInvalid(f'/specversion: must be "{SPEC_VERSION}"')
    for member in ("id", "type"):
        value = document.get(member)
        if not isinstance(value, str) or not value:
            raise bodies.RequestInvalid(f"/{member}: must be a non-empty string")
    if "time" in document and not isinstance(document["time"], str):
        raise bodies.RequestInvalid("/time: must be a string")
    if "data" not in document:
        raise bodies.RequestInvalid("/data: required")
    return Event(id=str(document["id"]), data_json=bodies.json_text(document["data"]))


class EventHandler:
    """The route's handler (a :data:`gateway.routes.Hook`)."""

    def __init__(
        self,
        sources: Sequence[EventSourceKey],
        start: StartFromEvent,
        *,
        recovery_only: bool = False,
        now: Callable[[], float] = lambda: clock.now().timestamp(),
    ) -> None:
        self.sources = tuple(sources)
        self.start = start
        self.recovery_only = recovery_only
        self.now = now

    async def __call__(self, request: Request, ctx: GatewayContext) -> Response:
        body = await bodies.read_body(request)
        try:
            source, document = authenticate(
                self.sources, request.headers.getlist(SIGNATURE_HEADER), body, self.now()
            )
        except CoordinatorError:
            log.info("a signed event was refused: unknown source, bad signature or stale time")
            raise
        principal = (EVENT_ISSUER, source.source)
        run_id: str | None = None
        # The record names the run once admission has answered with it.
        async with audited(ctx.backend, lambda outcome: self._record(outcome, principal, run_id)):
            event = event_of(document)
            refuse_recovery_only(self.recovery_only)
            result = await self.start(source.name, event.id, event.data_json)
            run_id = result.run_id
        if result.created:
            return JSONResponse(
                result.status, status_code=201, headers={"Location": f"/v1/runs/{run_id}"}
            )
        return JSONResponse(result.status, status_code=200)

    @staticmethod
    def _record(outcome: str, principal: tuple[str, str], run_id: str | None) -> AuditRecord:
        return AuditRecord(
            action=AUDIT_ACTION,
            outcome=outcome,
            principal=principal,
            client_id=None,
            run_id=run_id,
        )
