"""``make quickstart`` and ``make up``: the whole local stack on this machine.

The quickstart packages the examples, starts PostgreSQL 17 with TLS, the development issuer,
the product stand-ins and the coordinator (all five components), deploys with the real
``coordinatorctl``, and runs approval-notice end to end: a run asks Casework for a review
and waits; a reviewer's decision is recorded in the Casework stand-in; Casework's completion
event wakes the run at once (reads are an hour apart here, so nothing else could), and
Messaging accepts the approval notice. It then inspects the run, asks for the doctor report
and stops everything. Every stage prints a numbered line and then what the real command
printed, so a new user sees what they would see typing the commands themselves. ``--serve``
(``make up``) stops after the deployment and serves until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from devstack.postgres import PostgresServer
from devstack.stack import LocalStack, module_env, wait_until

ROOT = Path(__file__).resolve().parents[1]
# Tests run the quickstart into a scratch folder; users get var/quickstart/.
STATE = Path(os.environ.get("COORDINATOR_QUICKSTART_STATE") or ROOT / "var" / "quickstart")


def shown(path: Path) -> str:
    """``path`` relative to the checkout when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


EXAMPLES = ("approval-notice", "appointment-booking", "register-change")
DEMO_WORKFLOW = "approval-notice"
DEMO_INPUT = {"applicationId": "APP-2041", "applicantRef": "person-17"}
DECISION = "approved"
# Reads of a review result an hour apart: only the completion event can wake the run
# within the quickstart.
RESULT_CHECK_SECONDS = 3600
RUN_TIMEOUT_SECONDS = 30.0
CASEWORK_TOOL = "devstack.products.casework"


