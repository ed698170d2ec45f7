"""What every product stand-in shares: token checks, idempotency, receipts, faults, dev routes.

A command request passes these gates in order: bearer token (RFC 9068, from the development
issuer, with the operation's scope and an allowed client), ``Idempotency-Key``, a JSON body
that fits the operation's command schema from :mod:`core.workflow.catalogue`, the injected
fault (if any), and then the idempotency ledger, which either replays the original answer or
processes the command exactly once. The ledger counts processing per key so tests can prove
that nothing was processed twice.

Dev routes (no token; the stand-ins only ever listen on loopback):

- ``GET /dev/stats`` — ``{"processed": {key: n}, "received": {key: n}, ...}``
- ``POST /dev/faults`` — ``{"mode", "seconds"?, "count"?, "target"?}``; ``DELETE`` clears
- ``POST /dev/faults/release`` — lets requests held by ``hang-after`` answer
- ``POST /dev/clock`` — ``{"advanceSeconds": n}`` moves this stand-in's clock forward
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import httpx
import jwt
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from core.workflow.catalogue import (
    Field,
    Operation,
    Result,
    connection_type,
    validate_command,
)
from devstack.products.faults import (
    Dropped,
    Fault,
    FaultInvalid,
    Faults,
    drop_connection,
    dropped_handler,
    is_number,
)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

PROBLEM_BASE = "https://registry-devstack.invalid/problems/"
"""Problem ``type`` prefix of the stand-ins (they are not the coordinator)."""

MAX_BODY_BYTES = 64 * 1024
ALGORITHMS = ("ES256", "RS256")
DAY = 86_400
_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")


def iso(instant: float) -> str:
    """RFC 3339 UTC with milliseconds, as the products write instants."""
    text = datetime.fromtimestamp(instant, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def new_id(prefix: str) -> str:
    """A fresh opaque identifier such as ``msg-3f2a…``."""
    return f"{prefix}-{uuid.uuid4().hex}"


class DevClock:
    """A clock that can be moved forward (``/dev/clock``) on top of a base clock."""

    def __init__(self, base: Clock = time.time) -> None:
        self._base = base
        self.offset = 0.0

    def __call__(self) -> float:
        return self._base() + self.offset

    def advance(self, seconds: float) -> None:
        """Move this clock forward by ``seconds``."""
        self.offset += seconds


# ---------------------------------------------------------------------------------------------
# Problems


class Problem(Exception):
    """An RFC 9457 answer; ``detail`` names what is wrong, never a value from the request."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def response(self) -> JSONResponse:
        """The problem document as a response."""
        body: dict[str, Any] = {
            "type": PROBLEM_BASE + self.code,
            "title": _TITLES.get(self.code, self.code),
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        }
        return JSONResponse(
            body,
            status_code=self.status,
            headers=self.headers,
            media_type="application/problem+json",
        )


_TITLES = {
    "authentication.refused": "The request is not authenticated",
    "authorization.refused": "The caller may not perform this operation",
    "idempotency.conflict": "The idempotency key was used with a different request",
    "receipt.not-found": "No command with this key was received within the receipt window",
    "receipt.expired": "The receipt is older than the receipt window",
    "service.unavailable": "The service is unavailable; nothing was processed",
    "internal-error": "The service failed after processing the request",
    "request.invalid": "The request is malformed",
    "request.too-large": "The request body is too large",
    "request.unsupported-media-type": "The request body must be application/json",
    "command.invalid": "The command does not fit the operation",
    "not-found": "No such resource",
    "method-not-allowed": "The route does not accept this method",
}


async def _problem_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return exc.response()


async def _http_exception_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return Problem(405, "method-not-allowed", "the route does not accept this").response()
    return Problem(exc.status_code, "not-found", "no such resource").response()


def _unauthenticated(detail: str) -> Problem:
    return Problem(
        401,
        "authentication.refused",
        detail,
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    )


# ---------------------------------------------------------------------------------------------
# Access tokens


class VerifierUnavailable(Exception):
    """The issuer's keys cannot be fetched and none are cached."""


