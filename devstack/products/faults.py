"""Fault injection for the stand-ins: delays, failures, held answers, dropped connections.

A fault applies to the next requests of its target (``commands``, ``reads`` or ``all``),
``count`` times or until cleared. The ``-before`` modes act before the idempotency ledger
(nothing is processed); the ``-after`` modes act once the command was processed and
recorded, which is what makes a call *uncertain* for the coordinator.

Dropping a connection needs the socket: under uvicorn, the request's ``receive`` is a method
of the protocol cycle that owns the asyncio transport, and aborting that transport closes
the connection without a byte of answer. Where no transport can be found (an in-process
test transport), :class:`ConnectionDropped` is raised instead, which the test client sees.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass
from typing import Any, TypeGuard

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive


class FaultInvalid(ValueError):
    """A ``/dev/faults`` body that does not describe a fault; the message names the member."""


def is_number(value: object) -> TypeGuard[int | float]:
    """True for JSON numbers (not booleans)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


FAULT_MODES = ("delay", "fail-before", "fail-after", "hang-after", "drop-before", "drop-after")
FAULT_TARGETS = ("commands", "reads", "all")


@dataclass(frozen=True)
class Fault:
    """An injected misbehaviour; ``count`` None means until cleared."""

    mode: str
    seconds: float = 0.0
    count: int | None = None
    target: str = "commands"

    @classmethod
    def from_json(cls, body: object) -> Fault:
        """Parse a ``/dev/faults`` body; refusals name the JSON pointer."""
        if not isinstance(body, dict):
            raise FaultInvalid("the body must be a JSON object")
        unknown = sorted(set(body) - {"mode", "seconds", "count", "target"})
        if unknown:
            raise FaultInvalid(f"/{unknown[0]}: unknown member")
        mode = body.get("mode")
        if mode not in FAULT_MODES:
            raise FaultInvalid(f"/mode: must be one of {', '.join(FAULT_MODES)}")
        seconds = body.get("seconds", 0)
        if not is_number(seconds) or seconds < 0:
            raise FaultInvalid("/seconds: must be a number >= 0")
        count = body.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
            raise FaultInvalid("/count: must be a positive integer")
        if count is not None and count < 1:
            raise FaultInvalid("/count: must be a positive integer")
        target = body.get("target", "commands")
        if target not in FAULT_TARGETS:
            raise FaultInvalid("/target: must be commands, reads or all")
        return cls(mode=mode, seconds=float(seconds), count=count, target=target)

    def to_json(self) -> dict[str, Any]:
        """The JSON form ``/dev/faults`` answers with."""
        return {
            "mode": self.mode,
            "seconds": self.seconds,
            "count": self.count,
            "target": self.target,
        }


class Faults:
    """The active fault, and the requests it holds (``hang-after``)."""

    def __init__(self) -> None:
        self.active: Fault | None = None
        self._remaining: int | None = None
        self._release = asyncio.Event()
        self._changed = asyncio.Condition()
        self.hanging = 0

    def set(self, fault: Fault) -> None:
        """Make ``fault`` the active fault (replacing any other)."""
        self.active = fault
        self._remaining = fault.count

    def clear(self) -> None:
        """Remove the active fault and let held requests answer."""
        self.active = None
        self._remaining = None
        self.release()

    def take(self, kind: str) -> Fault | None:
        """The fault to apply to one request of ``kind`` (commands or reads), counting it."""
        fault = self.active
        if fault is None or fault.target not in (kind, "all"):
            return None
        if self._remaining is not None:
            self._remaining -= 1
            if self._remaining <= 0:
                self.active = None
                self._remaining = None
        return fault

    async def hang(self) -> None:
        """Hold the current request until :meth:`release`."""
        release = self._release
        async with self._changed:
            self.hanging += 1
            self._changed.notify_all()
        try:
            await release.wait()
        finally:
            async with self._changed:
                self.hanging -= 1
                self._changed.notify_all()

    def release(self) -> int:
        """Let every held request answer; returns how many were held."""
        held = self.hanging
        self._release.set()
        self._release = asyncio.Event()
        return held

    async def wait_hanging(self, count: int) -> None:
        """Return once at least ``count`` requests are held (for tests; no polling)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.hanging >= count)


class ConnectionDropped(Exception):
    """Raised instead of dropping when the server gives no socket to close (in-process tests)."""


class Dropped(Exception):
    """The connection was closed on purpose; the answer goes nowhere."""


# uvicorn hands each request its protocol's receive method; its owner holds the transport.
TRANSPORT: contextvars.ContextVar[asyncio.BaseTransport | None] = contextvars.ContextVar(
    "devstack_transport", default=None
)


def transport_of(receive: Receive) -> asyncio.BaseTransport | None:
    owner = getattr(receive, "__self__", None)
    transport = getattr(owner, "transport", None)
    return transport if isinstance(transport, asyncio.BaseTransport) else None


async def drop_connection(request: Request) -> None:
    """Close the client's connection without a byte of answer (abort: RST, not FIN)."""
    transport = TRANSPORT.get()
    if transport is None or not hasattr(transport, "abort"):
        raise ConnectionDropped("the stand-in dropped the connection")
    transport.abort()
    # Wait for the server to notice, so whatever the app returns next is discarded.
    for _ in range(1000):
        if (await request.receive())["type"] == "http.disconnect":
            break
    raise Dropped


async def dropped_handler(request: Request, exc: Exception) -> Response:
    return Response(status_code=500)  # never reaches the client: the socket is gone
