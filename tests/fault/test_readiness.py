"""Nothing is served before everything is ready (CONTRACT §2.1), and a service manager is
told so by the notify protocol. The test plays systemd: it owns a ``NOTIFY_SOCKET`` and reads
what the coordinator says there."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from devstack.postgres import DatabaseHandle
from devstack.stack import wait_until
from tests.helpers.faults import WAIT_SECONDS, FaultStack, component_pid, fault_stack, wait_exit

pytestmark = pytest.mark.slow

SERVING = re.compile(r"^\S+ (\w+) NOTICE coordinator: \1 serving on ", re.MULTILINE)
OTHERS = {"auditd", "recovery", "admission", "dispatcher"}


class Manager:
    """The test's side of ``NOTIFY_SOCKET``: every datagram the coordinator sends."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))

    def next(self, timeout: float = WAIT_SECONDS) -> list[str]:
        """The next message's assignments; fails the test if none comes in ``timeout``."""
        self.sock.settimeout(timeout)
        return self.sock.recv(4096).decode().splitlines()

    def until(self, assignment: str, timeout: float = WAIT_SECONDS) -> list[list[str]]:
        """Every message up to and including the first holding ``assignment``."""
        seen: list[list[str]] = []
        while not seen or assignment not in seen[-1]:
            seen.append(self.next(timeout))
        return seen

    def pending(self) -> list[list[str]]:
        """What has been sent and not read yet, without waiting."""
        self.sock.setblocking(False)
        found: list[list[str]] = []
        with contextlib.suppress(BlockingIOError):
            while True:
                found.append(self.sock.recv(4096).decode().splitlines())
        return found


@pytest.fixture
def manager() -> Iterator[Manager]:
    with tempfile.TemporaryDirectory(prefix="rc-notify-") as folder:
        made = Manager(Path(folder))
        try:
            yield made
        finally:
            made.sock.close()


@pytest.fixture
def stack(database: DatabaseHandle) -> Iterator[FaultStack]:
    with fault_stack(database) as made:
        yield made


def _serving_order(log: str) -> list[str]:
    return [match.group(1) for match in SERVING.finditer(log)]


def test_the_instance_says_ready_only_once_every_component_serves_the_gateway_last(
    stack: FaultStack, manager: Manager
) -> None:
    env = {**stack.env(), "NOTIFY_SOCKET": str(manager.path)}
    launcher = stack.local.start_coordinator(name="coordinator-ready", env=env, wait_ready=False)
    said = manager.until("READY=1")
    log = stack.log_of(launcher)
    order = _serving_order(log)
    # Every component serves, and the gateway, whose listener is the public one, came last.
    assert set(order[:4]) == OTHERS and order[4] == "gateway", order
    assert len(said) == 1 and any(line.startswith("STATUS=") for line in said[0]), said
    # Ready means answering: the listener takes the very next request.
    answer = httpx.get(stack.local.url + "/ready", timeout=10)
    assert answer.status_code in (200, 503), answer.status_code
    wait_until(stack.ready, "/ready 200", process=launcher)
    launcher.send_signal(signal.SIGTERM)
    assert wait_exit(launcher, WAIT_SECONDS) == 0
    assert "STOPPING=1" in [line for message in manager.pending() for line in message]


def test_a_component_that_cannot_start_leaves_the_public_listener_closed(
    stack: FaultStack, manager: Manager
) -> None:
    # auditd cannot open its journal: a folder stands where the file should be.
    document = yaml.safe_load(stack.local.runtime_file.read_text(encoding="utf-8"))
    journal = Path(document["deployment"]["auditFile"])
    if not journal.is_absolute():
        journal = stack.local.runtime_file.parent / journal
    journal.unlink(missing_ok=True)
    journal.mkdir()
    env = {**stack.env(), "NOTIFY_SOCKET": str(manager.path)}
    launcher = stack.local.start_coordinator(name="coordinator-broken", env=env, wait_ready=False)
    assert wait_exit(launcher, WAIT_SECONDS) == 1
    log = stack.log_of(launcher)
    assert "deployment.auditFile" in log
    # The gateway never started, so nothing was ever answered; the manager heard no READY.
    assert "gateway" not in _serving_order(log)
    assert not re.search(r"^\S+ gateway ", log, re.MULTILINE), log
    assert all("READY=1" not in message for message in manager.pending())


def test_a_component_alone_says_ready_after_it_serves_and_pings_the_watchdog(
    stack: FaultStack, manager: Manager
) -> None:
    env = {
        **stack.env(),
        "NOTIFY_SOCKET": str(manager.path),
        "WATCHDOG_USEC": "200000",  # a ping every 0.1 s
    }
    component = stack.local.start_coordinator(
        "--component", "recovery", name="coordinator-recovery-alone", env=env, wait_ready=False
    )
    said = manager.until("READY=1")
    assert _serving_order(stack.log_of(component)) == ["recovery"]
    assert [line for message in said for line in message if line == "WATCHDOG=1"] == []
    pings = [manager.next(timeout=5) for _ in range(3)]
    assert pings == [["WATCHDOG=1"]] * 3
    os.kill(component.pid, signal.SIGTERM)
    assert wait_exit(component, WAIT_SECONDS) == 0
    stopped = [line for message in manager.pending() for line in message]
    assert "STOPPING=1" in stopped


def test_a_component_that_stops_answering_takes_the_instance_down_under_a_watchdog(
    stack: FaultStack, manager: Manager
) -> None:
    # The manager watches the launcher every 3 s; the launcher watches its components so.
    env = {**stack.env(), "NOTIFY_SOCKET": str(manager.path), "WATCHDOG_USEC": "3000000"}
    launcher = stack.local.start_coordinator(name="coordinator-watched", env=env, wait_ready=False)
    manager.until("READY=1")
    # Healthy, the instance keeps pinging its manager.
    assert manager.next(timeout=5) == ["WATCHDOG=1"]
    dispatcher = component_pid(launcher, "dispatcher")
    os.kill(dispatcher, signal.SIGSTOP)  # alive, but its event loop no longer turns
    try:
        assert wait_exit(launcher, WAIT_SECONDS) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(dispatcher, signal.SIGKILL)
    log = stack.log_of(launcher)
    assert (
        "coordinator: the dispatcher component stopped answering (no watchdog ping in 3 s)" in log
    )
    said = [line for message in manager.pending() for line in message]
    assert "STOPPING=1" in said
