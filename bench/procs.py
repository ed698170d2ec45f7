"""What the bench reads of the stack's processes from ``/proc``: the coordinator's
component children, their memory (VmRSS now, VmHWM the peak), and the CPU time of each
process group of the stack."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.postgres import PostgresServer
from devstack.stack import LocalStack

MIB = 1024 * 1024


@dataclass(frozen=True)
class Memory:
    component: str
    pid: int
    rss_mib: float
    peak_mib: float


# ------------------------------------------------------------------------------ memory


def component_processes(launcher_pid: int) -> dict[str, int]:
    """The launcher and its component children, by component name."""
    found = {"launcher": launcher_pid}
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    for child in children:
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"--component" in argv:
            found[argv[argv.index(b"--component") + 1].decode()] = int(child)
    return found


def _status_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of one process, in MiB."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024 / MIB
    return fields


def rss_mib(pid: int) -> float:
    """VmRSS of one process now, in MiB."""
    return round(_status_mib(pid)["VmRSS"], 1)


def memory(launcher_pid: int) -> list[Memory]:
    """VmRSS (now) and VmHWM (peak) of each coordinator process."""
    out: list[Memory] = []
    for name, pid in component_processes(launcher_pid).items():
        fields = _status_mib(pid)
        out.append(Memory(name, pid, round(fields["VmRSS"], 1), round(fields["VmHWM"], 1)))
    return out


# ------------------------------------------------------------------------------ CPU use

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _machine_busy() -> float:
    """CPU seconds the whole machine spent not idle, all cores together."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / TICK


class CpuMeter:
    """CPU seconds per process group of the stack between :meth:`start` and :meth:`stop`."""

    def __init__(self, server: PostgresServer, stack: LocalStack) -> None:
        self.server = server
        self.stack = stack
        self._before: dict[str, float] = {}
        self._began = 0.0

    def _groups(self) -> dict[str, list[int]]:
        groups = {
            name: [pid]
            for name, pid in component_processes(self.stack.processes["coordinator"].pid).items()
        }
        groups["messaging stand-in"] = [self.stack.processes["messaging"].pid]
        groups["issuer"] = [self.stack.processes["issuer"].pid]
        postmaster = int((self.server.data_dir / "postmaster.pid").read_text().split()[0])
        groups["postgres (all backends)"] = [postmaster, *_children(postmaster)]
        groups["bench client"] = [os.getpid()]
        return groups

    def _sample(self) -> dict[str, float]:
        sample = {name: sum(map(_cpu_seconds, pids)) for name, pids in self._groups().items()}
        sample["machine (all processes)"] = _machine_busy()
        return sample

    def start(self) -> None:
        self._before = self._sample()
        self._began = time.monotonic()

    def stop(self) -> dict[str, float]:
        """CPU seconds used per group since :meth:`start`, and the wall seconds as ``wall``."""
        after = self._sample()
        used = {name: after[name] - self._before.get(name, 0.0) for name in after}
        ours = sum(v for k, v in used.items() if not k.startswith("machine"))
        used["other work on the machine"] = used["machine (all processes)"] - ours
        used["wall"] = time.monotonic() - self._began
        return {name: round(value, 2) for name, value in used.items()}
