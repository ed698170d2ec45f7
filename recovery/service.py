"""recovery: the gRPC servicer for reads and operator actions, and its startup.

Status, inspection, lists and the doctor report are built in :mod:`recovery.reads`; the run
actions (reconcile, retry-same, cancel) in :mod:`recovery.actions`; the restore holds and
retention in :mod:`recovery.operator`. Every call but ``Check`` and ``Metrics`` first makes
sure the activation is still the one this component verified at startup: after an ``apply``
changed it, every API call answers 409 ``deployment.activation-changed`` until a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Final

import grpc

from core import derive, logs
from core.actions import members_of
from core.bindings import verify_live_bindings
from core.codes import Code
from core.documents import (
    doctor_message,
    inspection_message,
    list_message,
    operator_answer_message,
    status_message,
)
from core.errors import CoordinatorError
from core.metrics import exposition, merge, new_registry
from core.own_metrics import own_metrics
from core.products.http import ProductHttp, refuse_retired_settings
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.errors import refusals
from core.rpc.transport import call, channel, server
from core.runtime import Runtime, Store
from core.store_health import refuse_changed_activation, store_health
from recovery import actions, operator, reads
from recovery.env import RecoveryEnv

log = logging.getLogger("coordinator.recovery")

AuditProbe = Callable[[], Awaitable[bool]]
"""Answers whether the audit journal accepts records (the doctor's ``auditReady``)."""

AUDIT_CHECK_TIMEOUT_SECONDS: Final = 2.0


def audit_probe_over_grpc(audit: pb_grpc.AuditStub) -> AuditProbe:
    """An :data:`AuditProbe` that asks auditd's ``Check``; no answer counts as not ready."""

    async def ready() -> bool:
        try:
            health = await call(
                "auditd", audit.Check, pb.Empty(), timeout=AUDIT_CHECK_TIMEOUT_SECONDS
            )
        except CoordinatorError:
            return False
        return "audit-unavailable" not in health.reasons

    return ready


class RecoveryService(pb_grpc.RecoveryServicer):
    """Answer reads about runs and the deployment."""

    def __init__(
        self,
        store: Store,
        *,
        recovery_only: bool,
        audit_ready: AuditProbe,
        env: RecoveryEnv | None = None,
    ) -> None:
        self.store = store
        self.recovery_only = recovery_only
        self.audit_ready = audit_ready
        self.env = env
        self._registry = new_registry("recovery")
        """The operator actions' parts; ``None`` serves reads only (some unit tests)."""

    async def _activation_unchanged(self) -> None:
        await refuse_changed_activation(self.store)

    def _actions_env(self) -> RecoveryEnv:
        if self.env is None:
            raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "operator actions are not available")
        return self.env

    @refusals
    async def GetRunOwner(
        self, request: pb.RunRef, context: grpc.aio.ServicerContext
    ) -> pb.RunOwner:
        await self._activation_unchanged()
        owner = await reads.run_owner(self.store, request.run_id)
        if owner is None:
            return pb.RunOwner(found=False)
        return pb.RunOwner(found=True, workflow_id=owner.workflow_id, iss=owner.iss, sub=owner.sub)

    @refusals
    async def Status(self, request: pb.RunRef, context: grpc.aio.ServicerContext) -> pb.RunStatus:
        await self._activation_unchanged()
        return status_message(await reads.status(self.store, request.run_id))

    @refusals
    async def Inspect(self, request: pb.RunRef, context: grpc.aio.ServicerContext) -> pb.Inspection:
        await self._activation_unchanged()
        return inspection_message(await reads.inspection(self.store, request.run_id))

    @refusals
    async def List(self, request: pb.ListRequest, context: grpc.aio.ServicerContext) -> pb.RunList:
        await self._activation_unchanged()
        wanted = reads.ListFilter.build(
            workflows=tuple(request.workflows),
            attention=request.attention,
            state=request.state,
            workflow_id=request.workflow_id,
            limit=request.limit,
            cursor=request.cursor,
            principal=(
                (request.principal_iss, request.principal_sub) if request.only_principal else None
            ),
            order=request.order,
            step=request.step,
            cause=request.cause,
            updated_before=request.updated_before,
            run_id_prefix=self._searched_id(request),
        )
        return list_message(await reads.list_runs(self.store, wanted))

    def _searched_id(self, request: pb.ListRequest) -> str:
        """The run id (or prefix) a list request searches for: the run a start identity
        names is found by deriving its id, as admission did (CONTRACT §7.3)."""
        if request.start_key:
            if not request.workflow_id or not request.start_iss or not request.start_sub:
                raise CoordinatorError(
                    Code.REQUEST_INVALID, "startKey: needs the workflow and the client"
                )
            identity = derive.api_start_identity(
                self._actions_env().admission_key,
                request.start_iss,
                request.start_sub,
                request.workflow_id,
                request.start_key,
            )
        elif request.event_source or request.event_id:
            if not request.event_source or not request.event_id:
                raise CoordinatorError(
                    Code.REQUEST_INVALID, "eventSource, eventId: a search by event takes both"
                )
            identity = derive.event_start_identity(
                self._actions_env().admission_key, request.event_source, request.event_id
            )
        else:
            return request.run_id_prefix
        return derive.run_id(self._actions_env().admission_key, identity)

    @refusals
    async def Doctor(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.DoctorReport:
        await self._activation_unchanged()
        audit_ready = await self.audit_ready()
        document = await reads.doctor(
            self.store, audit_ready=audit_ready, recovery_only=self.recovery_only
        )
        return doctor_message(document)

    @refusals
    async def RunAction(
        self, request: pb.RunActionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ActionReply:
        await self._activation_unchanged()
        wait = request.verdict_wait_ms / 1000 if request.HasField("verdict_wait_ms") else None
        document = await actions.run_action(
            self._actions_env(), request.run_id, request.action, request.reason, wait
        )
        return pb.ActionReply(status=status_message(document), result=document["result"])

    @refusals
    async def OperatorAction(
        self, request: pb.OperatorActionRequest, context: grpc.aio.ServicerContext
    ) -> pb.OperatorActionReply:
        await self._activation_unchanged()
        document = await operator.operator_action(
            self._actions_env(), request.action, members_of(request.action, request)
        )
        return operator_answer_message(document)

    @refusals
    async def Check(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.Health:
        return await store_health(self.store)

    @refusals
    async def Metrics(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.MetricsText:
        return pb.MetricsText(text=await self.metrics_text())

    async def metrics_text(self) -> str:
        """The run and hold gauges read from the store, and this process's series."""
        return merge([await reads.metrics_text(self.store), exposition(self._registry)])


async def serve(
    runtime: Runtime,
    started: asyncio.Event | None = None,
    audit_ready: AuditProbe | None = None,
) -> None:
    """Open the store, verify the activation, serve Recovery until cancelled.

    ``audit_ready`` answers the doctor's ``auditReady``; by default auditd is asked over
    the internal channel.
    """
    store = Store(runtime, "recovery")
    audit_channel = channel(runtime.endpoints, "auditd") if audit_ready is None else None
    if audit_channel is not None:
        audit_ready = audit_probe_over_grpc(pb_grpc.AuditStub(audit_channel))
    assert audit_ready is not None
    refuse_retired_settings(os.environ)
    http = ProductHttp()
    env = RecoveryEnv.from_store(store, http, recovery_only=runtime.recovery_only)
    service = RecoveryService(
        store, recovery_only=runtime.recovery_only, audit_ready=audit_ready, env=env
    )
    grpc_server = server(runtime.endpoints, "recovery")
    pb_grpc.add_RecoveryServicer_to_server(service, grpc_server)
    try:
        await store.open()
        await store.verify()
        # A recovery-only instance starts despite a live binding conflict (it only logs it)
        # so that an operator can inspect the runs concerned.
        await verify_live_bindings(store, refuse=not runtime.recovery_only)
        await grpc_server.start()
        logs.serving("recovery", logs.internal_address(runtime.endpoints.address("recovery")))
        if started is not None:
            started.set()
        async with own_metrics(runtime, "recovery", service.metrics_text):
            await grpc_server.wait_for_termination()
    finally:
        # grpc.aio begins its own shutdown when wait_for_termination is cancelled, and this
        # stop then raises CancelledError; the store must be closed all the same.
        with contextlib.suppress(asyncio.CancelledError):
            await grpc_server.stop(grace=2.0)
        if audit_channel is not None:
            await audit_channel.close()
        await http.close()
        await store.close()
