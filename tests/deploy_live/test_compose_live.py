"""compose.yaml run for real: Docker Engine 20.10 (Debian 12's) and Compose v2, the images built
here from the wheel and the lock, the approval workflow end to end through the published
gateway, three dispatchers with one killed (-9) while calls are in flight, and the
recovery-only file started after a stop. One deployment serves the module's tests, in order;
each asserts one thing about it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.containers import CACHE, POSTGRES_IMAGE
from tests.deploy_live.compose_trial import (
    CHECKOUT,
    COORDINATOR_SERVICES,
    ENDED,
    MESSAGING,
    PROJECT,
    RECOVERY_ONLY,
    Trial,
    wait_for,
)
from tests.deploy_live.conftest import Images

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MAINTENANCE = {"postgres", "maintenance-auditd", "maintenance-recovery", "maintenance-gateway"}
SCALED_RUNS = 200


@pytest.fixture(scope="module")
def trial(images: Images) -> Iterator[Trial]:
    CACHE.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="compose-trial-", dir=CACHE))
    made = Trial(root, images.engine)
    # A project left by an interrupted session would hold the fixed addresses.
    made.remove()
    try:
        started = time.monotonic()
        made.make()
        made.compose("up", "--detach", timeout=600)
        made.wait_healthy(COORDINATOR_SERVICES)
        print(f"\ncompose up until every service was healthy: {time.monotonic() - started:.1f} s")
        made.start_products()
        yield made
    finally:
        made.remove()
        shutil.rmtree(root, ignore_errors=True)


def by_service(trial: Trial) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for container in trial.containers():
        found.setdefault(container["Service"], []).append(container)
    return found


def inspect_container(trial: Trial, name: str) -> dict[str, Any]:
    (found,) = json.loads(trial.engine.docker("inspect", name).stdout)
    record: dict[str, Any] = found
    return record


def test_every_service_is_healthy_and_the_one_shot_steps_succeeded(trial: Trial) -> None:
    services = by_service(trial)
    for name in (*COORDINATOR_SERVICES, "postgres"):
        (container,) = services[name]
        assert (container["State"], container["Health"]) == ("running", "healthy"), name
    for name in ("prepare", "apply"):
        (container,) = services[name]
        assert (container["State"], container["ExitCode"]) == ("exited", 0), name
    for c in sorted(trial.containers(), key=lambda c: c["Service"]):
        health = c.get("Health") or f"exit {c['ExitCode']}"
        print(f"  {c['Service']:<11} {c['State']:<8} {health}")


def test_one_image_serves_every_coordinator_service_and_runs_unprivileged(trial: Trial) -> None:
    images = set()
    for name in COORDINATOR_SERVICES:
        (container,) = by_service(trial)[name]
        found = inspect_container(trial, container["Name"])
        images.add(found["Image"])
        assert found["Config"]["User"] == "10001:10001", name
        assert found["HostConfig"]["ReadonlyRootfs"] is True, name
        assert found["HostConfig"]["CapDrop"] == ["ALL"], name
    assert len(images) == 1


def test_the_grpc_network_forwards_nothing_and_only_the_callers_have_the_outbound_one(
    trial: Trial,
) -> None:
    coordinator = json.loads(
        trial.engine.docker("network", "inspect", f"{PROJECT}_coordinator").stdout
    )[0]
    outbound = json.loads(trial.engine.docker("network", "inspect", f"{PROJECT}_outbound").stdout)[
        0
    ]
    assert coordinator["Internal"] is True and outbound["Internal"] is False
    networks = {
        name: set(
            inspect_container(trial, by_service(trial)[name][0]["Name"])["NetworkSettings"][
                "Networks"
            ]
        )
        for name in (*COORDINATOR_SERVICES, "postgres")
    }
    inside, both = {f"{PROJECT}_coordinator"}, {f"{PROJECT}_coordinator", f"{PROJECT}_outbound"}
    assert networks == {
        "auditd": inside,
        "admission": inside,
        "postgres": inside,
        "recovery": both,
        "dispatcher": both,
        "gateway": both,
    }
    # Nothing is forwarded off the internal network: from admission, the gateway's address on
    # the other network does not answer; from a dispatcher, which is on both, it does.
    probe = (
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection(('172.30.9.20', 8108), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    answers = {}
    for name in ("admission", "dispatcher"):
        container = by_service(trial)[name][0]["Name"]
        found = trial.engine.docker(
            "exec", container, "/opt/registry-coordinator/bin/python", "-c", probe
        )
        answers[name] = found.stdout.strip()
    assert answers == {"admission": "TimeoutError", "dispatcher": "connected"}


def test_grpc_between_containers_answers_only_a_peer_with_the_internal_certificate(
    trial: Trial,
) -> None:
    """From a dispatcher's container, the same HTTP/2 preface to admission's gRPC port: with
    the internal certificate the server answers (its SETTINGS frame); without one it closes
    the connection without a byte (TLS 1.3 checks the client's certificate after the
    client's side of the handshake ends, so the refusal arrives as the close)."""
    script = (
        "import socket, ssl, sys\n"
        "secrets = '/etc/registry-coordinator/secrets/'\n"
        "context = ssl.create_default_context(cafile=secrets + 'internal-ca.pem')\n"
        "context.check_hostname = False\n"
        "if sys.argv[1] == 'with':\n"
        "    context.load_cert_chain(secrets + 'internal.crt', secrets + 'internal.key')\n"
        "context.set_alpn_protocols(['h2'])\n"
        "raw = socket.create_connection(('172.30.8.11', 7101), timeout=5)\n"
        "try:\n"
        "    tls = context.wrap_socket(raw)\n"
        "    tls.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n')\n"
        "    print(len(tls.recv(64)))\n"
        "except (ssl.SSLError, ConnectionError):\n"
        "    print(0)\n"
    )
    (dispatcher,) = by_service(trial)["dispatcher"][:1]
    received = {}
    for case in ("with", "without"):
        found = trial.engine.docker(
            "exec", dispatcher["Name"], "/opt/registry-coordinator/bin/python", "-c", script, case
        )
        received[case] = int(found.stdout.strip())
    assert received["with"] > 0 and received["without"] == 0, received
    # The refused handshake is no raw gRPC line in admission's log: every line is the
    # coordinator's own format (timestamp, component, level).
    (admission,) = by_service(trial)["admission"]
    logged = trial.engine.docker("logs", admission["Name"])
    lines = (logged.stdout + logged.stderr).splitlines()
    assert lines and all(
        re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z admission ", line) for line in lines
    ), lines


def test_the_approval_workflow_runs_end_to_end_through_the_published_gateway(
    trial: Trial,
) -> None:
    started = trial.start_run("APP-2041")
    assert started.status_code == 201, started.text
    run_id = started.json()["runId"]
    wait_for(lambda: trial.run_state(run_id)["state"] == "waiting", "the review wait", 60)
    (review,) = [r for r in trial.reviews() if r["subjectRef"] == "APP-2041"]
    trial.decide(review["reviewId"], "approved")
    wait_for(lambda: trial.run_state(run_id)["state"] in ENDED, "the run's end", 60)
    status = trial.run_state(run_id)
    assert (status["state"], status.get("outcome")) == ("succeeded", "approved")
    sent = trial.product_stats(MESSAGING)
    assert [answer["status"] for answer in sent["answers"]] == [202]
    print(f"\napproval run {run_id}: {status['state']} / {status['outcome']}, notice HTTP 202")


def _secret_digests(trial: Trial) -> str:
    (auditd,) = by_service(trial)["auditd"]
    return trial.engine.docker(
        "exec",
        auditd["Name"],
        "/bin/sh",
        "-c",
        "cd /etc/registry-coordinator/secrets && stat -c '%n %a %u:%g %s' .* * | sort"
        " && sha256sum * | sort",
    ).stdout


def test_apply_run_by_hand_as_the_readme_says_starts_nothing_else(trial: Trial) -> None:
    """`docker compose run --rm --no-deps apply … deployment-status` with the deployment
    running: only the one-off container runs; prepare does not copy the secrets again."""
    (prepare,) = by_service(trial)["prepare"]
    before = inspect_container(trial, prepare["Name"])["State"]["StartedAt"]
    found = trial.compose(
        *("run", "--rm", "--no-deps", "apply"),
        *("--runtime-config", "/etc/registry-coordinator/runtime.yaml"),
        *("--output", "json", "deployment-status"),
    )
    assert json.loads(found.stdout)["status"] == "checked"
    assert inspect_container(trial, prepare["Name"])["State"]["StartedAt"] == before


def test_prepare_run_again_under_running_components_changes_nothing_they_read(
    trial: Trial,
) -> None:
    """Without --no-deps Compose starts prepare again; it then replaces each secret by a
    rename, so the components read the same files throughout and stay healthy."""
    (prepare,) = by_service(trial)["prepare"]
    before = inspect_container(trial, prepare["Name"])["State"]["StartedAt"]
    secrets = _secret_digests(trial)
    trial.compose(
        *("run", "--rm", "apply"),
        *("--runtime-config", "/etc/registry-coordinator/runtime.yaml", "deployment-status"),
    )
    assert inspect_container(trial, prepare["Name"])["State"]["StartedAt"] != before
    assert _secret_digests(trial) == secrets
    trial.wait_healthy(COORDINATOR_SERVICES)


def _start_all(trial: Trial, count: int) -> list[str]:
    def one(index: int) -> str:
        answer = trial.start_run(f"APP-{index:05d}")
        assert answer.status_code == 201, answer.text
        run_id: str = answer.json()["runId"]
        return run_id

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, range(count)))


