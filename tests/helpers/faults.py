"""The local stack for the fault tests: real processes, real kills, a movable clock.

``fault_stack(database)`` packages one small call-only workflow (Messaging ``send-notice``
and then ``finish``), writes the local deployment for it with :class:`LocalStack`, starts
the development issuer and the Messaging stand-in, applies the deployment in-process, mints
a producer and an operator token, and pins the coordinator's clock to a file
(``COORDINATOR_TEST_CLOCK_FILE``) so that a test moves time past a lease instead of waiting
for it. The coordinator itself is started by the test (all-in-one or one component at a
time), because where and when it dies is what each test is about.

The stack's folder is a short path under the system's temporary folder: the internal Unix
sockets live in it and socket paths are limited to about 100 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
import yaml

from core import clock
from core.config.check import check_runtime_file
from core.db.connect import connect, quote_ident
from core.deploy import apply
from core.derive import command_key
from core.workflow.package import build_package
from devstack.postgres import DatabaseHandle
from devstack.stack import LocalStack, http_ok, wait_until

COMPONENTS: Final = ("gateway", "admission", "dispatcher", "recovery", "auditd")
WORKFLOW_ID: Final = "fault-notice"
CALL_STEP: Final = "send-notice"
CONNECTION: Final = "notices"
PRODUCT: Final = "messaging"
CRASH_AT_ENV: Final = "COORDINATOR_TEST_CRASH_AT"
LEASE_SECONDS: Final = 30.0
"""The dispatcher's production lease; moving the clock past it abandons a dead holder's."""
STOP_BUDGET_SECONDS: Final = 15.0
"""CONTRACT §2.1: a SIGTERM'd coordinator exits within this."""
WAIT_SECONDS: Final = 30.0
"""Bound of every condition a fault test waits for."""

_WORKFLOW: Final[dict[str, Any]] = {
    "format": "registry-coordinator/workflow/v1",
    "id": WORKFLOW_ID,
    "version": "1.0.0",
    "description": "Send one notice, then finish: the smallest workflow with a product call.",
    "input": {
        "type": "object",
        "additionalProperties": False,
        "required": ["subjectRef"],
        "properties": {"subjectRef": {"type": "string", "maxLength": 64}},
    },
    "connections": {CONNECTION: PRODUCT},
    "outcomes": ["notified"],
    "start": CALL_STEP,
    "steps": {
        CALL_STEP: {
            "call": {
                "connection": CONNECTION,
                "operation": "send-notice",
                "input": {
                    "template": "fault-test-notice",
                    "recipientRef": "${input.subjectRef}",
                    "parameters": {},
                },
                "output": {"messageId": "${response.messageId}"},
                "deadlineSeconds": 300,
            },
            "next": "done",
        },
        "done": {"finish": {"outcome": "notified"}},
    },
}


def build_call_package(out_dir: Path) -> tuple[Path, str]:
    """Package the fault workflow under ``out_dir``; answers ``(package root, digest)``."""
    source = out_dir / "source"
    source.mkdir(parents=True, exist_ok=True)
    (source / "workflow.yaml").write_text(yaml.safe_dump(_WORKFLOW, sort_keys=False), "utf-8")
    built = build_package(source, out_dir / "packages")
    return built.path, built.digest


# ------------------------------------------------------------------------------ processes


