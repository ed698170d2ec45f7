"""admission: the gRPC servicer that starts runs and wakes waiting ones, and its startup.

The gateway authenticates and authorizes a start and hands over the verified caller; this
component judges the start itself (admission/start.py) and answers the run's status
document. Starts from signed events (admission/events.py) arrive after the gateway checked
their signature; Casework review completions (admission/completions.py) after it matched
their credentials with a connection.

Before serving, the component verifies the activation and, outside ``--recovery-only``,
that no run in flight depends on connection settings the runtime file changed
(core/bindings.py): a start or a wake-up under changed settings is refused at startup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from admission.completions import CompletionWaker
from admission.events import EventAdmitter
from admission.start import Admitter, parse_input
from core import logs
from core.bindings import verify_live_bindings
from core.documents import status_message
from core.metrics import exposition, new_registry
from core.own_metrics import own_metrics
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.errors import refusals
from core.rpc.transport import server
from core.runtime import Runtime, Store
from core.store_health import refuse_changed_activation, store_health

log = logging.getLogger("coordinator.admission")


class AdmissionService(pb_grpc.AdmissionServicer):
    """Start runs, from the API and from signed events; wake waiting runs; report readiness."""

    def __init__(
        self,
        admitter: Admitter,
        events: EventAdmitter | None = None,
        completions: CompletionWaker | None = None,
    ) -> None:
        self.admitter = admitter
        self.events = events or EventAdmitter.from_admitter(admitter)
        self.completions = completions or CompletionWaker.from_runtime(
            admitter.runtime, admitter.store
        )
        self._registry = new_registry("admission")

    @refusals
    async def Start(
        self, request: pb.StartRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartReply:
        value = parse_input(request.input_json)
        result = await self.admitter.start(
            request.caller, request.workflow_id, request.idempotency_key, value
        )
        return pb.StartReply(
            created=result.created, run_id=result.run_id, status=status_message(result.status)
        )

    @refusals
    async def StartFromEvent(
        self, request: pb.EventRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartReply:
        result = await self.events.start(request.source_key, request.event_id, request.data_json)
        return pb.StartReply(
            created=result.created, run_id=result.run_id, status=status_message(result.status)
        )

    @refusals
    async def ReviewCompletion(
        self, request: pb.CompletionRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        # Starts check the activation inside their own transaction; a wake-up asks first.
        await refuse_changed_activation(self.admitter.store)
        # The answer is the same whether or not a waiting run matched.
        await self.completions.wake(request.connection, request.review_id)
        return pb.Empty()

    @refusals
    async def Check(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.Health:
        return await store_health(self.admitter.store)

    @refusals
    async def Metrics(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.MetricsText:
        return pb.MetricsText(text=await self.metrics_text())

    async def metrics_text(self) -> str:
        """This process's series only: the run and hold gauges come from recovery, which
        reads the whole store."""
        return exposition(self._registry)


async def serve(runtime: Runtime, started: asyncio.Event | None = None) -> None:
    """Open the store, verify the activation, serve Admission until cancelled."""
    store = Store(runtime, "admission")
    admitter = Admitter.from_runtime(runtime, store)
    grpc_server = server(runtime.endpoints, "admission")
    service = AdmissionService(admitter)
    pb_grpc.add_AdmissionServicer_to_server(service, grpc_server)
    try:
        await store.open()
        await store.verify()
        if not runtime.recovery_only:
            await verify_live_bindings(store)
        await grpc_server.start()
        logs.serving("admission", logs.internal_address(runtime.endpoints.address("admission")))
        if started is not None:
            started.set()
        async with own_metrics(runtime, "admission", service.metrics_text):
            await grpc_server.wait_for_termination()
    finally:
        # grpc.aio begins its own shutdown when wait_for_termination is cancelled, and this
        # stop then raises CancelledError; the store must be closed all the same.
        with contextlib.suppress(asyncio.CancelledError):
            await grpc_server.stop(grace=2.0)
        await store.close()
