"""The local stack for the recovery tests: four small workflows, coordinatorctl, the journal.

``recovery_stack(database)`` builds on :class:`tests.helpers.faults.FaultStack` (real
processes, the dev issuer, a pinned clock file, kill helpers, stand-in counters and faults)
with a deployment of four workflows, each the smallest that shows one recovery path:

- ``recover-notice``: one Messaging call (``send-notice``), then ``finish``;
- ``recover-wait-cancel``: a one-hour ``wait-until``, the same call, ``finish``; its
  ``onCancel`` path sends a cancellation notice (``notify-cancelled``) and finishes
  ``cancelled``;
- ``recover-wait``: the same wait and call without an ``onCancel``;
- ``recover-review``: one Casework ``create-review-request``, then a ``wait-for`` of the
  reviewer's decision (Casework keeps no receipts, so reconcile cannot help with the
  request; retry-same can).

Operator actions go through the real ``coordinatorctl`` (exit code, the ``coordinator.*``
line of a refusal, ``--output json``); polling goes through HTTP. The audit journal is read
as JSON lines and matched on ``runRef``, the keyed hash of the run id.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from auditd.journal import keyed_ref
from core.derive import command_key
from core.workflow.package import build_package
from devstack.postgres import DatabaseHandle, PostgresCluster
from devstack.stack import wait_until
from tests.helpers.faults import (
    CALL_STEP,
    WAIT_SECONDS,
    FaultStack,
    children_of,
    deployed_stack,
    kill,
    wait_exit,
)

NOTICE: Final = "recover-notice"
WAIT_CANCEL: Final = "recover-wait-cancel"
WAIT_PLAIN: Final = "recover-wait"
REVIEW: Final = "recover-review"
WAIT_STEP: Final = "pause"
CANCEL_STEP: Final = "notify-cancelled"
REVIEW_STEP: Final = "request-review"
DECISION_STEP: Final = "await-decision"
WAIT_SECONDS_OF_PAUSE: Final = 3600
MESSAGING: Final = "messaging"
CASEWORK: Final = "casework-review-producer"
ENDED: Final = ("succeeded", "failed", "cancelled")
CTL: Final = str(Path(sys.executable).with_name("coordinatorctl"))

_INPUT: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["subjectRef"],
    "properties": {"subjectRef": {"type": "string", "maxLength": 64}},
}


def _notice(template: str, following: str) -> dict[str, Any]:
    return {
        "call": {
            "connection": "notices",
            "operation": "send-notice",
            "input": {
                "template": template,
                "recipientRef": "${input.subjectRef}",
                "parameters": {},
            },
            "output": {"messageId": "${response.messageId}"},
            # Two hours: the restore drill moves its clock half an hour past a held call.
            "deadlineSeconds": 7200,
        },
        "next": following,
    }


def _workflow(workflow_id: str, description: str, **rest: Any) -> dict[str, Any]:
    return {
        "format": "registry-coordinator/workflow/v1",
        "id": workflow_id,
        "version": "1.0.0",
        "description": description,
        "input": _INPUT,
        **rest,
    }


def _waiting(workflow_id: str, on_cancel: bool) -> dict[str, Any]:
    steps: dict[str, Any] = {
        WAIT_STEP: {"wait-until": {"afterSeconds": WAIT_SECONDS_OF_PAUSE}, "next": CALL_STEP},
        CALL_STEP: _notice("recovery-test-notice", "done"),
        "done": {"finish": {"outcome": "notified"}},
    }
    extra: dict[str, Any] = {}
    outcomes = ["notified"]
    if on_cancel:
        steps[CANCEL_STEP] = _notice("recovery-test-cancelled", "cancelled")
        steps["cancelled"] = {"finish": {"outcome": "cancelled"}}
        extra["onCancel"] = CANCEL_STEP
        outcomes.append("cancelled")
    return _workflow(
        workflow_id,
        "Wait an hour, then send one notice.",
        connections={"notices": "messaging"},
        outcomes=outcomes,
        start=WAIT_STEP,
        **extra,
        steps=steps,
    )


WORKFLOWS: Final[tuple[dict[str, Any], ...]] = (
    _workflow(
        NOTICE,
        "Send one notice, then finish.",
        connections={"notices": "messaging"},
        outcomes=["notified"],
        start=CALL_STEP,
        steps={
            CALL_STEP: _notice("recovery-test-notice", "done"),
            "done": {"finish": {"outcome": "notified"}},
        },
    ),
    _waiting(WAIT_CANCEL, on_cancel=True),
    _waiting(WAIT_PLAIN, on_cancel=False),
    _workflow(
        REVIEW,
        "Ask Casework for a review and wait for the decision.",
        connections={"review": "casework-review-producer"},
        outcomes=["reviewed"],
        start=REVIEW_STEP,
        steps={
            REVIEW_STEP: {
                "call": {
                    "connection": "review",
                    "operation": "create-review-request",
                    "input": {"subjectRef": "${input.subjectRef}", "summary": "Recovery test"},
                    "output": {"reviewId": "${response.reviewId}"},
                },
                "next": DECISION_STEP,
            },
            DECISION_STEP: {
                "wait-for": {
                    "connection": "review",
                    "result": "review-decision",
                    "reviewId": "${steps.request-review.reviewId}",
                },
                "next": "done",
            },
            "done": {"finish": {"outcome": "reviewed"}},
        },
    ),
)


def build_packages(out_dir: Path) -> list[tuple[Path, str]]:
    """Package every workflow of the kit under ``out_dir``; ``(root, digest)`` pairs."""
    built: list[tuple[Path, str]] = []
    for workflow in WORKFLOWS:
        source = out_dir / "source" / workflow["id"]
        source.mkdir(parents=True, exist_ok=True)
        (source / "workflow.yaml").write_text(yaml.safe_dump(workflow, sort_keys=False), "utf-8")
        package = build_package(source, out_dir / "packages")
        built.append((package.path, package.digest))
    return built


# --------------------------------------------------------------------------- coordinatorctl


@dataclass(frozen=True)
class CtlResult:
    """What one coordinatorctl invocation did."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def document(self) -> dict[str, Any]:
        """The ``--output json`` document of a successful command."""
        assert self.returncode == 0, f"{self.args}: exit {self.returncode}: {self.stderr}"
        found: dict[str, Any] = json.loads(self.stdout)
        return found

    @property
    def code(self) -> str:
        """The ``coordinator.*`` code of a refusal, without its prefix."""
        assert self.returncode == 1, f"{self.args}: exit {self.returncode}: {self.stdout}"
        last = self.stderr.strip().splitlines()[-1]
        word = last.split(":", 1)[0]
        assert word.startswith("coordinator."), last
        return word.removeprefix("coordinator.")


