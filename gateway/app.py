"""The gateway's Starlette applications: the main listener and the metrics listener.

:func:`create_app` serves the public API (never ``/metrics``); :func:`create_metrics_app`
serves ``/metrics`` only. Both answer every error as a problem document: domain refusals
through :mod:`gateway.problems`, the router's 404/405 as ``not-found`` /
``method-not-allowed``, and anything unexpected as a bare 500 whose correlation id is
written, with the traceback, to the server's log — never to the caller.
"""

from __future__ import annotations

import logging
from typing import Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import CoordinatorError
from gateway.metrics import UNMATCHED_ROUTE, HttpMetrics
from gateway.problems import (
    coordinator_error_handler,
    correlation_id,
    http_exception_handler,
    instance_for,
    internal_response,
)
from gateway.routes import GatewayContext, main_routes, metrics_routes

log = logging.getLogger("coordinator.gateway")

_NO_STORE: Final = (b"cache-control", b"no-store")


class GatewayMiddleware:
    """Outermost layer: catches what nothing else handled, counts answers by route template,
    and marks every answer ``Cache-Control: no-store`` (they describe live state)."""

    def __init__(
        self, app: ASGIApp, *, metrics: HttpMetrics | None, public_url: str | None
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.public_url = public_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"cache-control" for name, _ in headers):
                    headers.append(_NO_STORE)
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception:
            correlation = correlation_id()
            log.exception("unexpected failure [correlation %s]", correlation)
            if not started:
                path = str(scope.get("path", ""))
                response = internal_response(
                    correlation, instance=instance_for(path, self.public_url)
                )
                await response(scope, receive, send_wrapper)
        finally:
            if self.metrics is not None:
                self.metrics.observe(_template(scope), status)


def _template(scope: Scope) -> str:
    route = scope.get("route")
    if isinstance(route, Route):
        return route.path
    return UNMATCHED_ROUTE


def _build(routes: list[BaseRoute], ctx: GatewayContext, metrics: HttpMetrics | None) -> Starlette:
    app = Starlette(
        debug=False,
        routes=routes,
        middleware=[
            Middleware(GatewayMiddleware, metrics=metrics, public_url=ctx.public_url),
        ],
        exception_handlers={
            CoordinatorError: coordinator_error_handler,
            HTTPException: http_exception_handler,
        },
    )
    # "/v1/runs/" is an unknown route, not a redirect to "/v1/runs".
    app.router.redirect_slashes = False
    app.state.gateway = ctx
    app.state.public_url = ctx.public_url
    return app


def create_app(ctx: GatewayContext) -> Starlette:
    """The main listener's app: the public API of CONTRACT §8.2, without ``/metrics``."""
    return _build(list(main_routes()), ctx, ctx.http_metrics)


def create_metrics_app(ctx: GatewayContext) -> Starlette:
    """The metrics listener's app: ``GET /metrics`` and nothing else."""
    return _build(list(metrics_routes()), ctx, None)
