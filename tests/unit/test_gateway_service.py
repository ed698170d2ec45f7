"""The gateway service on real sockets: both listeners, graceful stop, bind refusals."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.config.model import BindAddress
from core.errors import CoordinatorError
from core.listen import bind_socket
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import server
from core.runtime import load_runtime
from devstack.stack import free_port
from gateway.app import create_app, create_metrics_app
from gateway.service import serve, serve_apps
from tests.helpers.gateway_kit import (
    RUN_A,
    FakeAudit,
    FakeRecovery,
    bearer,
    context,
    gateway_runtime_file,
    mint,
    primed,
)
from tests.helpers.runtime_files import complete_runtime


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def loopback() -> socket.socket:
    return bind_socket(BindAddress("127.0.0.1", 0))


async def test_serve_apps_runs_both_listeners_until_stopped() -> None:
    ctx = await primed(context())
    main_sock, metrics_sock = loopback(), loopback()
    main_url = f"http://127.0.0.1:{port_of(main_sock)}"
    metrics_url = f"http://127.0.0.1:{port_of(metrics_sock)}"
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve_apps([(create_app(ctx), main_sock), (create_metrics_app(ctx), metrics_sock)], stop)
    )
    async with httpx.AsyncClient() as client:
        ready = await client.get(main_url + "/ready")
        not_here = await client.get(main_url + "/metrics")
        scraped = await client.get(metrics_url + "/metrics")
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    assert not_here.status_code == 404 and not_here.json()["code"] == "not-found"
    assert scraped.status_code == 200
    assert 'coordinator_http_requests_total{route="/ready",status="200"} 1.0' in scraped.text
    stop.set()
    await asyncio.wait_for(task, 15)
    assert main_sock.fileno() == -1  # closed


async def test_cancelling_serve_apps_stops_the_servers() -> None:
    ctx = await primed(context())
    sock = loopback()
    url = f"http://127.0.0.1:{port_of(sock)}/ready"
    task = asyncio.create_task(serve_apps([(create_app(ctx), sock)]))
    async with httpx.AsyncClient() as client:
        assert (await client.get(url)).status_code == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    assert sock.fileno() == -1


def test_a_busy_address_is_refused() -> None:
    busy = loopback()
    try:
        with pytest.raises(CoordinatorError) as refused:
            bind_socket(BindAddress("127.0.0.1", port_of(busy)))
        assert refused.value.code == "deployment.refused"
        assert "EADDRINUSE" in refused.value.detail
    finally:
        busy.close()


@pytest.fixture
def sockets_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gws-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def test_serve_runs_the_gateway_of_a_runtime_file(tmp_path: Path, sockets_dir: Path) -> None:
    document = complete_runtime(tmp_path)
    main_port, metrics_port = free_port(), free_port()
    document["deployment"]["listener"]["bind"] = f"127.0.0.1:{main_port}"
    runtime = load_runtime(gateway_runtime_file(tmp_path, document, sockets_dir, metrics_port))

    recovery, audit = FakeRecovery(), FakeAudit()
    servers = [server(runtime.endpoints, name) for name in ("recovery", "auditd")]
    pb_grpc.add_RecoveryServicer_to_server(recovery, servers[0])
    pb_grpc.add_AuditServicer_to_server(audit, servers[1])
    for srv in servers:
        await srv.start()

    now = int(time.time())
    token = mint("alice", "intake-portal", iat=now - 5, exp=now + 300)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(runtime, stop=stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{main_port}") as client:
            status = await client.get(f"/v1/runs/{RUN_A}", headers=bearer(token))
            ready = await client.get("/ready")
            missing = await client.get("/v1/runs/nope", headers=bearer(token))
        async with httpx.AsyncClient() as scrape:
            metrics = await scrape.get(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        for srv in servers:
            await srv.stop(None)

    assert status.status_code == 200, status.text
    assert status.json()["runId"] == RUN_A
    assert [(r.action, r.outcome) for r in audit.records] == [
        ("status", "ok"),
        ("status", "not-found"),
    ]
    # admission and dispatcher are not running in this test.
    assert ready.status_code == 503
    assert "admission-unavailable" in ready.json()["reasons"]
    assert missing.json()["instance"] == "https://coordinator.example.org/v1/runs/nope"
    assert 'coordinator_component_up{component="recovery"} 1.0' in metrics.text
