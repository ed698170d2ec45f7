"""The dispatcher component: its gRPC service (health and metrics) and its startup.

:func:`serve` is what the launcher runs: open the dispatcher's store, verify the
activation, then claim and execute due work until cancelled (SIGTERM), and stop within the
shutdown budget — work not yet sent is given back, commands still unanswered become
uncertain. In ``--recovery-only`` mode it never dispatches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import grpc

from core import logs
from core.bindings import verify_live_bindings
from core.own_metrics import own_metrics
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.errors import refusals
from core.rpc.transport import server
from core.runtime import Runtime, Store
from core.store_health import store_health
from dispatcher.crash_points import crash_points_from
from dispatcher.engine import Dispatcher, product_client
from dispatcher.metrics import DispatchMetrics
from dispatcher.settings import DispatchSettings

log = logging.getLogger("coordinator.dispatcher")

GRPC_STOP_GRACE_SECONDS = 1.0


class DispatcherService(pb_grpc.DispatcherServicer):
    """Health and metrics of one dispatcher process."""

    def __init__(self, store: Store, metrics: DispatchMetrics) -> None:
        self.store = store
        self.metrics = metrics

    @refusals
    async def Check(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.Health:
        return await store_health(self.store)

    @refusals
    async def Metrics(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.MetricsText:
        return pb.MetricsText(text=self.metrics.render())


async def serve(
    runtime: Runtime,
    started: asyncio.Event | None = None,
    *,
    settings: DispatchSettings | None = None,
) -> None:
    """Run the dispatcher until cancelled; ``started`` is set once it serves."""
    store = Store(runtime, "dispatcher")
    metrics = DispatchMetrics()
    # Without an internal address (replicas on a private network) nothing asks a dispatcher
    # for its health over gRPC: it serves no gRPC, only its own metrics listener if set.
    grpc_server = None
    if "dispatcher" in runtime.endpoints.addresses:
        grpc_server = server(runtime.endpoints, "dispatcher")
        pb_grpc.add_DispatcherServicer_to_server(DispatcherService(store, metrics), grpc_server)
    http = product_client(os.environ)

    async def series() -> str:
        return metrics.render()

    try:
        await store.open()
        await store.verify()
        if not runtime.recovery_only:
            # Dispatching under settings a run in flight was not admitted with is refused.
            await verify_live_bindings(store)
        async with own_metrics(runtime, "dispatcher", series):
            if grpc_server is not None:
                await grpc_server.start()
                address = runtime.endpoints.address("dispatcher")
                logs.serving("dispatcher", logs.internal_address(address))
            if started is not None:
                started.set()
            if runtime.recovery_only:
                # A recovery-only instance never dispatches (CONTRACT §2.1); it still
                # answers health checks if started by hand, until it is cancelled.
                await asyncio.Event().wait()
            dispatcher = Dispatcher.from_store(
                store,
                http,
                settings=settings,
                metrics=metrics,
                # Read once here, never on the send path: only the kill -9 tests set it.
                crash_points=crash_points_from(os.environ),
            )
            await dispatcher.run()
    finally:
        with contextlib.suppress(Exception):
            if grpc_server is not None:
                await grpc_server.stop(grace=GRPC_STOP_GRACE_SECONDS)
        with contextlib.suppress(Exception):
            await http.close()
        await store.close()
