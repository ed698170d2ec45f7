"""The ``coordinator`` service launcher.

All-in-one (the default) runs each component as its own child process of this one and
supervises them: a component that dies takes the whole instance down with a clear message
(systemd or compose restarts it), and SIGTERM is passed on so every component stops within
the 15 s budget. ``--component NAME`` runs one component in this process, for units that
run components separately. Nothing here forks after a gRPC channel exists: children are
started with fork+exec before any channel is made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import uvloop

from core import __version__, logs, notify
from core.codes import Code
from core.errors import CoordinatorError
from core.notify import Announcer

COMPONENTS = ("gateway", "admission", "dispatcher", "recovery", "auditd")
# Start order: the journal first (nothing is answered without it), the gateway last.
START_ORDER = ("auditd", "recovery", "admission", "dispatcher", "gateway")
RECOVERY_ONLY = ("auditd", "recovery", "gateway")
ENTRY_POINTS = {
    "gateway": "gateway.service:serve",
    "admission": "admission.service:serve",
    "dispatcher": "dispatcher.service:serve",
    "recovery": "recovery.service:serve",
    "auditd": "auditd.service:serve",
}
STOP_BUDGET_SECONDS = 15.0
# A component gets this long to stop by itself before the launcher kills it.
CHILD_GRACE_SECONDS = 12.0


def raw_code(error: CoordinatorError) -> str:
    """The raw stderr code a startup refusal is reported with (CONTRACT §2.1): its code's
    own raw spelling, or ``deployment.refused`` for a code that has none."""
    return error.code.raw or Code.DEPLOYMENT_REFUSED.value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordinator", description="Registry Coordinator.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--runtime-config", metavar="FILE", help="the runtime file")
    parser.add_argument(
        "--recovery-only",
        action="store_true",
        help="gateway, recovery and auditd only: admits nothing and never dispatches",
    )
    parser.add_argument("--component", choices=COMPONENTS, help="run one component")
    parser.add_argument(
        "--log-level",
        choices=tuple(logs.LEVELS),
        help="overrides deployment.logging.level of the runtime file (default: notice)",
    )
    return parser


def _refuse(error: CoordinatorError) -> NoReturn:
    sys.stderr.write(f"{raw_code(error)}: {error.detail}\n")
    sys.stderr.flush()
    sys.exit(1)


# ----------------------------------------------------------------------------- one component


def _entry(component: str) -> Callable[..., Awaitable[None]]:
    module_name, function = ENTRY_POINTS[component].split(":")
    module = importlib.import_module(module_name)
    serve: Callable[..., Awaitable[None]] = getattr(module, function)
    return serve


async def _run_component(
    component: str, path: Path, recovery_only: bool, log_level: str | None
) -> None:
    from core.runtime import load_runtime

    runtime = load_runtime(path, recovery_only=recovery_only)
    settings = runtime.config.deployment.logging
    logs.configure(component, log_level or settings.level, settings.format)
    serve = _entry(component)
    started = asyncio.Event()
    task = asyncio.ensure_future(serve(runtime, started=started))
    loop = asyncio.get_running_loop()
    # READY=1 to the manager (systemd, or the launcher in all-in-one mode) only once the
    # component verified its activation and serves; a component that fails first never
    # says it.
    announcer = Announcer()
    announced = asyncio.ensure_future(_announce(started, announcer, component))

    def stop(signum: int) -> None:
        logs.log.log(logs.NOTICE, "%s stopping (%s)", component, signal.Signals(signum).name)
        task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        announced.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await announced
        await announcer.stopping()
    logs.log.log(logs.NOTICE, "%s stopped", component)


async def _announce(started: asyncio.Event, announcer: Announcer, component: str) -> None:
    await started.wait()
    announcer.ready(f"{component} serving")


def run_component(
    component: str, path: Path, recovery_only: bool, log_level: str | None = None
) -> NoReturn:
    """Run one component until SIGTERM; startup refusals exit 1 with a raw code line."""
    # Until the runtime file is read, its logging settings are not known.
    logs.configure(component, log_level or logs.DEFAULT_LEVEL)
    try:
        # uvloop: the event loop, TLS and socket handling in C. Every component spends most
        # of its CPU in the loop and its TLS streams (PostgreSQL, gRPC peers, products).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_run_component(component, path, recovery_only, log_level))
    except CoordinatorError as error:
        _refuse(error)
    except Exception as error:
        # Still one line and a code, never a traceback: the type names the failure.
        logging.getLogger("coordinator").debug("component failed", exc_info=True)
        sys.stderr.write(
            f"{Code.DEPLOYMENT_REFUSED.value}: the {component} component failed "
            f"({type(error).__name__})\n"
        )
        sys.exit(1)
    sys.exit(0)


# ------------------------------------------------------------------------------- supervisor


class ReadinessSocket:
    """The launcher's own notify socket (the sd_notify protocol, :mod:`core.notify`): each
    component it starts is given it as ``NOTIFY_SOCKET`` and says ``READY=1`` there once it
    serves. The kernel names the sender (``SO_PASSCRED``), so a message is matched to the
    child that sent it, never to what it claims. It lives in a fresh 0700 folder."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="coordinator-ready-"))
        self.path = self.folder / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.setblocking(False)

    def wait(self, timeout: float) -> list[tuple[int, list[str]]]:
        """What the components said within ``timeout`` seconds (or at once, if anything is
        waiting already): each message as its sender's process id and its assignments."""
        readable, _, _ = select.select([self.sock], [], [], timeout)
        said: list[tuple[int, list[str]]] = []
        while readable:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except BlockingIOError:
                break
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid, _uid, _gid = struct.unpack("3i", value[:12])
                    said.append((pid, data.decode("utf-8", "replace").splitlines()))
        return said

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Supervisor:
    """Start the components as child processes and keep them together.

    The public listener opens last (CONTRACT §2.1): every other component is started and
    must say it serves (it verified its activation) before the gateway is started at all,
    and the instance says ``READY=1`` to its own manager only once the gateway serves too.
    A component that exits before then takes the instance down as at any other time, and
    nothing was ever answered.
    """

    def __init__(self, path: Path, recovery_only: bool, log_level: str | None = None) -> None:
        self.path = path
        self.recovery_only = recovery_only
        self.log_level = log_level
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.readiness: ReadinessSocket | None = None
        self._watchdog = notify.watchdog_interval()
        self._pinged = 0.0
        # When the manager watches this launcher, the launcher watches its components the
        # same way: each pings it, and one silent for a whole interval is taken as hung.
        self._heard: dict[int, float] = {}

    def _command(self, component: str) -> list[str]:
        command = [sys.executable, "-m", "core.launcher", "--runtime-config", str(self.path)]
        command += ["--component", component]
        if self.recovery_only:
            command.append("--recovery-only")
        if self.log_level:
            command += ["--log-level", self.log_level]
        return command

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The components report to this launcher; it alone speaks to the service manager,
        # and pings the manager's watchdog for the instance.
        for name in (notify.WATCHDOG_USEC, notify.WATCHDOG_PID):
            env.pop(name, None)
        if self.readiness is not None:
            env[notify.NOTIFY_SOCKET] = str(self.readiness.path)
            if self._watchdog is not None:
                env[notify.WATCHDOG_USEC] = str(round(self._watchdog * 2_000_000))
        return env

    def _spawn(self, component: str) -> None:
        # Children must not see our signals twice (a terminal's Ctrl-C goes to the whole
        # group): each gets its own session and hears only what we forward.
        self.children[component] = subprocess.Popen(
            self._command(component), start_new_session=True, env=self._environment()
        )

    def start(self, components: tuple[str, ...]) -> None:
        """Start ``components`` (of this mode), in the start order."""
        for component in START_ORDER:
            if component in components:
                self._spawn(component)

    def _signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _exited(self) -> tuple[str, int] | None:
        for name, child in self.children.items():
            code = child.poll()
            if code is not None:
                return name, code
        return None

    def _ping(self) -> None:
        now = time.monotonic()
        if self._watchdog is not None and now - self._pinged >= self._watchdog:
            self._pinged = now
            notify.notify(notify.WATCHDOG)

    def _await_ready(self, components: tuple[str, ...]) -> tuple[str, int] | None:
        """Wait until every one of ``components`` said it serves; a component's exit (name,
        status) if one ends first, None otherwise (also when a signal asks to stop)."""
        assert self.readiness is not None
        waiting = {self.children[name].pid: name for name in components}
        while waiting and not self.stopping:
            for pid in self._listen(0.2):
                waiting.pop(pid, None)
            failed = self._exited()
            if failed is not None:
                return failed
            self._ping()
        return None

    def _listen(self, timeout: float) -> set[int]:
        """Read what the components said within ``timeout`` seconds; the ones that said
        ``READY=1``. Any message counts as a sign of life for the watchdog."""
        assert self.readiness is not None
        ready: set[int] = set()
        now = time.monotonic()
        for pid, assignments in self.readiness.wait(timeout):
            if notify.READY in assignments:
                ready.add(pid)
            if notify.READY in assignments or notify.WATCHDOG in assignments:
                self._heard[pid] = now
        return ready

    def _hung(self) -> str | None:
        """A component that said it serves and has not pinged for a whole watchdog
        interval (twice the time between its pings), if the manager asked for a watchdog."""
        if self._watchdog is None:
            return None
        silent = time.monotonic() - 2 * self._watchdog
        for name, child in self.children.items():
            heard = self._heard.get(child.pid)
            if heard is not None and heard < silent:
                return name
        return None

    def stop(self) -> None:
        """SIGTERM every child, wait within the budget, kill what is left."""
        notify.notify(notify.STOPPING)
        for child in self.children.values():
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CHILD_GRACE_SECONDS
        for child in self.children.values():
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def run(self) -> int:
        """Supervise until SIGTERM (exit 0) or until a component exits (exit non-zero)."""
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        wanted = RECOVERY_ONLY if self.recovery_only else START_ORDER
        behind = tuple(name for name in wanted if name != "gateway")
        failed: tuple[str, int] | None = None
        hung: str | None = None
        self.readiness = ReadinessSocket()
        try:
            self.start(behind)
            failed = self._await_ready(behind)
            if failed is None and not self.stopping:
                self.start(("gateway",))
                failed = self._await_ready(("gateway",))
            if failed is None and not self.stopping:
                notify.notify(f"{notify.READY}\nSTATUS=serving ({', '.join(wanted)})")
            while not self.stopping and failed is None and hung is None:
                failed = self._exited()
                hung = self._hung()
                if failed is None and hung is None:
                    self._ping()
                    # Waking 5 times a second keeps SIGTERM handling and exit detection
                    # prompt; os.wait would race with Popen's own bookkeeping.
                    self._listen(0.2)
            if hung is not None:
                # Its event loop does not turn: it cannot act on SIGTERM either.
                self.children[hung].kill()
            self.stop()
        finally:
            self.readiness.close()
        if hung is not None:
            assert self._watchdog is not None
            sys.stderr.write(
                f"coordinator: the {hung} component stopped answering (no watchdog ping in "
                f"{2 * self._watchdog:g} s); stopped every component\n"
            )
            return 1
        if failed is not None:
            name, code = failed
            sys.stderr.write(
                f"coordinator: the {name} component exited (status {code}); "
                "stopped every component\n"
            )
            return code if code > 0 else 1
        return 0