def children_of(parent: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the live child processes of ``parent`` (from /proc)."""
    found: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name in /proc/PID/stat is in parentheses and may hold spaces.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[1]) == parent:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                found.append((int(entry.name), " ".join(a.decode() for a in argv if a)))
    return found


def component_pid(launcher: subprocess.Popen[bytes], component: str) -> int:
    """The pid of the launcher's child that runs ``component``."""
    matches: list[int] = []

    def present() -> bool:
        matches[:] = [
            pid
            for pid, command in children_of(launcher.pid)
            if command.endswith(f"--component {component}")
        ]
        return len(matches) == 1

    wait_until(present, f"the {component} child of the launcher", timeout=10, process=launcher)
    return matches[0]


def wait_exit(process: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for ``process`` to exit by itself within ``timeout``; answers its status."""
    return int(process.wait(timeout=timeout))


# ---------------------------------------------------------------------------------- stack

S = TypeVar("S", bound="FaultStack")


@dataclass
class FaultStack:
    """One local deployment of the fault workflow and the handles a fault test needs."""

    local: LocalStack
    database: DatabaseHandle
    workdir: Path
    clock_file: Path | None
    admission_key: bytes
    producer_token: str
    operator_token: str
    token_files: dict[str, Path]
    """The producer's and the operator's token files, by role."""
    audit_key: bytes
    extra_env: dict[str, str] = field(default_factory=dict)
    """More environment for every coordinator process (a trust file, say)."""
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _keys: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _pinned: datetime | None = None

    # ---- the coordinator

    def env(self, crash_at: str | None = None) -> dict[str, str]:
        """The environment of coordinator processes: the test clock and a crash point."""
        env: dict[str, str] = dict(self.extra_env)
        if self.clock_file is not None:
            env[clock.ENV_VAR] = str(self.clock_file)
        if crash_at is not None:
            env[CRASH_AT_ENV] = crash_at
        return env

    def start(
        self, *, crash_at: str | None = None, prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """Start the all-in-one coordinator (a fresh log per start) and wait for /ready;
        ``prefix`` runs it elsewhere (inside a network namespace, say)."""
        return self.local.start_coordinator(
            name=f"coordinator-{next(self._names)}", env=self.env(crash_at), prefix=prefix
        )

    def start_component(
        self, component: str, *, wait_ready: bool = False, prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """Start ``coordinator --component NAME`` as its own process."""
        return self.local.start_coordinator(
            "--component",
            component,
            name=f"coordinator-{component}-{next(self._names)}",
            env=self.env(),
            wait_ready=wait_ready,
            prefix=prefix,
        )

    def name_of(self, process: subprocess.Popen[bytes]) -> str:
        """The name a started process is known (and logged) by."""
        for name, known in self.local.processes.items():
            if known is process:
                return name
        raise KeyError("not a process of this stack")

    def log_of(self, process: subprocess.Popen[bytes]) -> str:
        """What ``process`` wrote (stdout and stderr) so far."""
        return self.local.log_text(self.name_of(process))

    def stop(self, process: subprocess.Popen[bytes]) -> int:
        """SIGTERM ``process`` if it still runs, and reap it; answers its exit status."""
        return self.local.stop_process(self.name_of(process))

    def ready(self) -> bool:
        """True when /ready answers 200."""
        return http_ok(self.local.url + "/ready")

    # ---- the clock

    def pin_clock(self, instant: datetime) -> None:
        """Set the coordinator's clock (all its processes read the file)."""
        if self.clock_file is None:
            raise RuntimeError("this stack runs on the wall clock")
        clock.write_test_clock(self.clock_file, instant)
        self._pinned = instant

    def advance(self, seconds: float) -> None:
        """Move the coordinator's clock forward."""
        if self._pinned is None:
            raise RuntimeError("the clock was never pinned")
        self.pin_clock(self._pinned + timedelta(seconds=seconds))

    # ---- the API

    def _headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def start_run(self, subject: str = "person-17") -> str:
        """Start a run of the fault workflow with a fresh idempotency key; its run id."""
        answer = self.post_start(subject)
        if answer.status_code != 201:
            raise AssertionError(f"start answered {answer.status_code}: {answer.text}")
        return str(answer.json()["runId"])

    def post_start(self, subject: str = "person-17") -> httpx.Response:
        """``POST /v1/workflows/…/runs`` with the producer's token; the raw answer."""
        headers = self._headers(self.producer_token)
        headers["Idempotency-Key"] = f"fault-{next(self._keys)}-{uuid.uuid4().hex[:8]}"
        return httpx.post(
            f"{self.local.url}/v1/workflows/{WORKFLOW_ID}/runs",
            json={"input": {"subjectRef": subject}},
            headers=headers,
            timeout=10.0,
        )

    def get(self, path: str, *, operator: bool = True) -> httpx.Response:
        """A GET on the API with the operator's (or the producer's) token."""
        token = self.operator_token if operator else self.producer_token
        return httpx.get(self.local.url + path, headers=self._headers(token), timeout=10.0)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """A POST on the API with the operator's token."""
        return httpx.post(
            self.local.url + path,
            json=body,
            headers=self._headers(self.operator_token),
            timeout=10.0,
        )

    def status(self, run_id: str) -> dict[str, Any]:
        """The run's status document."""
        answer = self.get(f"/v1/runs/{run_id}")
        answer.raise_for_status()
        document: dict[str, Any] = answer.json()
        return document

    def inspection(self, run_id: str) -> dict[str, Any]:
        """The run's inspection document."""
        answer = self.get(f"/v1/runs/{run_id}/inspection")
        answer.raise_for_status()
        document: dict[str, Any] = answer.json()
        return document

    def call_step(self, run_id: str) -> dict[str, Any]:
        """The inspection's entry for the workflow's call step."""
        for step in self.inspection(run_id)["steps"]:
            if step["step"] == CALL_STEP:
                found: dict[str, Any] = step
                return found
        raise AssertionError(f"run {run_id} has not reached {CALL_STEP}")

    def run_ids(self) -> list[str]:
        """Every run the operator's list shows, following the cursor to the end."""
        ids: list[str] = []
        cursor: str | None = None
        for _page in range(100):
            query = "?limit=100" + (f"&cursor={cursor}" if cursor else "")
            answer = self.get("/v1/runs" + query)
            answer.raise_for_status()
            document = answer.json()
            ids += [str(run["runId"]) for run in document["runs"]]
            cursor = document.get("nextCursor")
            if not cursor:
                return ids
        raise AssertionError("the run list did not end")

    def wait_state(self, run_id: str, states: Sequence[str], what: str) -> dict[str, Any]:
        """Poll the run's status until its state is one of ``states``; the last status."""
        last: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal last
            last = self.status(run_id)
            return last["state"] in states

        try:
            wait_until(reached, what, timeout=WAIT_SECONDS)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}; last status {last}") from None
        return last

    def finish_barrier_run(self) -> str:
        """Start a run and wait until it succeeds: the dispatcher is up and has looked."""
        run_id = self.start_run("person-barrier")
        status = self.wait_state(run_id, ("succeeded", "failed", "held"), "the barrier run")
        assert status["state"] == "succeeded", status
        return run_id

    def owner_fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """Rows of one query run as the schema owner; ``{ns}`` is the quoted namespace."""
        namespace = quote_ident(str(self.local.summary["namespace"]))

        async def fetch() -> list[dict[str, Any]]:
            conn = await connect(self.database.migration_url, self.database.ca_pem)
            try:
                rows = await conn.fetch(sql.format(ns=namespace), *args)
            finally:
                await conn.close()
            return [dict(row) for row in rows]

        return asyncio.run(fetch())

    def step_row(self, run_id: str) -> dict[str, Any] | None:
        """The call step's row, read as the schema owner (also while the coordinator is down)."""
        rows = self.owner_fetch(
            "SELECT state, effect, lease_owner, command_key, attempts"
            " FROM {ns}.step WHERE run_id = $1 AND step_id = $2",
            run_id,
            CALL_STEP,
        )
        return rows[0] if rows else None

    def stored_run_ids(self) -> list[str]:
        """The ids of every run row in the database, read as the schema owner."""
        return [str(row["id"]) for row in self.owner_fetch("SELECT id FROM {ns}.run")]

    # ---- the stand-in

    @property
    def product_url(self) -> str:
        return self.local.product_urls[PRODUCT]

    def key_of(self, run_id: str) -> str:
        """The command key the coordinator sends for the call step of ``run_id``."""
        return command_key(self.admission_key, run_id, CALL_STEP)

    def stats(self) -> dict[str, Any]:
        """The stand-in's /dev/stats."""
        answer = httpx.get(self.product_url + "/dev/stats", timeout=5.0)
        answer.raise_for_status()
        document: dict[str, Any] = answer.json()
        return document

    def processed(self, run_id: str) -> int:
        """How many times the stand-in processed the run's command."""
        return int(self.stats()["processed"].get(self.key_of(run_id), 0))

    def received(self, run_id: str) -> int:
        """How many requests with the run's command key reached the stand-in's ledger."""
        return int(self.stats()["received"].get(self.key_of(run_id), 0))

    def fault(self, mode: str, count: int | None = None) -> None:
        """Install a fault on the stand-in's commands."""
        body: dict[str, Any] = {"mode": mode}
        if count is not None:
            body["count"] = count
        httpx.post(self.product_url + "/dev/faults", json=body, timeout=5.0).raise_for_status()

    def clear_fault(self) -> None:
        """Remove the stand-in's fault and let held requests answer."""
        httpx.delete(self.product_url + "/dev/faults", timeout=5.0).raise_for_status()

    def wait_processed(self, run_id: str, count: int) -> None:
        """Wait until the stand-in has processed the run's command ``count`` times."""
        wait_until(
            lambda: self.processed(run_id) >= count,
            f"the stand-in processing run {run_id}'s command",
            timeout=WAIT_SECONDS,
        )


def _short_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="rcf-", dir="/tmp"))