class JwksClient:
    """The issuer's public keys, found by OpenID discovery, refreshed on an unknown ``kid``."""

    def __init__(
        self, http: httpx.AsyncClient, issuer: str, clock: Clock, min_refresh_seconds: float = 60
    ) -> None:
        self._http = http
        self._issuer = issuer
        self._clock = clock
        self._min_refresh = min_refresh_seconds
        self._keys: dict[str, dict[str, Any]] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def key(self, kid: str) -> dict[str, Any] | None:
        """The public JWK with ``kid``; refetches at most once per ``min_refresh_seconds``."""
        if kid in self._keys:
            return self._keys[kid]
        async with self._lock:
            due = self._fetched_at is None or self._clock() - self._fetched_at >= self._min_refresh
            if kid not in self._keys and due:
                await self._refresh()
        return self._keys.get(kid)

    async def _refresh(self) -> None:
        try:
            discovery = await self._http.get(
                self._issuer.rstrip("/") + "/.well-known/openid-configuration"
            )
            discovery.raise_for_status()
            jwks_uri = discovery.json()["jwks_uri"]
            answer = await self._http.get(jwks_uri)
            answer.raise_for_status()
            keys = answer.json()["keys"]
            fresh = {str(k["kid"]): dict(k) for k in keys if isinstance(k, dict) and "kid" in k}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            if not self._keys:
                raise VerifierUnavailable("the issuer's keys cannot be fetched") from exc
            return  # keep the keys we have; an unknown kid stays unknown
        self._keys = fresh
        self._fetched_at = self._clock()


@dataclass(frozen=True)
class Caller:
    """The verified identity behind a request."""

    client_id: str
    subject: str
    scopes: frozenset[str]


class TokenVerifier:
    """Checks RFC 9068 access tokens the way a product would (CONTRACT §9.3, §14)."""

    def __init__(
        self,
        jwks: JwksClient,
        *,
        issuer: str,
        audience: str,
        allowed_clients: frozenset[str],
        clock: Clock,
        leeway_seconds: int = 10,
    ) -> None:
        self._jwks = jwks
        self._issuer = issuer
        # A base URL written with or without its trailing slash names the same product.
        self._audiences = {audience, audience.rstrip("/"), audience.rstrip("/") + "/"}
        self._allowed = allowed_clients
        self._clock = clock
        self._leeway = leeway_seconds
        # Parsed public keys by (kid, alg), with the key set entry they were parsed from: a
        # reloaded key set (new entries) parses again.
        self._parsed: dict[tuple[str, str], tuple[Mapping[str, Any], Any]] = {}

    def _public_key(self, kid: str, alg: str, jwk: Mapping[str, Any]) -> Any:
        parsed = self._parsed.get((kid, alg))
        if parsed is None or parsed[0] is not jwk:
            parsed = (jwk, jwt.PyJWK(dict(jwk), algorithm=alg).key)
            self._parsed[(kid, alg)] = parsed
        return parsed[1]

    async def verify(self, authorization: str | None, required_scope: str) -> Caller:
        """The caller, or a 401/403/503 :class:`Problem`."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthenticated("a bearer token is required")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise _unauthenticated("the token is not a JWT") from exc
        typ = str(header.get("typ", "")).lower().removeprefix("application/")
        if typ != "at+jwt":
            raise _unauthenticated("the token is not an access token")
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS or not isinstance(kid, str):
            raise _unauthenticated("the token's algorithm or key id is not accepted")
        try:
            jwk = await self._jwks.key(kid)
        except VerifierUnavailable as exc:
            raise Problem(503, "service.unavailable", "the token verifier is unavailable") from exc
        if jwk is None or jwk.get("alg", alg) != alg:
            raise _unauthenticated("the token's key is unknown")
        try:
            claims = jwt.decode(
                token,
                self._public_key(kid, str(alg), jwk),
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
            raise _unauthenticated("the token's signature is invalid") from exc
        return self._judge(claims, required_scope)

    def _judge(self, claims: Mapping[str, Any], required_scope: str) -> Caller:
        now = self._clock()
        if claims.get("iss") != self._issuer:
            raise _unauthenticated("the token is from another issuer")
        aud = claims.get("aud")
        audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if not any(a in self._audiences for a in audiences if isinstance(a, str)):
            raise _unauthenticated("the token is not for this service")
        exp = claims.get("exp")
        if not is_number(exp) or exp <= now - self._leeway:
            raise _unauthenticated("the token has expired")
        for name in ("nbf", "iat"):
            value = claims.get(name)
            if value is not None and (not is_number(value) or value > now + self._leeway):
                raise _unauthenticated("the token is not valid yet")
        client_id, subject = claims.get("client_id"), claims.get("sub")
        if not isinstance(client_id, str) or not isinstance(subject, str):
            raise _unauthenticated("the token lacks client_id or sub")
        scope = claims.get("scope", "")
        scopes = frozenset(scope.split()) if isinstance(scope, str) else frozenset()
        if client_id not in self._allowed:
            raise Problem(403, "authorization.refused", "the client is not allowed here")
        if required_scope not in scopes:
            raise Problem(
                403,
                "authorization.refused",
                "the token lacks the scope this operation requires",
                headers={
                    "WWW-Authenticate": (
                        f'Bearer error="insufficient_scope", scope="{required_scope}"'
                    )
                },
            )
        return Caller(client_id=client_id, subject=subject, scopes=scopes)


# ---------------------------------------------------------------------------------------------
# Idempotency records and receipts


@dataclass(frozen=True)
class CommandRecord:
    """The first processing of one idempotency key, replayed for every repeat."""

    key: str
    fingerprint: str
    status: int
    body: Mapping[str, Any]
    profile: str
    client_id: str
    accepted_at: float


class Ledger:
    """Idempotency records, receipts and per-key counters of one stand-in."""

    def __init__(self, idempotency_window: float, receipt_window: float | None) -> None:
        self.idempotency_window = idempotency_window
        self.receipt_window = receipt_window
        self.records: dict[str, CommandRecord] = {}
        self.processed: Counter[str] = Counter()
        self.received: Counter[str] = Counter()

    def execute(
        self,
        *,
        key: str,
        fingerprint: str,
        profile: str,
        client_id: str,
        now: float,
        process: Callable[[], tuple[int, Mapping[str, Any]]],
    ) -> tuple[CommandRecord, bool]:
        """Replay the record for ``key`` or process once; (record, processed now).

        There is no ``await`` between the look-up and the write, so two concurrent requests
        with one key cannot both process.
        """
        self.received[key] += 1
        record = self.records.get(key)
        if record is not None and now - record.accepted_at < self.idempotency_window:
            if record.fingerprint != fingerprint:
                raise Problem(
                    409,
                    "idempotency.conflict",
                    "the Idempotency-Key was used with a different request",
                )
            return record, False
        status, body = process()
        self.processed[key] += 1
        record = CommandRecord(key, fingerprint, status, dict(body), profile, client_id, now)
        self.records[key] = record
        return record, True

    def receipt(self, profile: str, key: str, now: float) -> CommandRecord:
        """The record a receipt reports, or a 404 / 410 :class:`Problem`."""
        record = self.records.get(key)
        if record is None or record.profile != profile:
            raise Problem(404, "receipt.not-found", "no command with this key was received")
        if self.receipt_window is not None and now - record.accepted_at > self.receipt_window:
            raise Problem(410, "receipt.expired", "the receipt is older than the receipt window")
        return record


def fingerprint(method: str, path: str, body: object) -> str:
    """What makes two requests "the same" for idempotency: route and canonical body."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# The stand-in base