def _kill_one_dispatcher(trial: Trial, which: int) -> str:
    """kill -9 of a dispatcher container's process, from the host: a crash, which the restart
    policy answers (`docker kill` would count as an operator's stop, which it does not)."""
    dispatchers = sorted(str(c["Name"]) for c in by_service(trial)["dispatcher"])
    name = dispatchers[which]
    pid = int(trial.engine.docker("inspect", "--format", "{{.State.Pid}}", name).stdout)
    assert pid > 0, name
    os.kill(pid, signal.SIGKILL)
    return name


def test_three_dispatchers_with_one_killed_mid_call_lose_nothing_and_send_nothing_twice(
    trial: Trial,
) -> None:
    trial.compose("up", "--detach", "--scale", "dispatcher=3")
    trial.wait_healthy(["dispatcher"])
    assert len(by_service(trial)["dispatcher"]) == 3
    reviews_before = len(trial.reviews())
    notices_before = len(trial.product_stats(MESSAGING)["processed"])

    with ThreadPoolExecutor(max_workers=1) as background:
        starting = background.submit(_start_all, trial, SCALED_RUNS)
        # Kill while review requests are being created: some are in flight right now.
        wait_for(
            lambda: len(trial.reviews()) - reviews_before >= SCALED_RUNS // 4,
            "a quarter of the review requests",
            120,
            every=0.05,
        )
        first = _kill_one_dispatcher(trial, 0)
        run_ids = starting.result(timeout=300)

    def settled_or_held(wanted: set[str]) -> bool:
        states = [trial.run_state(run_id) for run_id in run_ids]
        return all(s["state"] in wanted or s["attention"] for s in states)

    wait_for(lambda: settled_or_held({"waiting"}), "every run waiting for its review", 300, 1.0)

    # Decide every review, and kill another dispatcher while the notices are being sent.
    mine = {r["subjectRef"]: r["reviewId"] for r in trial.reviews() if r["status"] == "pending"}
    sent_before = len(trial.product_stats(MESSAGING)["answers"])
    with ThreadPoolExecutor(max_workers=8) as pool:
        decisions = [pool.submit(trial.decide, review_id) for review_id in mine.values()]
        wait_for(
            lambda: (
                len(trial.product_stats(MESSAGING)["answers"]) - sent_before >= SCALED_RUNS // 4
            ),
            "a quarter of the notices",
            120,
            every=0.05,
        )
        second = _kill_one_dispatcher(trial, 1)
        for decision in decisions:
            decision.result(timeout=60)

    wait_for(lambda: settled_or_held(ENDED), "every run ended or held", 300, 1.0)
    states = [trial.run_state(run_id) for run_id in run_ids]
    ended = [s for s in states if s["state"] in ENDED]
    held = [s for s in states if s["state"] not in ENDED]
    causes = []
    for status in held:
        inspection = trial.api("GET", f"/v1/runs/{status['runId']}/inspection", "case-operators")
        inspection.raise_for_status()
        cause = [s.get("cause") for s in inspection.json()["steps"] if s.get("cause")]
        assert cause, status
        causes.extend(cause)
    casework = trial.reviews()
    subjects = [r["subjectRef"] for r in casework if r["subjectRef"].startswith("APP-0")]
    messaging = trial.product_stats(MESSAGING)
    twice = [key for key, count in messaging["processed"].items() if count > 1]
    print(
        f"\nscaled kill: {len(run_ids)} runs admitted, dispatchers {first} and {second} killed "
        f"(-9); {len(ended)} ended, {len(held)} held (causes {sorted(set(causes))}); "
        f"reviews created {len(subjects)} for {len(set(subjects))} runs; notices processed "
        f"{len(messaging['processed']) - notices_before}, processed twice {len(twice)}"
    )
    assert len(ended) + len(held) == SCALED_RUNS
    # No review created twice; a run without one is held (its request's fate unknown to the
    # coordinator), never sent again.
    assert len(subjects) == len(set(subjects))
    assert SCALED_RUNS - len(set(subjects)) <= len(held)
    assert twice == []
    assert all(s.get("outcome") == "approved" for s in ended if s["state"] == "succeeded")
    # Both killed containers came back (restart: unless-stopped).
    trial.wait_healthy(["dispatcher"])


