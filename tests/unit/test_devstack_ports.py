"""The local stack's listener ports come from below the kernel's ephemeral range, so an
outgoing connection made meanwhile (to PostgreSQL, a stand-in) can never have taken one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from devstack import stack


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    floor = stack._ephemeral_floor()
    ports = {stack.free_port() for _ in range(20)}
    assert all(stack.LISTENER_PORTS_FLOOR <= port < floor for port in ports), ports
    assert len(ports) > 1  # drawn at random, not one fixed port
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports.pop()))


def test_without_room_below_the_range_the_kernel_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels = stack._ephemeral_floor()
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text(f"{stack.LISTENER_PORTS_FLOOR + 10}\t60999\n")
    monkeypatch.setattr(stack, "EPHEMERAL_RANGE_FILE", narrow)
    assert stack._ephemeral_floor() == stack.LISTENER_PORTS_FLOOR + 10
    assert stack.free_port() >= kernels  # the kernel's choice, from its own range
    monkeypatch.setattr(stack, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert stack._ephemeral_floor() == 32_768
