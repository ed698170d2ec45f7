"""``make restore-rehearsal``: back up a live local deployment mid-flight, restore it into a
fresh database and run the whole recovery procedure with ``coordinatorctl``.

The order of things:

1. Build a throwaway deployment of appointment-booking (PostgreSQL 17 with TLS, the
   development issuer, the Scheduling and Messaging stand-ins, the coordinator), exactly as
   ``make quickstart`` does, in a temporary folder.
2. Start runs and leave them in every state that matters to a restore: one finished, one
   waiting for its reminder, one held after the product processed its booking, one held
   although the booking never reached the product, and one whose booking the product holds
   unanswered while the backup is taken.
3. Take an online base backup (:mod:`devstack.backup`). Then let the old deployment go on:
   the held booking is answered and its confirmation sent — commands the backup knows
   nothing about.
4. Stop the old service (fencing) and its database, and restore the backup into a fresh
   server on a new port; the deployment's database URL files are pointed at it.
5. The eight steps, against ``coordinator --recovery-only`` and then the ordinary service:
   restore-hold, inspect, reconcile each held run, complete-execution-recovery,
   release-restore-hold, stop the recovery-only instance, start the ordinary one and
   retry-same or cancel what remains, release-admission-hold.
6. Check every run ended as it should, and count the commands the stand-ins processed more
   than once (``duplicates: N``, which must be 0). Any difference exits non-zero.

The stand-ins run throughout as the same processes, so their ledgers remember what the old
deployment sent; that is what makes the duplicate count meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from devstack.backup import BaseBackup, RestoredServer, backup, restore
from devstack.postgres import PostgresServer
from devstack.quickstart import ROOT, Stages, show
from devstack.stack import LocalStack, wait_until

WORKFLOW = "appointment-booking"
SCHEDULING = "scheduling"
MESSAGING = "messaging"
REFERENCE = "REHEARSAL-1"
RUN_TIMEOUT_SECONDS = 30.0
ENDED = ("succeeded", "failed", "cancelled")
STAGES = 15


class Inconsistent(Exception):
    """Something the rehearsal checks did not hold; the message says what."""


def check(condition: bool, what: str) -> None:
    """Stop the rehearsal with ``what`` unless ``condition`` holds."""
    if not condition:
        raise Inconsistent(what)


class Rehearsal:
    """The throwaway deployment, its tokens and the commands the operator types."""

    def __init__(self, stack: LocalStack, state: Path) -> None:
        self.stack = stack
        self.state = state
        self.producer = stack.mint("producer", "rehearsal-producer", state / "producer-token")
        self.operator = stack.mint("operator", "rehearsal-operator", state / "operator-token")
        self.instances = 0
        self.starts = 0

    # ---- coordinatorctl

    def ctl(self, *args: str, refused: str | None = None, quiet: bool = False) -> Any:
        """Run the real ``coordinatorctl`` as the operator; answers its JSON document.

        ``refused`` names the code the command must be refused with instead (the order of
        the procedure makes some refusals certain, and the rehearsal shows them).
        """
        full = [*args, "--url", self.stack.url, "--token-file", str(self.operator)]
        print("      $ coordinatorctl " + " ".join(args), flush=True)
        command = [str(Path(sys.executable).with_name("coordinatorctl")), *full, "--output", "json"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if refused is not None:
            show(result.stderr)
            last = (result.stderr.strip().splitlines() or [""])[-1]
            check(
                result.returncode == 1 and last.startswith(f"coordinator.{refused}:"),
                f"coordinatorctl {args[0]} should have been refused with {refused}",
            )
            return None
        if result.returncode != 0:
            show(result.stderr)
            raise Inconsistent(f"coordinatorctl {args[0]} failed (exit {result.returncode})")
        document = json.loads(result.stdout)
        if not quiet:
            show(_summary(document))
        return document

    # ---- the service

    def start_instance(self, *, recovery_only: bool = False) -> str:
        """Start the coordinator (all components, or ``--recovery-only``); its name."""
        self.instances += 1
        name = f"coordinator-{self.instances}"
        extra = ("--recovery-only",) if recovery_only else ()
        self.stack.start_coordinator(*extra, name=name)
        mode = "--recovery-only" if recovery_only else "ordinary"
        print(f"      coordinator ({mode}) serving at {self.stack.url}", flush=True)
        return name

    def stop_instance(self, name: str) -> None:
        status = self.stack.stop_process(name)
        check(status == 0, f"the coordinator exited with status {status}")

    # ---- runs and stand-ins

    def start_run(self, label: str, reminder_in: int | None = None) -> str:
        self.starts += 1
        document: dict[str, Any] = {
            "slotRef": f"slot-{label}",
            "subjectRef": f"person-{label}",
            "recipientRef": f"person-{label}",
        }
        if reminder_in is not None:
            at = time.gmtime(time.time() + reminder_in)
            document["reminderAt"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", at)
        answer = httpx.post(
            f"{self.stack.url}/v1/workflows/{WORKFLOW}/runs",
            json={"input": document},
            headers={
                "Authorization": f"Bearer {self.producer.read_text().strip()}",
                "Idempotency-Key": f"rehearsal-{self.starts}",
            },
            timeout=10.0,
        )
        check(answer.status_code == 201, f"starting run '{label}' answered {answer.status_code}")
        run_id = str(answer.json()["runId"])
        print(f"      run {run_id}: {label}", flush=True)
        return run_id

    def status(self, run_id: str) -> dict[str, Any]:
        answer = httpx.get(
            f"{self.stack.url}/v1/runs/{run_id}",
            headers={"Authorization": f"Bearer {self.operator.read_text().strip()}"},
            timeout=10.0,
        )
        answer.raise_for_status()
        document: dict[str, Any] = answer.json()
        return document

    def until(self, run_id: str, states: tuple[str, ...]) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal found
            found = self.status(run_id)
            return found.get("state") in states

        try:
            wait_until(reached, f"run {run_id}", timeout=RUN_TIMEOUT_SECONDS)
        except RuntimeError:
            raise Inconsistent(f"run {run_id} is {found.get('state')}, not {states}") from None
        return found

    def product(self, kind: str, path: str, method: str = "GET", **body: Any) -> Any:
        url = self.stack.product_urls[kind] + path
        answer = httpx.request(method, url, json=body or None, timeout=5.0)
        answer.raise_for_status()
        return answer.json()

    def fault(self, kind: str, mode: str) -> None:
        self.product(kind, "/dev/faults", "POST", mode=mode, count=1)

    def processed(self, kind: str) -> dict[str, int]:
        counts: dict[str, int] = self.product(kind, "/dev/stats")["processed"]
        return counts

    def wait_processed(self, kind: str, before: int) -> None:
        wait_until(
            lambda: sum(self.processed(kind).values()) > before,
            f"the {kind} stand-in processing a command",
            timeout=RUN_TIMEOUT_SECONDS,
        )


def _summary(document: Any) -> str:
    """The members of an answer an operator looks at first, one line."""
    if not isinstance(document, dict):
        return json.dumps(document)
    if "runs" in document:
        rows = [f"{r['runId']}  {r['state']}  attention={r['attention']}" for r in document["runs"]]
        return "\n".join(rows) or "(no runs)"
    wanted = ("runId", "state", "outcome", "attention", "cancelling", "result", "holds")
    picked = {k: document[k] for k in wanted if k in document}
    if "snapshot" in document:
        picked["snapshot"] = document["snapshot"]
    if "steps" in document:
        picked["steps"] = [
            f"{s['step']}:{s['state']}" + (f"/{s['effect']}" if "effect" in s else "")
            for s in document["steps"]
        ]
    return json.dumps(picked)


# ---------------------------------------------------------------------------------- stages


def mid_flight(r: Rehearsal, stages: Stages) -> dict[str, str]:
    """Stage 2: runs in every state a restore has to deal with; the label of each run."""
    stages.say("Starting runs and leaving them mid-flight")
    runs: dict[str, str] = {}
    runs["finished"] = r.start_run("finished")
    r.until(runs["finished"], ENDED)
    runs["waiting"] = r.start_run("waiting-for-reminder", reminder_in=86_400)
    r.until(runs["waiting"], ("waiting",))
    r.fault(MESSAGING, "fail-after")
    runs["held-processed"] = r.start_run("confirmation-processed-answer-lost")
    r.until(runs["held-processed"], ("held",))
    r.fault(SCHEDULING, "drop-before")
    runs["held-never-sent"] = r.start_run("booking-never-reached-the-product")
    r.until(runs["held-never-sent"], ("held",))
    before = sum(r.processed(SCHEDULING).values())
    r.fault(SCHEDULING, "hang-after")
    runs["in-flight"] = r.start_run("booking-answer-held-by-the-product")
    r.wait_processed(SCHEDULING, before)
    return runs


def after_backup(r: Rehearsal, runs: dict[str, str]) -> None:
    """The old deployment goes on: the held booking is answered, its confirmation sent."""
    r.product(SCHEDULING, "/dev/faults", "DELETE")
    final = r.until(runs["in-flight"], ENDED)
    check(final["state"] == "succeeded", "the in-flight run did not finish before the restore")
    print(
        "      the product answered the held booking; the old deployment sent its confirmation "
        "too: two commands the backup does not know about",
        flush=True,
    )


def procedure(r: Rehearsal, stages: Stages, runs: dict[str, str]) -> None:
    """Stages 7-14: the eight steps of the restore procedure."""
    stages.say("Step 1: restore-hold on a --recovery-only instance (holds execution and starts)")
    recovery = r.start_instance(recovery_only=True)
    held = r.ctl("restore-hold", "--reason", REFERENCE)
    check(held["holds"] == {"execution": True, "admission": True}, "the holds are not set")
    check(held["snapshot"]["runs"] == 3, "the snapshot should hold the three unsettled runs")

    stages.say("Step 2: inspect the runs that need attention")
    listing = r.ctl("list", "--attention", "true", "--limit", "100")
    attention = {run["runId"] for run in listing["runs"]}
    expected = {runs["held-processed"], runs["held-never-sent"], runs["in-flight"]}
    check(attention == expected, "the held runs are not the three unsettled ones")
    for run_id in sorted(attention):
        r.ctl("inspect", "--run", run_id)
    r.ctl("release-restore-hold", "--reason", REFERENCE, refused="restore.unresolved")

    stages.say("Step 3: reconcile each held run from the product's receipt")
    results = {
        label: r.ctl("reconcile", "--run", runs[label], "--reason", REFERENCE)["result"]
        for label in ("held-processed", "held-never-sent", "in-flight")
    }
    check(results["held-processed"] == "accepted", "the processed confirmation was not found")
    check(results["in-flight"] == "accepted", "the booking answered after the backup was lost")
    check(results["held-never-sent"] == "not-sent", "the unsent booking was not shown as not-sent")
    print(
        "      accepted: the product has a receipt; not-sent: it provably never saw the key",
        flush=True,
    )
    r.ctl(
        "retry-same",
        "--run",
        runs["held-never-sent"],
        "--reason",
        REFERENCE,
        refused="retry.refused",
    )
    cancelled = r.ctl("cancel", "--run", runs["waiting"], "--reason", REFERENCE)
    check(cancelled["result"] == "cancelling", "the waiting run did not take its onCancel path")

    stages.say("Step 4: complete-execution-recovery (the operator's statements, recorded)")
    r.ctl("release-restore-hold", "--reason", REFERENCE, refused="restore.review-required")
    r.ctl(
        "complete-execution-recovery",
        "--recovery-reference",
        REFERENCE,
        "--execution-history-complete",
        "--prior-deployment-fenced",
    )

    stages.say("Step 5: release-restore-hold (execution may resume)")
    released = r.ctl("release-restore-hold", "--reason", REFERENCE)
    check(released["holds"]["execution"] is False, "the execution hold is still set")

    stages.say("Step 6: stop the --recovery-only instance")
    r.stop_instance(recovery)

    stages.say("Step 7: start the ordinary service; retry-same what was never sent")
    r.start_instance()
    retried = r.ctl("retry-same", "--run", runs["held-never-sent"], "--reason", REFERENCE)
    check(retried["result"] == "accepted", f"retry-same answered {retried['result']}")

    stages.say("Step 8: release-admission-hold (starts are admitted again)")
    admitted = r.ctl(
        "release-admission-hold",
        "--recovery-reference",
        REFERENCE,
        "--admission-history-complete",
        "--prior-deployment-fenced",
    )
    check(admitted["holds"] == {"execution": False, "admission": False}, "a hold is still set")


def verify(r: Rehearsal, stages: Stages, runs: dict[str, str]) -> int:
    """The last stage: every run consistent; answers the duplicate count."""
    stages.say("Checking every run and counting commands processed twice")
    wanted = {
        "finished": ("succeeded", "booked"),
        "waiting": ("cancelled", "cancelled"),
        "held-processed": ("succeeded", "booked"),
        "held-never-sent": ("succeeded", "booked"),
        "in-flight": ("succeeded", "booked"),
    }
    for label, (state, outcome) in wanted.items():
        final = r.until(runs[label], ENDED)
        print(f"      {label}: {final['state']}, outcome {final.get('outcome')}", flush=True)
        check(
            (final["state"], final.get("outcome"), final["attention"]) == (state, outcome, False),
            f"run '{label}' ended {final['state']} / {final.get('outcome')}",
        )
    duplicates = 0
    for kind in (SCHEDULING, MESSAGING):
        counts = r.processed(kind)
        twice = [key for key, count in counts.items() if count > 1]
        duplicates += len(twice)
        print(f"      {kind}: {len(counts)} command(s), processed twice: {len(twice)}")
    print(f"duplicates: {duplicates}", flush=True)
    return duplicates


# ------------------------------------------------------------------------------------ main


def rehearse(state: Path) -> int:
    stages = Stages(STAGES)
    stages.say("Building a throwaway deployment of appointment-booking")
    from core.workflow.package import build_package

    built = build_package(ROOT / "examples" / WORKFLOW, state / "packages")
    source = PostgresServer.start()
    restored: RestoredServer | None = None
    taken: BaseBackup | None = None
    stack: LocalStack | None = None
    try:
        print(f"      PostgreSQL 17 with TLS on {source.host}:{source.port}", flush=True)
        stack = LocalStack.prepare(
            state / "stack", packages=[(built.path, built.digest)], database=source.default
        )
        stack.start_products()
        _apply(stack)
        r = Rehearsal(stack, state)
        old = r.start_instance()
        runs = mid_flight(r, stages)

        stages.say("Backing up the database online, while a booking is in flight")
        taken = backup(source, state / "backup", label="restore-rehearsal")
        print(f"      base backup from {taken.start_lsn} to {taken.stop_lsn}", flush=True)

        stages.say("Letting the old deployment go on after the backup")
        after_backup(r, runs)

        stages.say("Stopping the old service and its database (fencing)")
        r.stop_instance(old)
        source.stop()

        stages.say("Restoring the backup into a fresh PostgreSQL server")
        restored = restore(taken)
        restored.default.write_secret_files(Path(stack.summary["secretsDir"]))
        print(f"      restored server on {restored.host}:{restored.port}", flush=True)

        procedure(r, stages, runs)
        duplicates = verify(r, stages, runs)
        check(duplicates == 0, f"{duplicates} command(s) were processed twice")
    except Inconsistent as exc:
        print(f"restore rehearsal: INCONSISTENT: {exc}", flush=True)
        return 1
    finally:
        if stack is not None:
            stack.stop()
        if restored is not None:
            restored.stop()
        source.stop()
        if taken is not None:
            taken.remove()
    print(f"restore rehearsal: consistent, in {time.monotonic() - stages.started:.1f} s")
    return 0


def _apply(stack: LocalStack) -> None:
    ctl = str(Path(sys.executable).with_name("coordinatorctl"))
    config = ["--runtime-config", str(stack.runtime_file)]
    for args in (["check"], ["apply"]):
        result = subprocess.run([ctl, *config, *args], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            show(result.stdout + result.stderr)
            raise Inconsistent(f"coordinatorctl {args[0]} failed")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``make restore-rehearsal``."""
    parser = argparse.ArgumentParser(prog="restore-rehearsal")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    # A short folder: the coordinator's Unix socket paths must fit in about 100 bytes.
    chosen = os.environ.get("COORDINATOR_REHEARSAL_STATE")
    state = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="rehearsal-"))
    state.mkdir(parents=True, exist_ok=True)
    try:
        code = rehearse(state)
    finally:
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