@contextlib.contextmanager
def fault_stack(
    database: DatabaseHandle,
    *,
    test_clock: bool = True,
    products: Callable[[LocalStack], None] = LocalStack.start_products,
) -> Iterator[FaultStack]:
    """A deployed local stack with its issuer and stand-in running; stopped on exit.
    ``products`` starts them (and may first move them, rewriting the deployment)."""
    with deployed_stack(
        database,
        FaultStack,
        lambda build: [build_call_package(build)],
        "fault",
        test_clock=test_clock,
        products=products,
    ) as stack:
        yield stack


@contextlib.contextmanager
def deployed_stack(
    database: DatabaseHandle,
    kind: type[S],
    packages: Callable[[Path], list[tuple[Path, str]]],
    token_prefix: str,
    *,
    test_clock: bool,
    products: Callable[[LocalStack], None] = LocalStack.start_products,
) -> Iterator[S]:
    """A local stack of the ``packages`` built under a folder, deployed, its issuer and
    stand-ins running, a producer and an operator token minted, as a ``kind``; the clock
    pinned to now when ``test_clock``; ``products`` starts the issuer and the stand-ins.
    Stopped and removed on exit."""
    workdir = _short_workdir()
    local: LocalStack | None = None
    try:
        built = packages(workdir / "build")
        local = LocalStack.prepare(workdir / "stack", packages=built, database=database)
        products(local)
        asyncio.run(apply(check_runtime_file(local.runtime_file), []))
        tokens = workdir / "tokens"
        tokens.mkdir(mode=0o700)
        producer = local.mint("producer", f"{token_prefix}-producer", tokens / "producer")
        operator = local.mint("operator", f"{token_prefix}-operator", tokens / "operator")
        secrets_dir = Path(local.summary["runtimeFile"]).parent / "secrets"
        stack = kind(
            local=local,
            database=database,
            workdir=workdir,
            clock_file=workdir / "clock" if test_clock else None,
            admission_key=(secrets_dir / "admission-key").read_bytes(),
            producer_token=producer.read_text().strip(),
            operator_token=operator.read_text().strip(),
            token_files={"producer": producer, "operator": operator},
            audit_key=(secrets_dir / "audit-key").read_bytes(),
        )
        if test_clock:
            # The wall clock's instant to begin with: tokens and the stand-in keep real time.
            stack.pin_clock(datetime.now(UTC))
        yield stack
    finally:
        if local is not None:
            local.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def kill(pid: int) -> None:
    """kill -9."""
    os.kill(pid, signal.SIGKILL)
