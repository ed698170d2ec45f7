"""Fault injection for the stand-ins: delays, failures, held answers, dropped connections.

A fault applies to the next requests of its target (``commands``, ``reads`` or ``all``),
``count`` times or until cleared. The ``-before`` modes act before the idempotency ledger
(nothing is processed); the ``-after`` modes act once the command was processed and
recorded, which is what makes a call *uncertain* for the coordinator.

Dropping a connection needs the server's help: ASGI has no message for it. A stand-in served
by :mod:`devstack.products.serving` finds, in its request's ``scope["state"]``, a function
that aborts that request's connection (:data:`ABORT_STATE_KEY`). Where there is none (an
in-process test transport has no socket), :class:`ConnectionDropped` is raised instead,
which the in-process test client sees as its request failing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from starlette.requests import Request
from starlette.responses import Response


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
    """Raised instead of dropping when the server gives no way to (in-process tests)."""


class Dropped(Exception):
    """The connection was closed on purpose; the answer goes nowhere."""


ABORT_STATE_KEY: Final = "devstack.abort-connection"
"""The member of a request's ``scope["state"]`` that aborts its connection: a callable put
there, per connection, by :class:`devstack.products.serving.DroppingH11Protocol`."""


async def drop_connection(request: Request) -> None:
    """End the client's connection without a byte of answer, then raise :class:`Dropped`."""
    state = request.scope.get("state") or {}
    abort: Callable[[], None] | None = state.get(ABORT_STATE_KEY)
    if abort is None:
        raise ConnectionDropped("the stand-in dropped the connection")
    abort()
    # Wait until the server has seen the connection go, so that whatever the app sends next
    # is discarded rather than written to a closed transport. The body was read already, so
    # the next message is the disconnect; the bound only guards against a server that
    # never says it.
    for _ in range(1000):
        if (await request.receive())["type"] == "http.disconnect":
            break
    raise Dropped


async def dropped_handler(request: Request, exc: Exception) -> Response:
    return Response(status_code=500)  # never reaches the client: the connection is gone
