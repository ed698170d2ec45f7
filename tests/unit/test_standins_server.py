"""Stand-ins behind a real uvicorn server: dropped connections, and the Casework command line."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from devstack.products import casework
from devstack.products.casework import CaseworkStandIn
from devstack.products.common import StandIn, StandInSettings
from devstack.products.messaging import MessagingStandIn
from tests.helpers.devstack_kit import ISSUER_URL, FakeClock, HostRouter, make_issuer

CLIENT = "coordinator"
COMMAND = {"template": "t", "recipientRef": "r", "parameters": {}}


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
    server = uvicorn.Server(
        uvicorn.Config(stand_in, lifespan="off", log_level="critical", access_log=False)
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))

    def token(scope: str) -> str:
        return issuer.state.mint(
            client_id=CLIENT, subject=CLIENT, audience=base_url, scope=scope, now=clock()
        )

    try:
        yield stand_in, base_url, token
    finally:
        server.should_exit = True
        await task
        await stand_in.aclose()
        await http.aclose()
        sock.close()


def headers(token: str, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Idempotency-Key": key}


@pytest.mark.parametrize(("mode", "processed"), [("drop-after", 1), ("drop-before", 0)])
async def test_dropped_connection_gets_no_answer(tmp_path: Path, mode: str, processed: int) -> None:
    async with (
        serving(tmp_path, MessagingStandIn) as (_, base_url, token),
        httpx.AsyncClient(base_url=base_url, timeout=10.0) as client,
    ):
        await client.post("/dev/faults", json={"mode": mode, "count": 1})
        send_token = token("messages:send")
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await client.post(
                "/v1/profiles/p/messages", json=COMMAND, headers=headers(send_token, "k-1")
            )
        stats = (await client.get("/dev/stats")).json()
        assert stats["processed"].get("k-1", 0) == processed
        # The same key again, on a new connection: answered, and still processed once.
        again = await client.post(
            "/v1/profiles/p/messages", json=COMMAND, headers=headers(send_token, "k-1")
        )
        assert again.status_code == 202
        stats = (await client.get("/dev/stats")).json()
        assert stats["processed"] == {"k-1": 1}


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