# ---------------------------------------------------------------------------------- stack


@dataclass
class RecoveryStack(FaultStack):
    """A :class:`FaultStack` of the kit's workflows, with coordinatorctl and the journal."""

    _starts: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # ---- the coordinator

    def start_instance(self, *, recovery_only: bool = False) -> subprocess.Popen[bytes]:
        """Start the all-in-one coordinator (``--recovery-only`` when asked); wait for /ready."""
        extra = ("--recovery-only",) if recovery_only else ()
        mode = "recovery-only" if recovery_only else "ordinary"
        return self.local.start_coordinator(
            *extra, name=f"coordinator-{mode}-{next(self._names)}", env=self.env()
        )

    def kill_instance(self, launcher: subprocess.Popen[bytes]) -> None:
        """kill -9 an all-in-one instance: the launcher first, so it cannot stop its
        components gracefully, then each component (each runs in its own session)."""
        components = [pid for pid, _command in children_of(launcher.pid)]
        kill(launcher.pid)
        for pid in components:
            with contextlib.suppress(ProcessLookupError):
                kill(pid)
        assert wait_exit(launcher, WAIT_SECONDS) == -9
        self.stop(launcher)
        wait_for(lambda: not any(_alive(pid) for pid in components), "the killed components")

    @property
    def now(self) -> datetime:
        """The coordinator's pinned instant."""
        assert self._pinned is not None, "the clock was never pinned"
        return self._pinned

    # ---- runs

    def post_start(
        self,
        subject: str = "person-17",
        *,
        workflow: str = NOTICE,
        key: str | None = None,
    ) -> httpx.Response:
        """``POST /v1/workflows/{workflow}/runs`` with the producer's token."""
        headers = self._headers(self.producer_token)
        headers["Idempotency-Key"] = key or f"rk-{next(self._starts)}-{uuid.uuid4().hex[:8]}"
        return httpx.post(
            f"{self.local.url}/v1/workflows/{workflow}/runs",
            json={"input": {"subjectRef": subject}},
            headers=headers,
            timeout=10.0,
        )

    def start_run(self, subject: str = "person-17", *, workflow: str = NOTICE) -> str:
        """Start a run of ``workflow``; its run id."""
        answer = self.post_start(subject, workflow=workflow)
        assert answer.status_code == 201, f"start answered {answer.status_code}: {answer.text}"
        return str(answer.json()["runId"])

    def held_after_processing(self, subject: str = "person-17", *, workflow: str = NOTICE) -> str:
        """A run whose first call the product processed and then answered 500: held, its
        effect unknown."""
        self.fault_on(CASEWORK if workflow == REVIEW else MESSAGING, "fail-after")
        run_id = self.start_run(subject, workflow=workflow)
        self.wait_held(run_id)
        return run_id

    def step(self, run_id: str, step: str = CALL_STEP) -> dict[str, Any]:
        """The inspection's entry of ``step`` (the newest one by order reached)."""
        found = [s for s in self.inspection(run_id)["steps"] if s["step"] == step]
        assert found, f"run {run_id} has not reached {step}"
        entry: dict[str, Any] = found[-1]
        return entry

    def wait_held(self, run_id: str) -> dict[str, Any]:
        """Wait until the run is held for an operator (or ended); its status."""
        status = self.wait_state(run_id, ("held", *ENDED), f"run {run_id} held")
        assert status["state"] == "held", status
        assert status["attention"] is True, status
        return status

    def wait_ended(self, run_id: str) -> dict[str, Any]:
        """Wait until the run has ended; its status."""
        return self.wait_state(run_id, ENDED, f"run {run_id} ended")

    # ---- the stand-ins

    def key_of(self, run_id: str, step: str = CALL_STEP) -> str:
        """The command key of ``step`` of ``run_id``."""
        return command_key(self.admission_key, run_id, step)

    def stats_of(self, product: str) -> dict[str, Any]:
        """A stand-in's /dev/stats."""
        answer = httpx.get(self.local.product_urls[product] + "/dev/stats", timeout=5.0)
        answer.raise_for_status()
        document: dict[str, Any] = answer.json()
        return document

    def counts(
        self, run_id: str, step: str = CALL_STEP, product: str = MESSAGING
    ) -> tuple[int, int]:
        """``(received, processed)`` of the stand-in for the step's command key."""
        stats = self.stats_of(product)
        key = self.key_of(run_id, step)
        return int(stats["received"].get(key, 0)), int(stats["processed"].get(key, 0))

    def fault_on(self, product: str, mode: str, count: int = 1) -> None:
        """Install a fault on a stand-in's next ``count`` commands."""
        httpx.post(
            self.local.product_urls[product] + "/dev/faults",
            json={"mode": mode, "count": count},
            timeout=5.0,
        ).raise_for_status()

    def clear_fault_on(self, product: str) -> None:
        """Remove a stand-in's fault and let held requests answer."""
        httpx.delete(self.local.product_urls[product] + "/dev/faults", timeout=5.0)

    def advance_product_clock(self, product: str, seconds: float) -> None:
        """Move a stand-in's own clock forward (its receipt and idempotency windows)."""
        httpx.post(
            self.local.product_urls[product] + "/dev/clock",
            json={"advanceSeconds": seconds},
            timeout=5.0,
        ).raise_for_status()

    def ledger(self, run_ids: Sequence[str], product: str = MESSAGING) -> set[tuple[int, int]]:
        """The ``(received, processed)`` pairs of the runs' call commands in a stand-in's
        ledger, as a set (one read of the ledger for all of them)."""
        stats = self.stats_of(product)
        keys = [self.key_of(run_id) for run_id in run_ids]
        return {
            (int(stats["received"].get(key, 0)), int(stats["processed"].get(key, 0)))
            for key in keys
        }

    def held_by_outage(self, count: int, subject: str) -> list[str]:
        """``count`` runs of the notice workflow, each held by a Messaging outage (processed,
        then answered 500: effect unknown), started eight at a time; their ids in the order
        started. The fault is cleared once every one of them is held."""
        self.fault_on(MESSAGING, "fail-after", count)
        with ThreadPoolExecutor(max_workers=8) as pool:
            started = list(pool.map(lambda n: self.start_run(f"{subject}-{n}"), range(count)))
        wait_for(
            lambda: self.total("attention=true&cause=status-5xx") == count,
            f"{count} runs held by the outage",
            timeout=240,
        )
        self.clear_fault_on(MESSAGING)
        return started

    def total(self, query: str) -> int:
        """The list's ``total`` for ``query`` (``GET /v1/runs?limit=1&…``)."""
        answer = self.get(f"/v1/runs?limit=1&{query}")
        answer.raise_for_status()
        return int(answer.json()["total"])

    def twice(self, product: str = MESSAGING) -> list[str]:
        """Command keys a stand-in processed more than once (must always be empty)."""
        return [k for k, n in self.stats_of(product)["processed"].items() if int(n) > 1]

    # ---- coordinatorctl

    def ctl(self, *args: str, role: str = "operator", timeout: float = 60) -> CtlResult:
        """Run ``coordinatorctl ARGS --url … --token-file …`` (an API command)."""
        command = [*args, "--url", self.local.url, "--token-file", str(self.token_files[role])]
        result = subprocess.run(
            [CTL, *command], capture_output=True, text=True, timeout=timeout, check=False
        )
        return CtlResult(tuple(args), result.returncode, result.stdout, result.stderr)

    def act(self, action: str, run_id: str, reason: str) -> CtlResult:
        """A run action (reconcile, retry-same, cancel) through coordinatorctl, as JSON."""
        return self.ctl(action, "--run", run_id, "--reason", reason, "--output", "json")

    def attention_ids(self) -> list[str]:
        """The run ids ``coordinatorctl list --attention true`` shows."""
        listing = self.ctl("list", "--attention", "true", "--limit", "100", "--output", "json")
        return [str(run["runId"]) for run in listing.document["runs"]]

    # ---- the journal

    @property
    def journal(self) -> Path:
        return self.local.root / "deployment" / "audit.jsonl"

    def audit_records(self) -> list[dict[str, Any]]:
        """Every record of the audit journal, in order."""
        lines = self.journal.read_text("utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def audited(self, action: str, run_id: str | None = None) -> list[dict[str, Any]]:
        """The journal's records of ``action`` (on ``run_id`` when given)."""
        ref = None if run_id is None else keyed_ref(self.audit_key, run_id)
        return [
            record
            for record in self.audit_records()
            if record["action"] == action and (ref is None or record.get("runRef") == ref)
        ]

    # ---- the database

    def use_database(self, database: DatabaseHandle) -> None:
        """Point the deployment (and this kit's owner reads) at another database server."""
        secrets_dir = Path(self.local.summary["runtimeFile"]).parent / "secrets"
        database.write_secret_files(secrets_dir)
        self.database = database

    def steps_of(self, run_id: str) -> list[dict[str, Any]]:
        """Every step row of the run, read as the schema owner."""
        return self.owner_fetch(
            "SELECT step_id, seq, state, effect, lease_owner, command_key"
            " FROM {ns}.step WHERE run_id = $1 ORDER BY seq",
            run_id,
        )


@contextlib.contextmanager
def recovery_stack(database: DatabaseHandle, *, test_clock: bool = True) -> Iterator[RecoveryStack]:
    """A deployed local stack of the kit's workflows, issuer and stand-ins running."""
    with deployed_stack(
        database, RecoveryStack, build_packages, "recovery", test_clock=test_clock
    ) as stack:
        yield stack


_databases = itertools.count(1)


@contextlib.contextmanager
def started_recovery_stack(
    postgres_server: PostgresCluster, prefix: str
) -> Iterator[RecoveryStack]:
    """A recovery stack on a database of its own on ``postgres_server``, its all-in-one
    coordinator started; the database is dropped afterwards (a module fixture's body)."""
    name = f"{prefix}_{os.getpid()}_{next(_databases)}"
    database = postgres_server.create_database(name)
    try:
        with recovery_stack(database) as running:
            running.start()
            yield running
    finally:
        postgres_server.drop_database(name)


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


def stays(probe: Any, what: str, seconds: float = 1.5) -> None:
    """Check ``probe()`` again and again for ``seconds``: a negative ("nothing was sent")
    can only be watched for a while. Callers say what makes the window long enough."""
    deadline = time.monotonic() + seconds
    while True:
        assert probe(), what
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def wait_for(probe: Any, what: str, timeout: float = WAIT_SECONDS) -> None:
    """:func:`devstack.stack.wait_until` that fails as an assertion."""
    try:
        wait_until(probe, what, timeout=timeout)
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from None


def states(stack: RecoveryStack, run_ids: Sequence[str]) -> dict[str, str]:
    """``{run id: state}``."""
    return {run_id: str(stack.status(run_id)["state"]) for run_id in run_ids}
