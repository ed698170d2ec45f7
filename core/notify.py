"""Readiness and liveness for a service manager: systemd's notify protocol (``sd_notify(3)``).

A process started with ``NOTIFY_SOCKET`` in its environment tells whoever owns that socket
— systemd for a ``Type=notify`` unit, the ``coordinator`` launcher for its own components —
that it serves (``READY=1``), that it is stopping (``STOPPING=1``) and, when
``WATCHDOG_USEC`` asks for it, that its event loop still turns (``WATCHDOG=1``). The protocol
is one datagram of newline-separated assignments to a Unix socket; a name starting with
``@`` is in the abstract namespace. Without ``NOTIFY_SOCKET`` nothing is sent.

Readiness is sent only once a component has verified its activation and serves (CONTRACT
§2.1), so a unit that others are ordered after (``After=``) is really there when they start.
The watchdog is pinged from the event loop itself, at half the interval systemd asked for:
a loop that stops turning stops the pings, and systemd restarts the unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Mapping
from typing import Final

NOTIFY_SOCKET: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC: Final = "WATCHDOG_USEC"
WATCHDOG_PID: Final = "WATCHDOG_PID"
READY: Final = "READY=1"
STOPPING: Final = "STOPPING=1"
WATCHDOG: Final = "WATCHDOG=1"


def _address(name: str) -> str | bytes:
    # "@name" is Linux's abstract namespace: a leading NUL byte on the wire.
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` to ``NOTIFY_SOCKET`` if the environment names one; whether it went.

    A manager that is gone or a socket that refuses is not this process's failure: the
    message is dropped and False returned, as ``sd_notify`` does.
    """
    name = (os.environ if environ is None else environ).get(NOTIFY_SOCKET)
    if not name or not (name.startswith("/") or name.startswith("@")):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), _address(name))
        except OSError:
            return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half ``WATCHDOG_USEC``), or None when no watchdog is
    asked of this process (unset, unreadable, or ``WATCHDOG_PID`` naming another process)."""
    env = os.environ if environ is None else environ
    pid = env.get(WATCHDOG_PID)
    if pid is not None and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get(WATCHDOG_USEC, ""))
    except ValueError:
        return None
    return usec / 2_000_000 if usec > 0 else None


async def keep_watchdog(interval: float, environ: Mapping[str, str] | None = None) -> None:
    """Ping the watchdog every ``interval`` seconds until cancelled."""
    while True:
        notify(WATCHDOG, environ)
        await asyncio.sleep(interval)


class Announcer:
    """What a component tells its manager over its life: ready once, the watchdog meanwhile,
    stopping at the end. Built in the running event loop."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._watchdog: asyncio.Task[None] | None = None

    def ready(self, status: str) -> None:
        """Say the component serves (``status`` is shown by ``systemctl status``), and start
        pinging the watchdog if one was asked for."""
        notify(f"{READY}\nSTATUS={status}", self._environ)
        interval = watchdog_interval(self._environ)
        if interval is not None and self._watchdog is None:
            self._watchdog = asyncio.create_task(
                keep_watchdog(interval, self._environ), name="watchdog"
            )

    async def stopping(self) -> None:
        """Say the component is stopping, and stop the watchdog's pings."""
        notify(STOPPING, self._environ)
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
