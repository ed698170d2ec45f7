"""``POST /v1/review-completions``: Casework's completion events (CONTRACT §9.5).

An event is accepted only with both credentials of one connection's ``completion`` block:
``Authorization: Bearer <token>`` and ``registry-recipient-binding: <binding>``. Both are
compared with every configured pair in constant time (``hmac.compare_digest``), and every
pair is compared whatever matched first, so the time taken says nothing about which part
was wrong. Anything else — a missing or repeated header, a wrong token, a wrong binding, a
token of one connection with the binding of another, or no completion block configured at
all — is 401 ``authentication.refused``, and nothing behind the gateway is asked.

An accepted event is handed to admission, which brings the awaited read forward, and is
answered 202 whether a waiting run matched or not (no oracle). It never starts a run and
its body carries no decision: only ``{"reviewId": "…"}``. Accepted events are audited
(``review-completion``) before the answer leaves; refused ones are not, like any request
that fails authentication.

The tokens are read from their secret references when the gateway starts; a changed
token takes effect with the next start. A token that cannot be read is logged (by its
reference, never its content) and that connection accepts no event until it can.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, cast

import grpc
from starlette.requests import Request
from starlette.responses import Response

from core.actions import exact_members
from core.codes import Code
from core.config.model import CASEWORK, RuntimeConfig
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import DEFAULT_DEADLINE_SECONDS, Endpoints, call, channel
from core.runs import StartResult
from core.secrets import SecretResolver
from gateway import bodies
from gateway.auditing import FAILED, OK, AuditUnavailable, outcome_for
from gateway.backend import AuditRecord, Backend, start_result
from gateway.routes import GatewayContext

log = logging.getLogger("coordinator.gateway")

BINDING_HEADER: Final = "registry-recipient-binding"
MAX_TOKEN_BYTES: Final = 4096
AUDIT_ACTION: Final = "review-completion"

Wake = Callable[[str, str], Awaitable[None]]
"""Hands an accepted event (connection, review id) to admission."""


@dataclass(frozen=True)
class CompletionCredential:
    """One connection's completion block, with its token read."""

    connection: str
    binding: bytes
    token: bytes = field(repr=False)


def load_credentials(
    config: RuntimeConfig, resolver: SecretResolver
) -> tuple[CompletionCredential, ...]:
    """The completion credentials of every Casework connection that has a block."""
    found: list[CompletionCredential] = []
    for name, connection in sorted(config.connections.items()):
        completion = connection.completion
        if connection.type != CASEWORK or completion is None:
            continue
        try:
            token = resolver.read_text(completion.bearer_token_ref, max_len=MAX_TOKEN_BYTES)
        except CoordinatorError as exc:
            log.error(
                "connections.%s.completion.bearerTokenRef cannot be used (%s); "
                "completion events for it are refused",
                name,
                exc.code,
            )
            continue
        found.append(
            CompletionCredential(
                connection=name,
                binding=completion.recipient_binding.encode("utf-8"),
                token=token.encode("utf-8"),
            )
        )
    return tuple(found)


def _refused() -> CoordinatorError:
    return CoordinatorError(Code.AUTHENTICATION_REFUSED, "the completion is not accepted")


def _single(request: Request, name: str) -> str | None:
    values = request.headers.getlist(name)
    return values[0] if len(values) == 1 else None


def presented(request: Request) -> tuple[bytes, bytes] | None:
    """The bearer token and binding the request presents, or ``None`` without both."""
    authorization = _single(request, "authorization")
    binding = _single(request, BINDING_HEADER)
    if authorization is None or binding is None:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or not binding:
        return None
    return token.strip().encode("utf-8"), binding.encode("utf-8")


def match(credentials: Sequence[CompletionCredential], token: bytes, binding: bytes) -> str | None:
    """The connection whose token *and* binding both equal those presented, if any.

    Every credential is compared, each in constant time, so the answer's timing does not
    depend on where (or whether) a match was found.
    """
    matched: str | None = None
    for credential in credentials:
        same_token = hmac.compare_digest(credential.token, token)
        same_binding = hmac.compare_digest(credential.binding, binding)
        if same_token & same_binding and matched is None:
            matched = credential.connection
    return matched


