"""Stand-ins behind a real uvicorn server: dropped connections, and the Casework command line.

The server is configured by :func:`devstack.products.serving.server_config`, as
``python -m devstack.products.<name>`` configures it, and runs in a thread of its own so
that uvicorn picks its event loop itself (uvloop where it is installed), as it does in the
local stack. A drop that works only on asyncio's own loop passed these tests once while the
local stack answered 500 instead.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from core.products.http import CONNECTION_LOST, ExchangeFailure, ProductHttp
from devstack.products import casework
from devstack.products.casework import CaseworkStandIn
from devstack.products.common import StandIn, StandInSettings
from devstack.products.messaging import MessagingStandIn
from devstack.products.serving import server_config
from tests.helpers.devstack_kit import ISSUER_URL, FakeClock, HostRouter, make_issuer

CLIENT = "coordinator"
COMMAND = {"template": "t", "recipientRef": "r", "parameters": {}}
MESSAGES = "/v1/profiles/p/messages"
STOP_SECONDS = 10.0


@asynccontextmanager
async def serving(
    tmp_path: Path, kind: Callable[..., StandIn]
) -> AsyncIterator[tuple[StandIn, str, Callable[[str], str]]]:
    """Serve a stand-in on a loopback port; yields (stand-in, base URL, token maker)."""
    clock = FakeClock()
    issuer = make_issuer(tmp_path / "issuer", [], clock)
    # Listening before uvicorn starts means no wait for readiness: connections queue.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    http = httpx.AsyncClient(transport=HostRouter({ISSUER_URL: issuer.app}))
    settings = StandInSettings(
        base_url=base_url, issuer=ISSUER_URL, allowed_clients=frozenset({CLIENT})
    )
    stand_in = kind(settings, http=http, clock=clock)
    server = uvicorn.Server(server_config(stand_in))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="stand-in", daemon=True
    )
    thread.start()

    def token(scope: str) -> str:
        return issuer.state.mint(
            client_id=CLIENT, subject=CLIENT, audience=base_url, scope=scope, now=clock()
        )

    try:
        yield stand_in, base_url, token
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, STOP_SECONDS)
        sock.close()
        assert not thread.is_alive(), "the stand-in's server did not stop"


def headers(token: str, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Idempotency-Key": key}


async def raw_post(base_url: str, path: str, head: dict[str, str], body: bytes) -> bytes:
    """Every byte a plain socket gets back for one request, until the connection ends."""
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    reader, writer = await asyncio.open_connection(host, port)
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in head.items()]
    lines.append(f"Content-Length: {len(body)}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    received = b""
    try:
        while chunk := await reader.read(65536):
            received += chunk
    except ConnectionResetError:
        pass  # an aborted connection: what came before the reset is in ``received``
    finally:
        writer.close()
    return received


@pytest.mark.parametrize(("mode", "processed"), [("drop-after", 1), ("drop-before", 0)])
async def test_dropped_connection_gets_no_byte_of_answer(
    tmp_path: Path, mode: str, processed: int
) -> None:
    async with (
        serving(tmp_path, MessagingStandIn) as (_, base_url, token),
        httpx.AsyncClient(base_url=base_url, timeout=10.0) as client,
    ):
        await client.post("/dev/faults", json={"mode": mode, "count": 1})
        send_token = token("messages:send receipts:read")
        received = await raw_post(
            base_url, MESSAGES, headers(send_token, "k-1"), json.dumps(COMMAND).encode()
        )
        stats = (await client.get("/dev/stats")).json()
        receipt = await client.get(
            "/v1/profiles/p/receipts/k-1", headers={"Authorization": f"Bearer {send_token}"}
        )
        # The same key again, on a new connection: answered, and still processed once.
        again = await client.post(MESSAGES, json=COMMAND, headers=headers(send_token, "k-1"))
        after = (await client.get("/dev/stats")).json()
    # Not a status line, not a 500: the connection ended with nothing on it.
    assert received == b""
    assert stats["processed"].get("k-1", 0) == processed
    # drop-after kept the idempotency record: the receipt and the repeat answer from it.
    assert receipt.status_code == (200 if processed else 404)
    assert again.status_code == 202
    if processed:
        assert again.json() == receipt.json()
    assert after["processed"] == {"k-1": 1}


@pytest.mark.parametrize("mode", ["drop-after", "drop-before"])
async def test_the_coordinators_client_sees_a_lost_connection(tmp_path: Path, mode: str) -> None:
    async with (
        serving(tmp_path, MessagingStandIn) as (_, base_url, token),
        httpx.AsyncClient(base_url=base_url, timeout=10.0) as client,
    ):
        await client.post("/dev/faults", json={"mode": mode, "count": 1})
        http = ProductHttp()
        try:
            with pytest.raises(ExchangeFailure) as failure:
                await http.exchange(
                    "POST",
                    base_url + MESSAGES,
                    headers={
                        **headers(token("messages:send"), "k-1"),
                        "Content-Type": "application/json",
                    },
                    body=json.dumps(COMMAND).encode(),
                    timeout=10.0,
                )
        finally:
            await http.close()
    # What inspection reports as the call's cause; the request may have been processed.
    assert (failure.value.cause, failure.value.sent) == (CONNECTION_LOST, True)


async def test_casework_decide_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        serving(tmp_path, CaseworkStandIn) as (_, base_url, token),
        httpx.AsyncClient(base_url=base_url, timeout=10.0) as client,
    ):
        created = await client.post(
            "/v1/projects/reviews/review-requests",
            json={"producer": "coordinator", "subjectRef": "APP-1", "summary": "s"},
            headers=headers(token("review-requests:write"), "k-1"),
        )
        review_id = created.json()["reviewId"]
        listed = await asyncio.to_thread(
            casework.main, ["list", "--url", base_url, "--project", "reviews"]
        )
        listing: dict[str, Any] = json.loads(capsys.readouterr().out)
        decide = ["decide", "--url", base_url, "--project", "reviews", "--review-id", review_id]
        code = await asyncio.to_thread(casework.main, [*decide, "--outcome", "rejected"])
        decided = json.loads(capsys.readouterr().out)
        again = await asyncio.to_thread(casework.main, [*decide, "--outcome", "approved"])
        read = await client.get(
            f"/v1/projects/reviews/review-requests/{review_id}",
            headers={"Authorization": f"Bearer {token('review-requests:read')}"},
        )
    assert listed == 0
    assert [r["reviewId"] for r in listing["reviews"]] == [review_id]
    assert code == 0
    assert decided["decision"]["outcome"] == "rejected"
    assert again == 1
    assert "review.already-decided" in capsys.readouterr().err
    assert read.json()["decision"]["outcome"] == "rejected"