@dataclass(frozen=True)
class StandInSettings:
    """How one stand-in is configured (from code, or a JSON settings file)."""

    base_url: str
    """The product base URL tokens must name in ``aud`` (the coordinator's ``baseUrl``)."""
    issuer: str
    """The development issuer's URL (``iss`` of accepted tokens; discovery starts there)."""
    allowed_clients: frozenset[str]
    """``client_id`` values allowed to call this product."""
    scopes: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Overrides of the scope each operation requires (operation name → scope)."""
    idempotency_window_seconds: float | None = None
    """How long a key is remembered; default the catalogue's retry-same window."""
    receipt_window_seconds: float | None = None
    """How long receipts are answered; default the idempotency window."""


@dataclass(frozen=True)
class Outcome:
    """A read's answer."""

    status: int
    body: Mapping[str, Any]


class StandIn:
    """Base of the product stand-ins; an instance is an ASGI application."""

    connection_type: ClassVar[str]
    """The catalogue connection type whose operations this stand-in serves."""
    default_scopes: ClassVar[Mapping[str, str]]
    """Scope required per operation name (and ``receipts`` / result names for reads)."""

    def __init__(
        self,
        settings: StandInSettings,
        *,
        http: httpx.AsyncClient | None = None,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.clock = DevClock(clock)
        self.sleep = sleep
        self._own_http = http is None
        self.http = http if http is not None else httpx.AsyncClient(timeout=10.0)
        self.scopes = {**self.default_scopes, **settings.scopes}
        kind = connection_type(self.connection_type)
        assert kind is not None, self.connection_type
        self.operations: Mapping[str, Operation] = kind.operations
        self.results: Mapping[str, Result] = kind.results
        window = settings.idempotency_window_seconds or max(
            (op.retry_same_seconds for op in self.operations.values()), default=DAY
        )
        has_receipts = any(op.has_receipts for op in self.operations.values())
        self.ledger = Ledger(
            window, (settings.receipt_window_seconds or window) if has_receipts else None
        )
        self.faults = Faults()
        self.verifier = TokenVerifier(
            JwksClient(self.http, settings.issuer, clock),
            issuer=settings.issuer,
            audience=settings.base_url,
            allowed_clients=settings.allowed_clients,
            # Tokens are minted on the issuer's real clock; /dev/clock moves only the
            # product's own records (receipt and idempotency windows, timestamps).
            clock=clock,
        )
        routes: list[BaseRoute] = [*self.product_routes(), *self._dev_routes()]
        self.app = Starlette(
            routes=routes,
            exception_handlers={
                Problem: _problem_handler,
                HTTPException: _http_exception_handler,
                Dropped: dropped_handler,
            },
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        await self.aclose()

    async def aclose(self) -> None:
        """Release held requests and close what this stand-in opened."""
        self.faults.clear()
        if self._own_http:
            await self.http.aclose()

    def product_routes(self) -> list[BaseRoute]:
        """The product's public routes."""
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """The ``/dev/stats`` document; ``answers`` shows what each processed command got back
        (e.g. a ``messageId``), in the order the commands were first processed."""
        return {
            "processed": dict(self.ledger.processed),
            "received": dict(self.ledger.received),
            "answers": [
                {"profile": record.profile, "status": record.status, "body": record.body}
                for record in self.ledger.records.values()
            ],
        }

    # -- request handling ---------------------------------------------------------------------

    async def command(
        self,
        request: Request,
        operation: str,
        process: Callable[[Caller, str, Mapping[str, Any]], Mapping[str, Any]],
        check: Callable[[Caller, str, Mapping[str, Any]], None] | None = None,
    ) -> Response:
        """Run one catalogued command through every gate and the idempotency ledger.

        ``check`` refuses a command the product would not accept (it raises a
        :class:`Problem`); ``process`` performs it and returns the success body.
        """
        op = self.operations[operation]
        caller = await self.verifier.verify(
            request.headers.get("authorization"), self.scopes[operation]
        )
        key = request.headers.get("idempotency-key")
        if key is None or not _KEY_PATTERN.match(key):
            raise Problem(
                400, "request.invalid", "Idempotency-Key must be 1-255 visible ASCII characters"
            )
        body = await json_body(request)
        _check_command(op, body)
        profile = str(request.path_params["profile"])
        if check is not None:
            check(caller, profile, body)
        fault = self.faults.take("commands")
        await self._before(fault, request)
        record, _fresh = self.ledger.execute(
            key=key,
            fingerprint=fingerprint(request.method, request.url.path, body),
            profile=profile,
            client_id=caller.client_id,
            now=self.clock(),
            process=lambda: (op.success_status, process(caller, profile, body)),
        )
        await self._after(fault, request)
        return JSONResponse(dict(record.body), status_code=record.status)

    async def read(
        self, request: Request, scope: str, produce: Callable[[Caller], Outcome]
    ) -> Response:
        """Serve one authenticated read, with the faults aimed at reads."""
        caller = await self.verifier.verify(request.headers.get("authorization"), scope)
        fault = self.faults.take("reads")
        await self._before(fault, request)
        outcome = produce(caller)
        await self._after(fault, request)
        return JSONResponse(dict(outcome.body), status_code=outcome.status)

    async def receipt(self, request: Request) -> Response:
        """``GET …/receipts/{key}``: the original answer of a processed command."""

        def produce(caller: Caller) -> Outcome:
            record = self.ledger.receipt(
                str(request.path_params["profile"]), str(request.path_params["key"]), self.clock()
            )
            body = dict(record.body)
            body.setdefault("acceptedAt", iso(record.accepted_at))
            return Outcome(200, body)

        return await self.read(request, self.scopes["receipts"], produce)

    async def _before(self, fault: Fault | None, request: Request) -> None:
        if fault is None:
            return
        if fault.mode == "delay":
            await self.sleep(fault.seconds)
        elif fault.mode == "fail-before":
            raise Problem(503, "service.unavailable", "injected fault: nothing was processed")
        elif fault.mode == "drop-before":
            await drop_connection(request)

    async def _after(self, fault: Fault | None, request: Request) -> None:
        if fault is None:
            return
        if fault.mode == "fail-after":
            raise Problem(500, "internal-error", "injected fault after processing")
        if fault.mode == "hang-after":
            await self.faults.hang()
        elif fault.mode == "drop-after":
            await drop_connection(request)

    # -- dev routes ---------------------------------------------------------------------------

    def _dev_routes(self) -> list[BaseRoute]:
        return [
            Route("/dev/stats", self._dev_stats, methods=["GET"]),
            Route("/dev/faults", self._dev_faults, methods=["GET", "POST", "DELETE"]),
            Route("/dev/faults/release", self._dev_release, methods=["POST"]),
            Route("/dev/clock", self._dev_clock, methods=["POST"]),
        ]

    async def _dev_stats(self, request: Request) -> Response:
        return JSONResponse(self.stats())

    async def _dev_faults(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                fault = Fault.from_json(await json_body(request))
            except FaultInvalid as exc:
                raise Problem(400, "request.invalid", str(exc)) from exc
            self.faults.set(fault)
        elif request.method == "DELETE":
            self.faults.clear()
        active = self.faults.active
        return JSONResponse({"fault": active.to_json() if active else None})

    async def _dev_release(self, request: Request) -> Response:
        return JSONResponse({"released": self.faults.release()})

    async def _dev_clock(self, request: Request) -> Response:
        body = await json_body(request)
        seconds = body.get("advanceSeconds") if isinstance(body, dict) else None
        if not is_number(seconds) or seconds < 0:
            raise Problem(400, "request.invalid", "/advanceSeconds: must be a number >= 0")
        self.clock.advance(float(seconds))
        return JSONResponse({"now": iso(self.clock())})


async def json_body(request: Request) -> Any:
    """The request's JSON body, or a 415 / 413 / 400 :class:`Problem`."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise Problem(415, "request.unsupported-media-type", "the body must be application/json")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise Problem(413, "request.too-large", "the body is larger than 64 KiB")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Problem(400, "request.invalid", "the body is not valid JSON") from exc


def _check_command(op: Operation, body: object) -> None:
    # The product expects the author's fields and those the coordinator fills from the
    # connection (Casework's producer); both come from the catalogue.
    filled = tuple(Field(name, "string") for name, _key in op.connection_fields)
    errors = validate_command(dataclasses.replace(op, command=op.command + filled), body)
    if errors:
        raise Problem(
            422,
            "command.invalid",
            f"{errors[0][0] or '/'}: {errors[0][1]}",
            extra={"errors": [{"pointer": p, "reason": r} for p, r in errors]},
        )


# ---------------------------------------------------------------------------------------------
# Settings files and the command line


def settings_from_json(document: Mapping[str, Any]) -> StandInSettings:
    """Settings from the JSON form: ``baseUrl``, ``issuer``, ``allowedClients`` and options."""
    try:
        return StandInSettings(
            base_url=str(document["baseUrl"]),
            issuer=str(document["issuer"]),
            allowed_clients=frozenset(str(c) for c in document["allowedClients"]),
            scopes=MappingProxyType(
                {str(k): str(v) for k, v in document.get("scopes", {}).items()}
            ),
            idempotency_window_seconds=document.get("idempotencyWindowSeconds"),
            receipt_window_seconds=document.get("receiptWindowSeconds"),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError("a settings file needs baseUrl, issuer and allowedClients") from exc


def serve_main(
    prog: str,
    build: Callable[[Mapping[str, Any], Path], StandIn],
    argv: Sequence[str] | None = None,
) -> int:
    """``python -m devstack.products.<name> --settings FILE [--bind HOST:PORT]``."""
    import uvicorn

    from devstack.products.serving import server_config

    parser = argparse.ArgumentParser(prog=prog, description="Run a product stand-in.")
    parser.add_argument("--settings", type=Path, required=True, help="settings file (JSON)")
    parser.add_argument("--bind", help="HOST:PORT (default: the settings' bind)")
    args = parser.parse_args(argv)
    try:
        document = json.loads(args.settings.read_text())
        stand_in = build(document, args.settings.resolve().parent)
        bind = args.bind or str(document.get("bind", "127.0.0.1:0"))
    except (OSError, ValueError) as exc:
        print(f"{prog}: {args.settings}: {exc}", file=sys.stderr)
        return 1
    host, _, port = bind.rpartition(":")
    # Served with the stand-ins' own protocol (devstack/products/serving.py), which is what
    # lets the drop faults close a connection without answering.
    server = uvicorn.Server(server_config(stand_in, host=host, port=int(port)))
    # Ctrl-C in a terminal: uvicorn has shut down gracefully before this reaches us.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1
