"""Running the gateway: the token verifier, the gRPC backend and two uvicorn servers.

:func:`serve` is what the launcher calls. The main listener (``deployment.listener.bind``)
serves the public API; the metrics listener (``deployment.metricsListener.bind``), when
configured, serves ``/metrics`` and nothing else. Both run in this process and this event
loop. The sockets are bound here, before uvicorn starts, so a busy or forbidden address
becomes a clear ``deployment.refused`` instead of uvicorn leaving the process.

Signals are the launcher's business: uvicorn's own handlers are not installed. The servers
stop gracefully when ``stop`` is set or when the task running :func:`serve` is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator, Sequence
from typing import Final

import httpx
import uvicorn
from starlette.types import ASGIApp

from core import logs
from core.codes import Code
from core.errors import CoordinatorError
from core.listen import bind_socket
from core.runtime import Runtime
from gateway.app import create_app, create_metrics_app
from gateway.auth import TokenVerifier, jwks_source_for
from gateway.backend import GrpcBackend
from gateway.completions import AdmissionProducers, CompletionHandler, load_credentials
from gateway.events import EventHandler, load_sources
from gateway.routes import GatewayContext

log = logging.getLogger("coordinator.gateway")

JWKS_TIMEOUT_SECONDS: Final = 5.0
KEY_RETRY_SECONDS: Final = 5.0
GRACEFUL_SHUTDOWN_SECONDS: Final = 10


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the launcher."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _config(app: ASGIApp) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )


async def serve_apps(
    listeners: Sequence[tuple[ASGIApp, socket.socket]], stop: asyncio.Event | None = None
) -> None:
    """Serve each app on its socket until ``stop`` is set or the caller cancels.

    A server that ends by itself takes the others down and is reported as an error.
    """
    servers = [_Server(_config(app)) for app, _ in listeners]
    tasks = [
        asyncio.create_task(server.serve(sockets=[sock]), name="gateway-listener")
        for server, (_, sock) in zip(servers, listeners, strict=True)
    ]
    stop_task = asyncio.create_task((stop or asyncio.Event()).wait(), name="gateway-stop")
    try:
        done, _ = await asyncio.wait([*tasks, stop_task], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for server in servers:
            server.should_exit = True
        stop_task.cancel()
        # Shielded so a cancelled caller still waits for in-flight answers to finish.
        results = await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
        for _, sock in listeners:
            sock.close()
    if stop_task not in done:
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise failures[0]
        raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "a gateway listener stopped by itself")


async def _fetch_keys(verifier: TokenVerifier, stopping: asyncio.Event) -> None:
    # Until the issuer's keys are held, /ready says so; keep asking at a slow pace so a
    # gateway started while the issuer was down becomes ready without any request.
    while not await verifier.refresh():
        log.warning("the issuer's signing keys could not be fetched; retrying")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), KEY_RETRY_SECONDS)
        if stopping.is_set():
            return


def gateway_context(
    runtime: Runtime,
    verifier: TokenVerifier,
    backend: GrpcBackend,
    producers: AdmissionProducers | None = None,
) -> GatewayContext:
    """The routes' context for ``runtime``; with ``producers`` (admission's producer calls)
    the completion and signed event routes accept what their credentials allow."""
    deployment = runtime.config.deployment
    completions = events = None
    if producers is not None:
        completions = CompletionHandler(
            load_credentials(runtime.config, runtime.resolver),
            producers.review_completion,
            recovery_only=runtime.recovery_only,
        )
        events = EventHandler(
            load_sources(runtime.config, runtime.resolver),
            producers.start_from_event,
            recovery_only=runtime.recovery_only,
        )
    return GatewayContext(
        backend=backend,
        verifier=verifier,
        policies=deployment.authentication.policies,
        public_url=deployment.listener.public_url,
        completions=completions,
        events=events,
    )


async def serve(runtime: Runtime, *, stop: asyncio.Event | None = None) -> None:
    """Run the gateway for ``runtime`` until ``stop`` is set or the task is cancelled."""
    deployment = runtime.config.deployment
    authentication = deployment.authentication
    stopping = asyncio.Event()
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(JWKS_TIMEOUT_SECONDS), follow_redirects=False
    ) as client:
        source = jwks_source_for(authentication, runtime.resolver, client)
        verifier = TokenVerifier.from_settings(authentication, source)
        backend = GrpcBackend(runtime.endpoints, recovery_only=runtime.recovery_only)
        producers = AdmissionProducers(runtime.endpoints)
        ctx = gateway_context(runtime, verifier, backend, producers)
        sockets: list[socket.socket] = []
        try:
            sockets.append(bind_socket(deployment.listener.bind))
            if deployment.metrics_listener is not None:
                sockets.append(bind_socket(deployment.metrics_listener.bind))
        except CoordinatorError:
            for sock in sockets:
                sock.close()
            await producers.close()
            raise
        listeners: list[tuple[ASGIApp, socket.socket]] = [(create_app(ctx), sockets[0])]
        if len(sockets) > 1:
            listeners.append((create_metrics_app(ctx), sockets[1]))
        keys = asyncio.create_task(_fetch_keys(verifier, stopping), name="gateway-keys")
        logs.serving("gateway", f"http://{deployment.listener.bind} (the API)")
        if deployment.metrics_listener is not None:
            logs.serving("gateway", f"http://{deployment.metrics_listener.bind} (metrics)")
        try:
            await serve_apps(listeners, stop)
        finally:
            stopping.set()
            keys.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keys
            await backend.close()
            await producers.close()