def review_id_of(body: dict[str, object]) -> str:
    """The ``reviewId`` of a completion body (exactly that one member, a string)."""
    exact_members(body, ("reviewId",))
    value = body["reviewId"]
    if not isinstance(value, str) or not value:
        raise bodies.RequestInvalid("/reviewId: must be a non-empty string")
    return value


async def audit(backend: Backend, record: AuditRecord) -> None:
    """Append one record before the answer leaves; a failure is 503 (audit unavailable)."""
    try:
        await backend.append_audit((record,))
    except Exception as exc:
        log.error("audit append failed for %s: %s", record.action, type(exc).__name__)
        raise AuditUnavailable() from None


@contextlib.asynccontextmanager
async def audited(backend: Backend, record: Callable[[str], AuditRecord]) -> AsyncIterator[None]:
    """One audit record of a producer's authenticated action, whatever its outcome: ``ok``
    when the block ends, else the refusal's outcome word (§12); appended before the answer."""
    try:
        yield
    except CoordinatorError as exc:
        await audit(backend, record(outcome_for(exc.code)))
        raise
    except Exception:
        await audit(backend, record(FAILED))
        raise
    await audit(backend, record(OK))


class CompletionHandler:
    """The route's handler (a :data:`gateway.routes.Hook`)."""

    def __init__(
        self,
        credentials: Sequence[CompletionCredential],
        wake: Wake,
        *,
        recovery_only: bool = False,
    ) -> None:
        self.credentials = tuple(credentials)
        self.wake = wake
        self.recovery_only = recovery_only

    async def __call__(self, request: Request, ctx: GatewayContext) -> Response:
        offered = presented(request)
        connection = None if offered is None else match(self.credentials, *offered)
        if connection is None:
            log.info("a review completion was refused: its credentials match no connection")
            raise _refused()
        # Authenticated from here on: whatever happens next is one audited action.
        async with audited(ctx.backend, _record):
            review_id = review_id_of(await bodies.read_json_object(request))
            if self.recovery_only:
                # Nothing here wakes runs; Casework retries a 503 until the ordinary
                # instance is back.
                raise CoordinatorError(
                    Code.SERVICE_UNAVAILABLE, "this instance takes no completion events"
                )
            await self.wake(connection, review_id)
        return Response(status_code=202)


def _record(outcome: str) -> AuditRecord:
    # A completion has no caller of the issuer's: no principal, no client.
    return AuditRecord(action=AUDIT_ACTION, outcome=outcome, principal=None, client_id=None)


class AdmissionProducers:
    """The admission calls of the producer routes, over their own channel.

    Created inside the running event loop (the channel is), closed by :meth:`close`.
    """

    def __init__(self, endpoints: Endpoints, *, timeout: float = DEFAULT_DEADLINE_SECONDS) -> None:
        self._channel: grpc.aio.Channel = channel(endpoints, "admission")
        self._stub = cast("pb_grpc.AdmissionAsyncStub", pb_grpc.AdmissionStub(self._channel))
        self._timeout = timeout

    async def review_completion(self, connection: str, review_id: str) -> None:
        """``ReviewCompletion``: make the read of ``review_id`` due now."""
        request = pb.CompletionRequest(connection=connection, review_id=review_id)
        await call("admission", self._stub.ReviewCompletion, request, timeout=self._timeout)

    async def start_from_event(self, source_key: str, event_id: str, data_json: str) -> StartResult:
        """``StartFromEvent``: start (or find again) the run of a verified event."""
        request = pb.EventRequest(source_key=source_key, event_id=event_id, data_json=data_json)
        reply = await call("admission", self._stub.StartFromEvent, request, timeout=self._timeout)
        return start_result(reply)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()
