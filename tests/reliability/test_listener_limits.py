"""What one client can hold of the gateway's listeners, on real sockets and a real uvicorn.

A request's head (request line and headers) must arrive in full within
``deployment.listener.headerTimeoutSeconds`` of the connection opening, or of the previous
answer on it; otherwise the server closes the connection, answering nothing. Beyond
``deployment.listener.maxConnections`` open connections, a request is answered 503
``service.unavailable`` as a problem document (CONTRACT §8) and its connection closed.

Every wait here is for something the server does (close a connection, enter the app), never
for time to pass; the module's timeout only guards against a server that never does it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from core import logs
from core.codes import Code
from core.config import load_runtime_file
from core.config.model import (
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    DEFAULT_MAX_CONNECTIONS,
    BindAddress,
)
from core.errors import CoordinatorError
from core.listen import bind_socket
from core.runtime import load_runtime
from devstack.stack import free_port
from gateway.metrics import OVER_LIMIT_ROUTE, HttpMetrics
from gateway.service import serve, serve_apps
from tests.helpers.gateway_kit import gateway_runtime_file
from tests.helpers.runtime_files import complete_runtime, write_runtime

pytestmark = pytest.mark.timeout(60)

PROBLEM = "application/problem+json"


class HeldApp:
    """Answers 200 ``ok``; a request for ``/hold`` first waits until ``release`` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/hold":
            self.entered.set()
            await self.release.wait()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")],
            }
        )
        await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def serving(
    app: Any,
    *,
    max_connections: int = 100,
    header_timeout: float = 30.0,
    on_over_limit: Callable[[], None] | None = None,
) -> AsyncIterator[int]:
    sock = bind_socket(BindAddress("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve_apps(
            [(app, sock)],
            stop,
            max_connections=max_connections,
            header_timeout=header_timeout,
            on_over_limit=on_over_limit,
        )
    )
    try:
        yield port
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: coordinator\r\nConnection: close\r\n\r\n".encode()