def test_the_recovery_only_file_starts_nothing_that_admits_or_dispatches(trial: Trial) -> None:
    trial.compose("stop", "--timeout", "20")
    assert trial.running_services() == set()
    # A bare `up` of the maintenance file.
    trial.compose(*RECOVERY_ONLY, "up", "--detach")
    trial.wait_healthy(["maintenance-gateway"], *RECOVERY_ONLY)
    assert trial.running_services() == MAINTENANCE
    refused = trial.start_run("APP-RESTORE")
    assert refused.status_code == 409 and refused.json()["code"] == "admission.recovery-only"
    doctor = trial.api("GET", "/v1/operator/doctor", "platform-operators")
    assert doctor.status_code == 200 and doctor.json()["mode"] == "recovery-only"
    # It has no service that could admit or dispatch: naming one is an error, not a start.
    for service in ("dispatcher", "admission", "apply", "prepare"):
        found = trial.compose(*RECOVERY_ONLY, "up", "--detach", service, check=False)
        assert found.returncode != 0 and "no such service" in found.stderr, found.stderr
    assert trial.running_services() == MAINTENANCE
    print(f"\nrecovery-only: running {sorted(trial.running_services())}; start refused 409")
    # Back to the ordinary instance.
    # Back to the ordinary instance, as the README says.
    trial.compose(*RECOVERY_ONLY, "stop", "--timeout", "20")
    trial.compose("up", "--detach", "--remove-orphans")
    trial.wait_healthy(COORDINATOR_SERVICES)
    assert trial.running_services() == {*COORDINATOR_SERVICES, "postgres"}
    assert not any(c["Service"].startswith("maintenance-") for c in trial.containers())
    again = trial.start_run("APP-AFTER-RESTORE")
    assert again.status_code == 201, again.text


