"""In-process wiring of the development issuer and product stand-ins for tests.

``HostRouter`` is an httpx transport that sends each request to the ASGI application
registered for its host, so an issuer, stand-ins and a fake coordinator can talk to each
other inside one event loop without sockets. A host with no application behaves like a
server that is down (``httpx.ConnectError``).

``run_walkthrough`` runs one of devstack's scripted walk-throughs (the quickstart, the
restore rehearsal) in a child process, as a user would run it with ``make``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp

from devstack.issuer import DevIssuer, IssuerState, RegisteredClient, public_jwk

ISSUER_URL = "http://issuer.test"
MESSAGING_URL = "http://messaging.test"
SCHEDULING_URL = "http://scheduling.test"
BREG_URL = "http://breg.test"
CASEWORK_URL = "http://casework.test"
COORDINATOR_URL = "http://coordinator.test"

START = 1_800_000_000.0
"""A fixed instant (2027-01-15) where every test clock starts."""


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeSleep:
    """An awaitable stand-in for ``asyncio.sleep`` that records the delays and returns."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class HostRouter(httpx.AsyncBaseTransport):
    """Routes each request to the ASGI app registered for its ``host[:port]``."""

    def __init__(self, apps: Mapping[str, ASGIApp] | None = None) -> None:
        self._transports: dict[str, httpx.ASGITransport] = {}
        self.requests: list[httpx.Request] = []
        for host, app in (apps or {}).items():
            self.add(host, app)

    def add(self, host: str, app: ASGIApp) -> None:
        """Serve ``host`` (``issuer.test`` or a full URL) with ``app``."""
        self._transports[httpx.URL(host).netloc.decode() if "://" in host else host] = (
            httpx.ASGITransport(app=app)
        )

    def remove(self, host: str) -> None:
        """Take ``host`` down: its requests now fail to connect."""
        self._transports.pop(httpx.URL(host).netloc.decode() if "://" in host else host, None)

    def serves(self, netloc: str) -> bool:
        """Whether a ``host[:port]`` has an application now."""
        return netloc in self._transports

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        transport = self._transports.get(request.url.netloc.decode())
        if transport is None:
            raise httpx.ConnectError("connection refused", request=request)
        return await transport.handle_async_request(request)


def make_issuer(
    folder: Path, clients: list[RegisteredClient], clock: FakeClock, issuer_url: str = ISSUER_URL
) -> DevIssuer:
    """A development issuer with its state under ``folder``."""
    return DevIssuer(IssuerState.create(folder, issuer_url), clients, clock=clock)


def client_for(
    client_id: str, private_jwk: Mapping[str, Any], scopes: set[str]
) -> RegisteredClient:
    """The registration of a client whose private key the test holds."""
    return RegisteredClient(client_id, (public_jwk(private_jwk),), frozenset(scopes))


ROOT = Path(__file__).resolve().parents[2]


def run_walkthrough(
    module: str,
    state_variable: str,
    expected: Iterable[str],
    afterwards: Callable[[Path], None] | None = None,
) -> None:
    """Run ``python -m module`` from the repository root with its state in a fresh folder
    named by ``state_variable``; check that it exits 0 without a traceback, prints each of
    ``expected``, and leaves no process behind; then ``afterwards(state folder)``, before the
    folder goes."""
    # A short folder: the coordinator's Unix socket paths must fit in about 100 bytes.
    state = Path(tempfile.mkdtemp(prefix="wt-"))
    result = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={**os.environ, state_variable: str(state)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    try:
        assert result.returncode == 0, output[-4000:]
        if afterwards is not None:
            afterwards(state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    assert "Traceback" not in output
    for line in expected:
        assert line in output, line
    # Nothing keeps running: no process still has the state folder on its command line.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(state)], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout.strip() == ""
