"""Running the gateway: the token verifier, the gRPC backend and two uvicorn servers.

:func:`serve` is what the launcher calls. The main listener (``deployment.listener.bind``)
serves the public API; the metrics listener (``deployment.metricsListener.bind``), when
configured, serves ``/metrics`` and nothing else. Both run in this process and this event
loop. The sockets are bound here, before uvicorn starts, so a busy or forbidden address
becomes a clear ``deployment.refused`` instead of uvicorn leaving the process.

Both listeners hold each client to ``deployment.listener``'s limits: a request's head must
arrive within ``headerTimeoutSeconds``, and beyond ``maxConnections`` open connections a
request is answered 503 ``service.unavailable`` as a problem (:class:`_LimitedH11Protocol`).

Signals are the launcher's business: uvicorn's own handlers are not installed. The servers
stop gracefully when ``stop`` is set or when the task running :func:`serve` is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Generator, Sequence
from typing import Final

import h11
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from core import logs
from core.codes import Code
from core.config.model import DEFAULT_HEADER_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS
from core.errors import CoordinatorError
from core.listen import bind_socket
from core.runtime import Runtime
from gateway.app import create_app, create_metrics_app
from gateway.auth import TokenVerifier, issuer_client, jwks_source_for
from gateway.backend import GrpcBackend
from gateway.completions import AdmissionProducers, CompletionHandler, load_credentials
from gateway.events import EventHandler, load_sources
from gateway.problems import problem_response
from gateway.routes import GatewayContext

log = logging.getLogger("coordinator.gateway")

JWKS_TIMEOUT_SECONDS: Final = 5.0
KEY_RETRY_SECONDS: Final = 5.0
GRACEFUL_SHUTDOWN_SECONDS: Final = 10
LIMIT_NOTICE_INTERVAL_SECONDS: Final = 10.0


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the launcher."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class _Config(uvicorn.Config):
    """uvicorn's settings for one listener, with the limits :class:`_LimitedH11Protocol` reads."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_connections: int,
        header_timeout: float,
        on_over_limit: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            app,
            http=_LimitedH11Protocol,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
            # Not uvicorn's own limit_concurrency: it answers 503 in plain text, and CONTRACT
            # §8 makes every error a problem document. The protocol does the counting.
            limit_concurrency=None,
        )
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.on_over_limit = on_over_limit


class _LimitedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11) with a bound on request heads and on connections.

    uvicorn (0.55 as this is written) bounds the idle time between two requests
    (``timeout_keep_alive``) but neither the wait for a new connection's first request nor
    the time a head takes once its first bytes came, so a client sending a byte now and then
    holds a connection forever. Named here rather than left to "auto", the protocol stays h11
    with these bounds even where httptools is installed.
    Here, whenever the connection waits for a request (h11's ``IDLE``), the whole head must
    arrive within ``header_timeout`` of the wait starting; bytes trickling in do not restart
    it. A late head is not answered: no request was received to answer, and the connection
    is closed as uvicorn closes an idle one.

    The app is wrapped so that a request arriving while more than ``max_connections``
    connections are open, or more requests than that are running (uvicorn's own two counts,
    each including this one), is answered 503 ``service.unavailable`` and its connection
    closed, leaving the app untouched.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, object],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        if not isinstance(config, _Config):
            raise TypeError("the gateway's HTTP protocol needs the gateway's uvicorn config")
        self._header_timeout = config.header_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self.app = _within_limit(
            config.max_connections, server_state, self.app, config.on_over_limit
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._bound_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._bound_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._bound_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _bound_head(self) -> None:
        # Called after every step that can start or end the wait for a request's head.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self._header_timeout, self._head_late)
        else:
            self._stop_head_timer()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.conn.send(h11.ConnectionClosed())
            self.transport.close()


def _within_limit(
    limit: int,
    state: ServerState,
    app: ASGIApp,
    on_over_limit: Callable[[], None] | None = None,
) -> ASGIApp:
    last_notice = -LIMIT_NOTICE_INTERVAL_SECONDS

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal last_notice
        if len(state.connections) > limit or len(state.tasks) > limit:
            if on_over_limit is not None:
                on_over_limit()
            # Said at most every 10 s: under a flood, one line per refusal would be a flood.
            now = time.monotonic()
            if now - last_notice >= LIMIT_NOTICE_INTERVAL_SECONDS:
                last_notice = now
                log.warning(
                    "at deployment.listener.maxConnections (%d): answering 503 meanwhile", limit
                )
            refusal = problem_response(
                Code.SERVICE_UNAVAILABLE,
                "the service is answering as many connections as it is allowed; retry shortly",
                instance=None,
                headers={"Connection": "close"},
            )
            await refusal(scope, receive, send)
            return
        await app(scope, receive, send)

    return limited


async def serve_apps(
    listeners: Sequence[tuple[ASGIApp, socket.socket]],
    stop: asyncio.Event | None = None,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_SECONDS,
    on_over_limit: Callable[[], None] | None = None,
) -> None:
    """Serve each app on its socket until ``stop`` is set or the caller cancels, each
    listener with ``max_connections`` and ``header_timeout`` (seconds); ``on_over_limit`` is
    called for each request answered 503 for being over the limit (the gateway counts it).

    A server that ends by itself takes the others down and is reported as an error.
    """
    servers = [
        _Server(
            _Config(
                app,
                max_connections=max_connections,
                header_timeout=header_timeout,
                on_over_limit=on_over_limit,
            )
        )
        for app, _ in listeners
    ]
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
            async with asyncio.timeout(KEY_RETRY_SECONDS):
                await stopping.wait()
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


async def serve(
    runtime: Runtime,
    started: asyncio.Event | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the gateway for ``runtime`` until ``stop`` is set or the task is cancelled;
    ``started`` is set once its listeners accept connections."""
    deployment = runtime.config.deployment
    authentication = deployment.authentication
    stopping = asyncio.Event()
    async with issuer_client(JWKS_TIMEOUT_SECONDS) as client:
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
        if started is not None:
            # The sockets listen already (bound above): a connection made from here on is
            # queued and answered as soon as uvicorn takes it.
            started.set()
        try:
            await serve_apps(
                listeners,
                stop,
                max_connections=deployment.listener.max_connections,
                header_timeout=deployment.listener.header_timeout_seconds,
                on_over_limit=ctx.http_metrics.over_limit,
            )
        finally:
            stopping.set()
            keys.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keys
            await verifier.close()  # a key fetch still running must not outlive its client
            await backend.close()
            await producers.close()
