"""The gateway's view of the components behind it.

Routes talk to a :class:`Backend`; :class:`GrpcBackend` is the real one, calling admission,
recovery, auditd (and the dispatcher's health) over the internal channel with a deadline on
every call. Documents that the contract defines (status, list, inspection, doctor, action
answers) are produced by the component that owns the data and arrive as typed messages;
the gateway renders each back into its document (:mod:`core.documents`) only to relay it.
Tests give the app a fake backend instead.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

import grpc
from google.protobuf.message import Message

from core import actions
from core.codes import Code
from core.documents import (
    doctor_document,
    inspection_document,
    list_document,
    operator_answer_document,
    status_document,
)
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import DEFAULT_DEADLINE_SECONDS, Endpoints, call, channel
from core.runs import VERDICT_WAIT_SECONDS, StartResult, refuse_recovery_only
from gateway.policies import RunOwner

log = logging.getLogger("coordinator.gateway")

HEALTH_COMPONENTS: Final = ("admission", "dispatcher", "recovery", "auditd")
RECOVERY_ONLY_COMPONENTS: Final = ("recovery", "auditd")
CHECK_DEADLINE_SECONDS: Final = 2.0
METRICS_DEADLINE_SECONDS: Final = 5.0

_REASON_WORD = re.compile(r"[a-z][a-z0-9.-]{0,63}")

Document = dict[str, Any]
"""A contract document (status, list, inspection, doctor, action answer) as parsed JSON."""


@dataclass(frozen=True)
class BackendCaller:
    """The verified caller, as the components behind the gateway see it."""

    iss: str
    """Issuer of the access token."""
    sub: str
    """Subject of the access token."""
    client_id: str
    """Verified ``client_id``."""
    operator: bool
    """True when the caller's policy has ``operator: true``."""


@dataclass(frozen=True)
class ListQuery:
    """A validated, authorized list request."""

    workflows: tuple[str, ...]
    """Only runs of these workflows (the caller's policy scope, maybe narrowed)."""
    principal: tuple[str, str] | None
    """Only runs started by this ``(iss, sub)``; ``None`` lists every principal's runs."""
    attention: bool | None
    """Filter on ``attention`` when set."""
    state: str | None
    """Filter on the run state when set."""
    limit: int
    """1..100."""
    cursor: str | None
    """The opaque ``nextCursor`` of a previous page."""
    order: str = "newest"
    """``newest`` or ``oldest``."""
    step: str | None = None
    """Only runs whose step of this name needs attention."""
    cause: str | None = None
    """Only runs with a step that needs attention for this cause."""
    updated_before: str | None = None
    """RFC 3339, as the caller wrote it."""
    run_id_prefix: str | None = None
    """A search: the runs whose id starts with this."""
    start: tuple[str, str, str, str] | None = None
    """A search: the run started by ``(iss, sub, workflow, Idempotency-Key)``."""
    event: tuple[str, str] | None = None
    """A search: the run started by the signed event ``(source, id)``."""


@dataclass(frozen=True)
class AuditRecord:
    """One audit journal record as the gateway asks auditd to write it (CONTRACT §12).

    Every member is either a word chosen by the gateway's code or a verified identity; the
    journal turns identities into keyed references. Never inputs, tokens or personal data.
    """

    action: str
    """What was attempted: ``start``, ``status``, ``list``, ``cancel``, ``retain`` …"""
    outcome: str
    """How it ended: ``ok``, ``refused``, ``not-found``, ``conflict`` …"""
    principal: tuple[str, str] | None
    """The caller's ``(iss, sub)``; ``None`` when there is no caller."""
    client_id: str | None
    """The caller's ``client_id``; ``None`` when there is no caller."""
    run_id: str | None = None
    """The run acted on, when known."""
    reason: str | None = None
    """The operator's investigation reference, when given."""


@dataclass(frozen=True)
class ComponentHealth:
    """One component's answer to its Check RPC (``reachable`` False when it did not answer)."""

    component: str
    """admission, dispatcher, recovery or auditd."""
    reachable: bool
    """False when the Check call failed."""
    store_ready: bool
    """The component's database pool is usable."""
    activation_ready: bool
    """The component verified the activation it serves."""
    reasons: tuple[str, ...]
    """Short machine words for what is not ready."""