class Stages:
    """Numbered progress lines."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        print(f"[{self.done}/{self.total}] {text}  ({elapsed:.1f} s)", flush=True)


def show(text: str) -> None:
    for line in text.strip().splitlines():
        print(f"      {line}", flush=True)


def ctl(*args: str, quiet: bool = False) -> str:
    """Run the real coordinatorctl and echo what it printed, indented."""
    command = [str(Path(sys.executable).with_name("coordinatorctl")), *args]
    shown = " ".join(["coordinatorctl", *args]).replace(str(ROOT) + "/", "")
    print(f"      $ {shown}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if not quiet or result.returncode != 0:
        show(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"quickstart: the command above failed (exit {result.returncode})")
    return result.stdout


def package_examples(packages_dir: Path) -> list[tuple[Path, str]]:
    packages: list[tuple[Path, str]] = []
    for example in EXAMPLES:
        source = str(ROOT / "examples" / example)
        ctl("workflow", "check", source)
        built = json.loads(
            ctl("package", source, "--out", str(packages_dir), "--output", "json", quiet=True)
        )
        print(f"      {built['digest']}  {Path(built['path']).name}", flush=True)
        packages.append((Path(built["path"]), built["digest"]))
    return packages


def deploy(stack: LocalStack, stages: Stages) -> None:
    config = ["--runtime-config", str(stack.runtime_file)]
    stages.say("Checking the runtime file offline (reads no secret, contacts nothing)")
    ctl(*config, "check")
    stages.say("Planning, applying (schema 4, component roles, packages) and verifying")
    ctl(*config, "plan")
    ctl(*config, "apply")
    ctl(*config, "deployment-status")


def casework(*args: str) -> str:
    """Run the Casework stand-in's own tool and echo what it printed, indented."""
    command = [sys.executable, "-m", CASEWORK_TOOL, *args]
    print(f"      $ python -m {CASEWORK_TOOL} {' '.join(args)}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=module_env())
    show(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"quickstart: the command above failed (exit {result.returncode})")
    return result.stdout


class RunWatch:
    """Reads a run's status with the producer's token."""

    def __init__(self, stack: LocalStack, token_file: Path, run_id: str) -> None:
        self.url = f"{stack.url}/v1/runs/{run_id}"
        self.headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        self.last: dict[str, Any] = {}

    def state(self) -> str:
        answer = httpx.get(self.url, headers=self.headers, timeout=5.0)
        self.last = answer.json()
        return str(self.last.get("state"))

    def until(self, wanted: set[str], what: str) -> None:
        wait_until(lambda: self.state() in wanted, what, timeout=RUN_TIMEOUT_SECONDS)


def the_review(listing: str, subject: str) -> dict[str, Any]:
    """The review request of ``subject`` in a ``casework list`` answer."""
    reviews = [r for r in json.loads(listing)["reviews"] if r["subjectRef"] == subject]
    if len(reviews) != 1:
        raise SystemExit(f"quickstart: expected one review request for {subject} in Casework")
    review: dict[str, Any] = reviews[0]
    return review


def run_demo(stack: LocalStack, stages: Stages) -> None:
    producer = stack.mint("producer", "intake-portal-user", STATE / "producer-token")
    operator = stack.mint("operator", "duty-operator", STATE / "operator-token")
    print(f"      tokens written (mode 0600): {shown(producer)}, {shown(operator)}")
    api = ["--url", stack.url]
    casework_url = stack.product_urls["casework-review-producer"]
    project = stack.summary["completions"]["review"]["profile"]

    stages.say(f"Starting a run of {DEMO_WORKFLOW} with the producer's token")
    input_file = STATE / "input.json"
    input_file.write_text(json.dumps(DEMO_INPUT, indent=2) + "\n")
    started = json.loads(
        ctl(
            "start",
            "--workflow",
            DEMO_WORKFLOW,
            "--input-file",
            str(input_file),
            *api,
            "--token-file",
            str(producer),
            "--output",
            "json",
            quiet=True,
        )
    )
    run_id = started["runId"]
    print(f"      run {run_id} admitted in state {started['state']}", flush=True)
    watch = RunWatch(stack, producer, run_id)
    watch.until({"waiting"}, "the run reaching its review wait")
    print(
        f"      the run asked Casework for a review and is {watch.last['state']}; it reads the "
        f"decision every {RESULT_CHECK_SECONDS} s unless Casework's completion event comes first",
        flush=True,
    )

    stages.say("The review request as Casework shows it to reviewers")
    review = the_review(
        casework("list", "--url", casework_url, "--project", project),
        DEMO_INPUT["applicationId"],
    )

    stages.say(f"A reviewer records the decision '{DECISION}' in Casework")
    casework(
        "decide",
        "--url",
        casework_url,
        "--project",
        project,
        "--review-id",
        review["reviewId"],
        "--outcome",
        DECISION,
    )
    decided_at = time.monotonic()

    stages.say("Casework's completion event wakes the run; it sends the approval notice")
    watch.until({"succeeded", "failed", "cancelled", "held"}, "the run after the decision")
    woke_in = time.monotonic() - decided_at
    print(
        f"      the run ended {woke_in:.1f} s after the decision (the next scheduled read "
        f"was about {RESULT_CHECK_SECONDS // 60} minutes away)",
        flush=True,
    )
    ctl("status", "--run", run_id, *api, "--token-file", str(producer))
    casework_stats = httpx.get(casework_url + "/dev/stats", timeout=5.0).json()
    delivery = casework_stats["completions"].get(review["reviewId"], {})
    print(
        f"      casework: completion event delivered={delivery.get('delivered')} "
        f"(HTTP {delivery.get('lastStatus')}, attempts {delivery.get('attempts')})",
        flush=True,
    )
    stats = httpx.get(stack.product_urls["messaging"] + "/dev/stats", timeout=5.0).json()
    for answer in stats.get("answers", []):
        body = ", ".join(f"{k}={v}" for k, v in answer["body"].items())
        print(f"      messaging: HTTP {answer['status']} {body}", flush=True)
    twice = [key for key, count in stats["processed"].items() if count > 1]
    print(f"      messaging: {len(stats['processed'])} notice(s), processed twice: {len(twice)}")

    stages.say("Inspecting the run and asking for the doctor report (operator's token)")
    ctl("inspect", "--run", run_id, *api, "--token-file", str(operator))
    ctl("doctor", *api, "--token-file", str(operator))
    if watch.last.get("state") != "succeeded" or watch.last.get("outcome") != DECISION:
        raise SystemExit(f"quickstart: the run ended in state {watch.last.get('state')}")
    if not stats.get("answers"):
        raise SystemExit("quickstart: Messaging accepted no notice")


def run(serve: bool) -> int:
    stages = Stages(7 if serve else 12)
    if STATE.exists():
        shutil.rmtree(STATE)
    STATE.mkdir(parents=True)

    stages.say("Checking and packaging the example workflows")
    packages = package_examples(STATE / "packages")

    stages.say("Starting PostgreSQL 17 with TLS (private CA, migration and runtime roles)")
    # The server gets its own scratch folder: it runs as an unprivileged user, who may not
    # be able to reach a checkout under a private home folder.
    server = PostgresServer.start(durable=serve)
    stack: LocalStack | None = None
    try:
        print(f"      listening on {server.host}:{server.port} (TLS required)", flush=True)
        stages.say("Writing the runtime file and keys; starting the issuer and product stand-ins")
        stack = LocalStack.prepare(
            STATE / "stack",
            packages=packages,
            database=server.default,
            result_check_seconds=RESULT_CHECK_SECONDS,
        )
        print(f"      {shown(stack.runtime_file)}", flush=True)
        stack.start_products()
        for kind, url in sorted(stack.product_urls.items()):
            print(f"      {kind} stand-in at {url}", flush=True)
        deploy(stack, stages)

        stages.say("Starting the coordinator: gateway, admission, dispatcher, recovery, auditd")
        # `make up` shows each step transition as it happens; the quickstart stays brief.
        stack.start_coordinator(*(("--log-level", "info") if serve else ()))
        print(f"      {stack.url}/ready answers {httpx.get(stack.url + '/ready').text}")
        if serve:
            return serve_forever(stack, stages)
        run_demo(stack, stages)

        stages.say("Stopping the coordinator with SIGTERM and checking the audit journal")
        began = time.monotonic()
        status = stack.stop_process("coordinator")
        print(f"      coordinator exited with status {status} in {time.monotonic() - began:.1f} s")
        if status != 0:
            raise SystemExit("quickstart: the coordinator did not stop cleanly")
        # The operator's own check of the journal (exit 1 naming the first bad seq).
        ctl("audit", "verify", "--audit-file", str(stack.root / "deployment" / "audit.jsonl"))
    finally:
        if stack is not None:
            stack.stop()
        server.stop()
    print(f"      everything stopped; state and logs kept in {shown(STATE)}/")
    print(f"quickstart: done in {time.monotonic() - stages.started:.1f} s")
    return 0


def serve_forever(stack: LocalStack, stages: Stages) -> int:
    producer = shown(stack.mint("producer", "intake-portal-user", STATE / "producer-token"))
    operator = shown(stack.mint("operator", "duty-operator", STATE / "operator-token"))
    casework_url = stack.product_urls["casework-review-producer"]
    project = stack.summary["completions"]["review"]["profile"]
    stages.say("Serving until Ctrl-C")
    print(
        f"""
      coordinator:  {stack.url}   (metrics: {stack.metrics_url}/metrics)
      runtime file: {shown(stack.runtime_file)}
      tokens:       {producer}, {operator}

      Start a run, decide its review in Casework, and watch it finish:
        echo '{json.dumps(DEMO_INPUT)}' > /tmp/input.json
        .venv/bin/coordinatorctl start --workflow {DEMO_WORKFLOW} --input-file /tmp/input.json \\
            --url {stack.url} --token-file {producer}
        .venv/bin/python -m {CASEWORK_TOOL} list --url {casework_url} --project {project}
        .venv/bin/python -m {CASEWORK_TOOL} decide --url {casework_url} --project {project} \\
            --review-id <reviewId> --outcome approved
        .venv/bin/coordinatorctl inspect --run <runId> --url {stack.url} \\
            --token-file {operator}

      The operator console (open the URL it prints; runs that need you come first):
        .venv/bin/coordinatorctl --runtime-config {shown(stack.runtime_file)} console \\
            --url {stack.url} --token-file {operator}
""",
        flush=True,
    )
    log_path = stack.logs / "coordinator.log"
    print(f"      The coordinator's log ({shown(log_path)}) follows.\n", flush=True)
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with open(log_path, errors="replace") as log:
        while not stopping:
            for line in log.readlines():
                print(f"      | {line}", end="", flush=True)
            if any(process.poll() is not None for process in stack.processes.values()):
                print("make up: a process of the stack exited; stopping", file=sys.stderr)
                return 1
            time.sleep(0.5)
    print("make up: stopping", flush=True)
    return 0


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``make quickstart`` (and ``make up`` with ``--serve``)."""
    parser = argparse.ArgumentParser(prog="quickstart")
    parser.add_argument("--serve", action="store_true", help="keep the stack running (make up)")
    args = parser.parse_args(argv)
    raise SystemExit(run(args.serve))


if __name__ == "__main__":
    main()