GRPC_VERBOSITY_DEFAULT = "ERROR"


def quiet_grpc(environ: dict[str, str] | os._Environ[str]) -> None:
    """gRPC's own log lines go to stderr as they are, outside the coordinator's log format,
    and since gRPC logs through absl it prints INFO lines too (every refused handshake of a
    peer without the internal certificate). Keep its errors only, unless the operator chose
    a level with ``GRPC_VERBOSITY``. Before any component imports grpc; children inherit it."""
    environ.setdefault("GRPC_VERBOSITY", GRPC_VERBOSITY_DEFAULT)


def main(argv: list[str] | None = None) -> NoReturn:
    """Parse arguments and run all components, or one."""
    quiet_grpc(os.environ)
    args = _parser().parse_args(argv)
    if args.version:
        print(__version__)
        sys.exit(0)
    if not args.runtime_config:
        _parser().error("--runtime-config FILE is required")
    path = Path(os.path.abspath(args.runtime_config))
    if args.component:
        run_component(args.component, path, args.recovery_only, args.log_level)
    # Verify once here so a refusal is one clear line rather than one per component; every
    # component still verifies for itself before it serves.
    try:
        asyncio.run(preflight(path, args.recovery_only))
    except CoordinatorError as error:
        _refuse(error)
    sys.exit(Supervisor(path, args.recovery_only, args.log_level).run())


async def preflight(path: Path, recovery_only: bool) -> None:
    """Check the runtime file and verify the activation on one runtime connection.

    An unreachable database is not a refusal: the components start, report
    ``store-unavailable`` and wait for it; the public listener opens once they serve.
    """
    from core.db import statements
    from core.db.roles import component_role
    from core.deploy.activation import verify_activation
    from core.deploy.database import open_connection
    from core.runtime import load_runtime

    runtime = load_runtime(path, recovery_only=recovery_only)
    try:
        async with open_connection(runtime.config, runtime.resolver, "runtime") as conn:
            role = component_role(runtime.config.namespace, "recovery")
            await statements.role_set(conn, role=role)
            await verify_activation(conn, runtime.checked, resolver=runtime.resolver)
    except CoordinatorError as error:
        if error.code != Code.STORE_UNAVAILABLE:
            raise


if __name__ == "__main__":
    main()