class Backend(Protocol):
    """Everything the HTTP routes need from the components behind the gateway."""

    async def start(
        self, caller: BackendCaller, workflow_id: str, idempotency_key: str, input_json: str
    ) -> StartResult:
        """Start a run (admission)."""
        ...

    async def status(self, run_id: str) -> Document:
        """The run's status document (recovery)."""
        ...

    async def inspect(self, run_id: str) -> Document:
        """The run's inspection document (recovery)."""
        ...

    async def list(self, query: ListQuery) -> Document:
        """One page of runs (recovery)."""
        ...

    async def doctor(self) -> Document:
        """The doctor report (recovery)."""
        ...

    async def run_owner(self, run_id: str) -> RunOwner | None:
        """Who started a run and from which workflow; ``None`` when there is no such run."""
        ...

    async def run_action(
        self,
        caller: BackendCaller,
        run_id: str,
        action: str,
        reason: str,
        verdict_wait: float | None = None,
    ) -> Document:
        """reconcile, retry-same or cancel (recovery); ``verdict_wait`` shortens how long
        retry-same waits for the dispatcher's verdict (the default wait when ``None``)."""
        ...

    async def operator_action(
        self, caller: BackendCaller, action: str, body: Mapping[str, Any]
    ) -> Document:
        """A deployment-wide operator action with its validated body (recovery)."""
        ...

    async def append_audit(self, records: Sequence[AuditRecord]) -> None:
        """Append and fsync records; raise ``audit.response-unavailable`` when it cannot."""
        ...

    async def checks(self) -> tuple[ComponentHealth, ...]:
        """Every served component's health; never raises."""
        ...

    async def metrics(self) -> tuple[str, ...]:
        """Each reachable component's Prometheus text; never raises."""
        ...


def require(reply: Message, field: str, component: str) -> None:
    """Refuse a reply that lacks the part every answer of its kind carries (``field``, a
    sub-message or a oneof): a component broke the interface, an internal failure that is
    not the caller's doing."""
    present = (
        reply.WhichOneof(field) is not None
        if field in reply.DESCRIPTOR.oneofs_by_name
        else reply.HasField(field)
    )
    if not present:
        raise CoordinatorError(Code.INTERNAL, f"the {component} component sent an empty answer")


def start_result(reply: pb.StartReply) -> StartResult:
    """What admission's ``Start`` or ``StartFromEvent`` answered."""
    require(reply, "status", "admission")
    return StartResult(
        created=reply.created,
        run_id=reply.run_id,
        status=status_document(reply.status),
    )


def _proto_caller(caller: BackendCaller) -> pb.Caller:
    return pb.Caller(
        iss=caller.iss, sub=caller.sub, client_id=caller.client_id, operator=caller.operator
    )


def _proto_record(record: AuditRecord) -> pb.AuditRecord:
    iss, sub = record.principal or ("", "")
    return pb.AuditRecord(
        action=record.action,
        outcome=record.outcome,
        principal_iss=iss,
        principal_sub=sub,
        client_id=record.client_id or "",
        run_id=record.run_id or "",
        reason=record.reason or "",
    )


def _health(component: str, reply: pb.Health) -> ComponentHealth:
    # Reasons are shown on /ready: keep only well-formed machine words.
    reasons = tuple(r for r in reply.reasons if _REASON_WORD.fullmatch(r))
    return ComponentHealth(
        component=component,
        reachable=True,
        store_ready=reply.store_ready,
        activation_ready=reply.activation_ready,
        reasons=reasons,
    )