async def exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` on a new connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    return await answer(reader, writer)


async def answer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[int, dict[str, str], bytes]:
    raw = await reader.read()  # to the end: the server has closed the connection
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


async def closed_unanswered(reader: asyncio.StreamReader) -> bool:
    """True once the server closes the connection having sent nothing."""
    return await reader.read() == b""


# ------------------------------------------------------------------------------ request heads


async def test_a_client_that_stalls_in_its_request_head_is_cut_off() -> None:
    async with serving(HeldApp(), header_timeout=0.5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ready HTTP/1.1\r\nHost: coordinator\r\nX-Slow: ")
        await writer.drain()
        assert await closed_unanswered(reader)
        writer.close()


async def test_a_connection_that_never_sends_a_request_is_cut_off() -> None:
    async with serving(HeldApp(), header_timeout=0.5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_unanswered(reader)
        writer.close()


async def test_the_next_request_head_on_a_kept_alive_connection_is_bounded_too() -> None:
    async with serving(HeldApp(), header_timeout=0.5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ready HTTP/1.1\r\nHost: coordinator\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await reader.readexactly(2) == b"ok"
        # Sending a byte stops uvicorn's idle (keep-alive) timer; only the head's bound is left.
        writer.write(b"GET /ready HTTP/1.1\r\nHost: coor")
        await writer.drain()
        assert await closed_unanswered(reader)
        writer.close()


async def test_a_request_whose_head_arrived_is_not_cut_off_however_long_it_runs() -> None:
    app = HeldApp()
    async with serving(app, header_timeout=0.5) as port:
        held_reader, held_writer = await asyncio.open_connection("127.0.0.1", port)
        held_writer.write(request("/hold"))
        await held_writer.drain()
        await app.entered.wait()
        # A stalled head opened after the held request's head arrived is cut off, so the
        # bound has passed for the held request as well.
        stall_reader, stall_writer = await asyncio.open_connection("127.0.0.1", port)
        stall_writer.write(b"GET /ready HTTP/1.1\r\n")
        await stall_writer.drain()
        assert await closed_unanswered(stall_reader)
        stall_writer.close()
        app.release.set()
        status, _, body = await answer(held_reader, held_writer)
        assert (status, body) == (200, b"ok")


# ------------------------------------------------------------------------------ connections


async def test_beyond_max_connections_a_request_is_answered_503_as_a_problem(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = HeldApp()
    metrics = HttpMetrics()
    async with serving(app, max_connections=1, on_over_limit=metrics.over_limit) as port:
        held_reader, held_writer = await asyncio.open_connection("127.0.0.1", port)
        held_writer.write(request("/hold"))
        await held_writer.drain()
        await app.entered.wait()

        status, headers, body = await exchange(port, request("/ready"))
        assert status == 503
        # Counted, though no route saw it: coordinator_http_requests_total{route="over-limit"}.
        assert metrics.count(OVER_LIMIT_ROUTE, 503) == 1
        assert 'route="over-limit",status="503"} 1.0' in metrics.render()
        assert headers["content-type"] == PROBLEM
        assert headers["connection"] == "close"
        problem = json.loads(body)
        assert problem == {
            "type": Code.SERVICE_UNAVAILABLE.type_uri,
            "title": Code.SERVICE_UNAVAILABLE.info.title,
            "status": 503,
            "detail": problem["detail"],
            "code": "service.unavailable",
        }

        notices = [r for r in caplog.records if "maxConnections" in r.getMessage()]
        assert [(r.levelname, r.getMessage()) for r in notices] == [
            ("WARNING", "at deployment.listener.maxConnections (1): answering 503 meanwhile")
        ]

        app.release.set()
        assert (await answer(held_reader, held_writer))[::2] == (200, b"ok")
        # The held connection is closed (read to its end above): there is room again.
        assert (await exchange(port, request("/ready")))[::2] == (200, b"ok")
        assert metrics.count(OVER_LIMIT_ROUTE, 503) == 1  # an answer in the limit is not


async def test_stalled_heads_count_against_max_connections_until_cut_off() -> None:
    async with serving(HeldApp(), max_connections=1, header_timeout=0.5) as port:
        stall_reader, stall_writer = await asyncio.open_connection("127.0.0.1", port)
        stall_writer.write(b"GET /ready HTTP/1.1\r\n")
        await stall_writer.drain()
        assert (await exchange(port, request("/ready")))[0] == 503
        assert await closed_unanswered(stall_reader)
        stall_writer.close()
        assert (await exchange(port, request("/ready")))[::2] == (200, b"ok")


# ------------------------------------------------------------------------------ runtime file


@pytest.fixture
def sockets_dir() -> Iterator[Path]:
    # Short, so the components' socket paths fit the 107-byte limit of Unix sockets.
    folder = Path(tempfile.mkdtemp(prefix="lim-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@asynccontextmanager
async def api_bound() -> AsyncIterator[asyncio.Event]:
    """An event set when the gateway writes that its API listener is bound."""
    bound = asyncio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("gateway serving on http://"):
                bound.set()

    handler = Seen()
    level = logs.log.level
    logs.log.addHandler(handler)
    logs.log.setLevel(logs.NOTICE)
    try:
        yield bound
    finally:
        logs.log.removeHandler(handler)
        logs.log.setLevel(level)


def runtime_document(tmp_path: Path, listener: dict[str, Any]) -> dict[str, Any]:
    document = complete_runtime(tmp_path)
    document["deployment"]["listener"].update(listener)
    return document


def test_the_limits_default_when_the_runtime_file_leaves_them_out(tmp_path: Path) -> None:
    config = load_runtime_file(write_runtime(tmp_path / "r.yaml", complete_runtime(tmp_path)))
    listener = config.deployment.listener
    assert listener.max_connections == DEFAULT_MAX_CONNECTIONS
    assert listener.header_timeout_seconds == DEFAULT_HEADER_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("maxConnections", 0),
        ("maxConnections", 65536),
        ("maxConnections", "many"),
        ("headerTimeoutSeconds", 0),
        ("headerTimeoutSeconds", 301),
        ("headerTimeoutSeconds", 2.5),
    ],
)
def test_limits_out_of_bounds_are_refused_naming_the_key(
    tmp_path: Path, key: str, value: object
) -> None:
    document = runtime_document(tmp_path, {key: value})
    with pytest.raises(CoordinatorError) as caught:
        load_runtime_file(write_runtime(tmp_path / "r.yaml", document))
    assert caught.value.code is Code.CONFIG_INVALID
    assert caught.value.detail.startswith(f"deployment.listener.{key}")


async def test_the_gateway_serves_with_the_limits_of_its_runtime_file(
    tmp_path: Path, sockets_dir: Path
) -> None:
    port = free_port()
    document = runtime_document(
        tmp_path,
        {"bind": f"127.0.0.1:{port}", "maxConnections": 1, "headerTimeoutSeconds": 1},
    )
    metrics_port = free_port()
    runtime = load_runtime(gateway_runtime_file(tmp_path, document, sockets_dir, metrics_port))

    stop = asyncio.Event()
    async with api_bound() as bound:
        task = asyncio.create_task(serve(runtime, stop=stop))
        # The "serving on" line comes once the listener is bound: a connection made from then
        # on waits in its backlog until uvicorn accepts it.
        await bound.wait()
    try:
        stall_reader, stall_writer = await asyncio.open_connection("127.0.0.1", port)
        stall_writer.write(b"GET /ready HTTP/1.1\r\n")
        await stall_writer.drain()
        status, headers, body = await exchange(port, request("/v1/runs"))
        assert (status, headers["content-type"]) == (503, PROBLEM)
        assert json.loads(body)["code"] == "service.unavailable"
        assert await closed_unanswered(stall_reader)
        stall_writer.close()
        # The refusal is counted on the metrics page, though no route saw the request.
        _, _, page = await exchange(metrics_port, request("/metrics"))
        assert b'coordinator_http_requests_total{route="over-limit",status="503"} 1.0' in page
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
