"""A component's own ``/metrics`` listener, for components spread over hosts or containers.

With ``deployment.internal.metricsPort`` set (TCP internal addresses only), every component
other than the gateway serves its own series on ``<its internal host>:<metricsPort>``, plain
HTTP on the private network, so Prometheus can scrape each one — in particular each of
several dispatchers, which the gateway's merged ``/metrics`` cannot see. A dispatcher listed
without an internal address (replicas) binds the address its host name resolves to: its
container's address on the private network. Only loopback, private and link-local
addresses are accepted, as for every other listener.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from core import logs
from core.codes import Code
from core.config import reader
from core.config.model import BindAddress
from core.errors import ConfigInvalid, CoordinatorError
from core.listen import bind_socket
from core.metrics import CONTENT_TYPE
from core.runtime import Runtime

PATH = "deployment.internal.metricsPort"


def own_bind(port: int) -> BindAddress:
    """``port`` on the address this host's name resolves to (a container's own address),
    which must be private, loopback or link-local like every configured bind."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"{PATH}: this host's name resolves to no address"
        ) from None
    try:
        return reader.bind(f"{address}:{port}", PATH)
    except ConfigInvalid as exc:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"{PATH}: this host's address {address} {exc.reason}"
        ) from None


def own_metrics_bind(runtime: Runtime, component: str) -> BindAddress | None:
    """Where ``component`` serves its own series, or ``None`` when it does not."""
    internal = runtime.config.deployment.internal
    if internal is None or internal.metrics_port is None:
        return None
    listed = internal.addresses.get(component)
    if listed is None:
        return own_bind(internal.metrics_port)
    return BindAddress(listed.host, internal.metrics_port)


@contextlib.asynccontextmanager
async def own_metrics(
    runtime: Runtime, component: str, text: Callable[[], Awaitable[str]]
) -> AsyncIterator[None]:
    """Serve ``GET /metrics`` with ``text()`` while the block runs, if configured."""
    bind = own_metrics_bind(runtime, component)
    if bind is None:
        yield
        return
    sock = bind_socket(bind)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=(await text()).encode(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        logs.serving(component, f"http://{bind}/metrics (its own series)")
        yield
    finally:
        await runner.cleanup()
        sock.close()
