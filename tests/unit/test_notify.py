"""The notify protocol's sending side (:mod:`core.notify`), against sockets of the test's."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from core.notify import notify, watchdog_interval


def test_a_message_reaches_a_socket_by_path(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(tmp_path / "notify"))
        assert notify("READY=1\nSTATUS=x", {"NOTIFY_SOCKET": str(tmp_path / "notify")})
        assert manager.recv(100) == b"READY=1\nSTATUS=x"


def test_a_message_reaches_an_abstract_socket() -> None:
    name = f"rc-notify-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(b"\0" + name.encode())
        assert notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert manager.recv(100) == b"WATCHDOG=1"


@pytest.mark.parametrize("where", [None, "", "relative/notify", "/nonexistent/rc/notify"])
def test_without_a_manager_nothing_is_sent_and_nothing_fails(where: str | None) -> None:
    environ = {} if where is None else {"NOTIFY_SOCKET": where}
    assert notify("READY=1", environ) is False


def test_the_watchdog_is_pinged_at_half_its_interval_and_only_by_the_process_it_names() -> None:
    mine = str(os.getpid())
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": mine}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    for value in ("", "0", "-5", "soon"):
        assert watchdog_interval({"WATCHDOG_USEC": value}) is None
    assert watchdog_interval({}) is None


def test_the_launcher_keeps_grpcs_own_lines_to_errors_unless_told_otherwise() -> None:
    from core.launcher import GRPC_VERBOSITY_DEFAULT, quiet_grpc

    unset: dict[str, str] = {}
    quiet_grpc(unset)
    assert unset == {"GRPC_VERBOSITY": GRPC_VERBOSITY_DEFAULT} == {"GRPC_VERBOSITY": "ERROR"}
    chosen = {"GRPC_VERBOSITY": "INFO"}
    quiet_grpc(chosen)
    assert chosen == {"GRPC_VERBOSITY": "INFO"}