def test_a_postgres_whose_first_start_failed_never_reports_healthy(images: Images) -> None:
    """The health check means "initialised as this deployment needs": a first start whose init
    script failed leaves a data volume the image never initialises again; the server on it
    comes up and answers, and the health check still refuses it, naming the reason."""
    engine = images.engine
    volume, first, second = (f"rc-deploy-test-half-{n}" for n in ("data", "first", "second"))
    health = yaml.safe_load((CHECKOUT / "compose.yaml").read_text())["services"]["postgres"][
        "healthcheck"
    ]["test"]
    assert health[0] == "CMD-SHELL"
    scripts = Path(tempfile.mkdtemp(prefix="failing-initdb-", dir=CACHE))
    (scripts / "10-fails.sh").write_text("echo 'init: failing on purpose' >&2\nexit 1\n")
    # Readable by the image's postgres account, which runs the init scripts.
    scripts.chmod(0o755)
    (scripts / "10-fails.sh").chmod(0o644)
    common = ["-v", f"{volume}:/var/lib/postgresql/data", "--network", "none"]

    def remove() -> None:
        for name in (first, second):
            engine.docker("rm", "--force", name, check=False)
        engine.docker("volume", "rm", "--force", volume, check=False)

    remove()  # what an interrupted session left
    secret = ["-e", "POSTGRES_PASSWORD_FILE=/etc/hostname"]
    try:
        failed = engine.docker(
            "run",
            "--name",
            first,
            *common,
            *secret,
            "-v",
            f"{scripts}:/docker-entrypoint-initdb.d:ro",
            POSTGRES_IMAGE,
            "postgres",
            check=False,
            timeout=120,
        )
        assert failed.returncode != 0 and "failing on purpose" in failed.stderr
        engine.docker("run", "--detach", "--name", second, *common, *secret, POSTGRES_IMAGE)
        # The server itself is up and answers on its socket...
        wait_for(
            lambda: engine.docker("exec", second, "pg_isready", check=False).returncode == 0,
            "the half-initialised server",
            60,
        )
        # ...and still the health check refuses it.
        check = engine.docker("exec", second, "/bin/sh", "-c", health[1], check=False)
        assert check.returncode == 1 and "did not finish" in check.stdout, check
    finally:
        remove()
        shutil.rmtree(scripts, ignore_errors=True)