class GrpcBackend:
    """The real backend: one grpc.aio channel per component, created in the running loop."""

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        recovery_only: bool = False,
        timeout: float = DEFAULT_DEADLINE_SECONDS,
    ) -> None:
        self._endpoints = endpoints
        self._recovery_only = recovery_only
        self._timeout = timeout
        self._channels: dict[str, grpc.aio.Channel] = {}
        wanted = RECOVERY_ONLY_COMPONENTS if recovery_only else HEALTH_COMPONENTS
        # Components without an internal address (an optional dispatcher address over TCP)
        # are not asked.
        self.components = tuple(name for name in wanted if name in endpoints.addresses)

    def _channel(self, component: str) -> grpc.aio.Channel:
        found = self._channels.get(component)
        if found is None:
            found = channel(self._endpoints, component)
            self._channels[component] = found
        return found

    # The generated stub classes pick their async flavour from the channel type, which mypy
    # cannot see (grpc is untyped here).
    def _admission(self) -> pb_grpc.AdmissionAsyncStub:
        return cast("pb_grpc.AdmissionAsyncStub", pb_grpc.AdmissionStub(self._channel("admission")))

    def _recovery(self) -> pb_grpc.RecoveryAsyncStub:
        return cast("pb_grpc.RecoveryAsyncStub", pb_grpc.RecoveryStub(self._channel("recovery")))

    def _audit(self) -> pb_grpc.AuditAsyncStub:
        return cast("pb_grpc.AuditAsyncStub", pb_grpc.AuditStub(self._channel("auditd")))

    async def close(self) -> None:
        """Close every channel."""
        channels, self._channels = self._channels, {}
        for chan in channels.values():
            await chan.close()

    async def start(
        self, caller: BackendCaller, workflow_id: str, idempotency_key: str, input_json: str
    ) -> StartResult:
        # A recovery-only instance runs no admission component: the refusal is answered here.
        refuse_recovery_only(self._recovery_only)
        request = pb.StartRequest(
            caller=_proto_caller(caller),
            workflow_id=workflow_id,
            idempotency_key=idempotency_key,
            input_json=input_json,
        )
        reply = await call("admission", self._admission().Start, request, timeout=self._timeout)
        return start_result(reply)

    async def status(self, run_id: str) -> Document:
        reply = await call(
            "recovery", self._recovery().Status, pb.RunRef(run_id=run_id), timeout=self._timeout
        )
        return status_document(reply)

    async def inspect(self, run_id: str) -> Document:
        reply = await call(
            "recovery", self._recovery().Inspect, pb.RunRef(run_id=run_id), timeout=self._timeout
        )
        require(reply, "status", "recovery")
        return inspection_document(reply)

    async def list(self, query: ListQuery) -> Document:
        iss, sub = query.principal or ("", "")
        request = pb.ListRequest(
            attention="" if query.attention is None else str(query.attention).lower(),
            state=query.state or "",
            workflow_id="",
            limit=query.limit,
            cursor=query.cursor or "",
            workflows=list(query.workflows),
            only_principal=query.principal is not None,
            principal_iss=iss,
            principal_sub=sub,
            order=query.order,
            step=query.step or "",
            cause=query.cause or "",
            updated_before=query.updated_before or "",
            run_id_prefix=query.run_id_prefix or "",
        )
        if query.start is not None:
            request.start_iss, request.start_sub, request.workflow_id, request.start_key = (
                query.start
            )
        if query.event is not None:
            request.event_source, request.event_id = query.event
        reply = await call("recovery", self._recovery().List, request, timeout=self._timeout)
        return list_document(reply)

    async def doctor(self) -> Document:
        reply = await call("recovery", self._recovery().Doctor, pb.Empty(), timeout=self._timeout)
        require(reply, "state", "recovery")
        return doctor_document(reply)

    async def run_owner(self, run_id: str) -> RunOwner | None:
        reply = await call(
            "recovery",
            self._recovery().GetRunOwner,
            pb.RunRef(run_id=run_id),
            timeout=self._timeout,
        )
        if not reply.found:
            return None
        return RunOwner(workflow_id=reply.workflow_id, iss=reply.iss, sub=reply.sub)

    async def run_action(
        self,
        caller: BackendCaller,
        run_id: str,
        action: str,
        reason: str,
        verdict_wait: float | None = None,
    ) -> Document:
        request = pb.RunActionRequest(
            caller=_proto_caller(caller), run_id=run_id, action=action, reason=reason
        )
        wait = VERDICT_WAIT_SECONDS
        if verdict_wait is not None:
            wait = min(max(verdict_wait, 0.0), VERDICT_WAIT_SECONDS)
            request.verdict_wait_ms = round(wait * 1000)
        # retry-same may wait that long for the verdict after acting: the deadline allows it
        # on top of the ordinary one, so a slow verdict is `pending`, not a lost answer.
        reply = await call(
            "recovery", self._recovery().RunAction, request, timeout=self._timeout + wait
        )
        return {**status_document(reply.status), "result": reply.result}

    async def operator_action(
        self, caller: BackendCaller, action: str, body: Mapping[str, Any]
    ) -> Document:
        request = pb.OperatorActionRequest(
            caller=_proto_caller(caller), action=action, **actions.request_body(action, body)
        )
        reply = await call(
            "recovery", self._recovery().OperatorAction, request, timeout=self._timeout
        )
        require(reply, "answer", "recovery")
        return operator_answer_document(reply)

    async def append_audit(self, records: Sequence[AuditRecord]) -> None:
        request = pb.AppendRequest(records=[_proto_record(record) for record in records])
        try:
            await call("auditd", self._audit().Append, request, timeout=self._timeout)
        except CoordinatorError as exc:
            # Whatever kept the journal from taking the record, the answer is the same.
            raise CoordinatorError(
                Code.AUDIT_RESPONSE_UNAVAILABLE,
                "the result could not be recorded in the audit journal",
            ) from exc

    def _stub(self, component: str) -> Any:
        # Check and Metrics exist on every service; their stubs differ only by type.
        if component == "admission":
            return self._admission()
        if component == "recovery":
            return self._recovery()
        if component == "auditd":
            return self._audit()
        return pb_grpc.DispatcherStub(self._channel(component))

    async def _check(self, component: str) -> ComponentHealth:
        try:
            reply = await call(
                component, self._stub(component).Check, pb.Empty(), timeout=CHECK_DEADLINE_SECONDS
            )
        except CoordinatorError:
            return ComponentHealth(component, False, False, False, (f"{component}-unavailable",))
        return _health(component, reply)

    async def checks(self) -> tuple[ComponentHealth, ...]:
        return tuple(await asyncio.gather(*(self._check(name) for name in self.components)))

    async def _metrics(self, component: str) -> str | None:
        try:
            reply = await call(
                component,
                self._stub(component).Metrics,
                pb.Empty(),
                timeout=METRICS_DEADLINE_SECONDS,
            )
        except CoordinatorError as exc:
            log.warning("no metrics from %s: %s", component, exc.code)
            return None
        return str(reply.text)

    async def metrics(self) -> tuple[str, ...]:
        texts = await asyncio.gather(*(self._metrics(name) for name in self.components))
        return tuple(text for text in texts if text is not None)
