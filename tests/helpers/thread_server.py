"""An ASGI app served by uvicorn on a loopback port, from a thread of the test process.

For tests that drive a real client at an app in-process, such as the browser tests of
``tests/console``: the browser is another process and needs a socket. The socket is bound
and listening before the server thread starts, so the URL answers as soon as it is handed
out (connections wait in the backlog until uvicorn accepts them; nothing polls). The server
runs its own event loop in its thread; the test's thread may be inside another one (the
sync Playwright API keeps one running between its calls).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

LOOPBACK = "127.0.0.1"
STOP_TIMEOUT_SECONDS = 10.0


@contextlib.contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Serve ``app`` on ``127.0.0.1:<ephemeral port>`` for the block; yields its base URL."""
    sock = socket.socket()
    sock.bind((LOOPBACK, 0))
    sock.listen()
    port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        app, loop="asyncio", http="h11", lifespan="off", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_SECONDS)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"the server on port {port} did not stop")
