"""Serving a stand-in under uvicorn, with the one thing ASGI cannot do: drop a connection.

The ``drop-before`` and ``drop-after`` faults must end the client's connection without a
byte of answer. ASGI gives an application no message for that: an application that raises
before answering gets a 500 from the server, and one that returns without answering gets
a 500 as well. Only the server holds the socket.

So the stand-ins are served with :class:`DroppingH11Protocol`, uvicorn's HTTP/1.1 protocol
handed to uvicorn through its public ``http`` setting (as the gateway does with its own
protocol). Each instance serves one connection, keeps the transport asyncio gives it in
``connection_made`` and puts a function that aborts that transport in the ``state`` its
server copies into every request's scope (``scope["state"]``, the ASGI lifespan state).
:func:`devstack.products.faults.drop_connection` calls it. The function is per connection,
so a request can only ever drop its own.

This relies on two things uvicorn does by design rather than by accident: it builds its
protocol with ``config``, ``server_state`` and ``app_state`` keywords (the contract of a
custom ``http`` class), and it copies ``app_state`` into each request's scope. It reads no
attribute of uvicorn's request cycle. The first way, finding the transport through the
``receive`` callable's owner, broke when uvicorn ran on uvloop, whose transports are not
``asyncio.BaseTransport``: the stand-in then answered 500 instead of dropping.
"""

from __future__ import annotations

import asyncio
from typing import Final

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from devstack.products.faults import ABORT_STATE_KEY

LOG_LEVEL: Final = "warning"
GRACEFUL_SHUTDOWN_SECONDS: Final = 5


class DroppingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose requests can abort their own connection (see the module)."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, object],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._own_transport: asyncio.Transport | None = None
        # A copy per connection: the server's own app_state is shared by all of them.
        state = {**app_state, ABORT_STATE_KEY: self._abort}
        super().__init__(config, server_state, state, _loop)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._own_transport = transport
        super().connection_made(transport)

    def _abort(self) -> None:
        # abort(), not close(): close() would still flush what is buffered, abort() throws
        # it away, so the peer sees its connection end (EOF or a reset) and no answer.
        transport = self._own_transport
        if transport is not None and not transport.is_closing():
            transport.abort()


def server_config(app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0) -> uvicorn.Config:
    """How a stand-in is served, by ``python -m devstack.products.<name>`` and by the tests
    that need a real socket. The event loop is left to uvicorn (uvloop where installed)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=DroppingH11Protocol,
        log_level=LOG_LEVEL,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
