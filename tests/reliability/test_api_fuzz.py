"""API fuzzing from the OpenAPI document against a running stack (issue 27, item 3).

schemathesis (pinned in ``pyproject.toml``) generates requests for every operation of
``docs/openapi.yaml``, positive and negative, and :mod:`tests.reliability.fuzz_session`
adds our deployment's credentials — right, wrong, missing, garbage, another role's — and
real run and workflow ids. Each request goes over HTTP to a real deployed coordinator
(all components, PostgreSQL with TLS, the stand-ins of the example workflows) that has
runs waiting for a review, finished, held on an uncertain call and cancelled. Every answer
is judged by :func:`tests.reliability.fuzz_check.answer_faults`: no 5xx but a 503
``service.unavailable`` while a dependency is down or a listener at its limit, every error an
RFC 9457 problem with a catalogued code, no token or sent value in any answer. The fuzzing
takes nothing down (the seeding's dropped connection is over before it starts), so a 503
passes only if the gateway's over-limit count rose with it.

schemathesis's own checks hold every answer to a request sent as the document describes it
to the document (status, media type, headers, schema). The runs are there to be hit: each
round fuzzes the open deployment, then the restore holds, then opens it again as an
operator would (:func:`lift_holds`).

The run is reproducible: fixed seeds (Hypothesis's and ours, per operation and round) and
no example database, so no run replays or stores another's examples (``.hypothesis/``, which
git ignores, holds only Hypothesis's caches). The default run plans :data:`DEFAULT_REQUESTS`
requests; with ``COORDINATOR_RELIABILITY_LONG=1`` it plans :data:`LONG_REQUESTS`, of which at
least :data:`LONG_MINIMUM` must reach the server. The figures go to
``.cache/reliability/api-fuzz.json`` and to the output.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from core.codes import Code
from core.workflow.package import build_package
from devstack.postgres import DatabaseHandle
from devstack.products.casework import decide
from devstack.stack import wait_until
from gateway.events import sign
from gateway.metrics import HttpMetrics
from tests.helpers.faults import FaultStack, deployed_stack
from tests.reliability.exposure import EXPOSURE
from tests.reliability.fuzz_check import (
    NOTHING_DOWN,
    Answer,
    Conditions,
    Secrets,
    Sent,
    answer_faults,
    document_strings,
    own_words,
)
from tests.reliability.fuzz_session import (
    BEARER_VARIANTS,
    COMPLETION_VARIANTS,
    CREDENTIALS_PER_CASE,
    EVENT_VARIANTS,
    WEIGHTS,
    FuzzSession,
    Operation,
    Planned,
    Target,
    conformance_faults,
    operations,
    over_limit_count,
    planned_requests,
    security_of,
)

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT_PATH: Final = ROOT / "docs" / "openapi.yaml"
FIGURES: Final = ROOT / ".cache" / "reliability" / "api-fuzz.json"
LONG: Final = os.environ.get("COORDINATOR_RELIABILITY_LONG") == "1"
SEED: Final = 20270003
DEFAULT_REQUESTS: Final = 4000
"""Measured: 35 s for the whole test on a quiet 2-core machine (about 145 requests/s),
70 s while other stacks ran on it; the family's share of ``make test`` is about 90 s."""
LONG_REQUESTS: Final = 12000
LONG_MINIMUM: Final = 10000
"""Issue 27: at least this many requests reach the server in the long run."""
ROUNDS: Final = 4
ROUNDS_LONG: Final = 10
KEPT_SAMPLES: Final = 40
"""How many garbage tokens and start-input markers go to the tier's secrets check."""
EXAMPLES: Final = ("approval-notice", "appointment-booking", "register-change")
"""The first one is the workflow signed events start."""
REVIEW_PROJECT: Final = "licensing-reviews"
SETTLED: Final = ("waiting", "held", "succeeded", "failed", "cancelled")
PROBLEM: Final = "application/problem+json"
WAIT_SECONDS: Final = 120
"""Bound of every condition the seeding waits for, on a machine other stacks share."""

pytestmark = pytest.mark.slow


# -------------------------------------------------------------------- the valid inputs


def _approval(marker: str) -> dict[str, Any]:
    return {"applicationId": f"FZ-{marker[:20].upper()}", "applicantRef": f"fz-person-{marker}"}


def _appointment(marker: str) -> dict[str, Any]:
    return {
        "slotRef": f"fz-slot-{marker}",
        "subjectRef": f"fz-subject-{marker}",
        "recipientRef": f"fz-recipient-{marker}",
    }


def _register(marker: str) -> dict[str, Any]:
    digits = str(int(marker[:12], 16) % 1_000_000).zfill(6)
    return {
        "entryRef": f"FZ-{digits}",
        "changes": {"name": f"fz-name-{marker}"},
        "requesterRef": f"fz-requester-{marker}",
    }


INPUTS: Final[dict[str, Callable[[str], dict[str, Any]]]] = {
    "approval-notice": _approval,
    "appointment-booking": _appointment,
    "register-change": _register,
}


# ---------------------------------------------------------------------------- the stack


def _example_packages(out_dir: Path) -> list[tuple[Path, str]]:
    built = [build_package(ROOT / "examples" / name, out_dir / "packages") for name in EXAMPLES]
    return [(package.path, package.digest) for package in built]


@contextlib.contextmanager
def example_stack(database: DatabaseHandle) -> Iterator[FaultStack]:
    """The three example workflows deployed, their stand-ins running, the wall clock."""
    with deployed_stack(
        database, FaultStack, _example_packages, "api-fuzz", test_clock=False
    ) as stack:
        yield stack


@dataclass
class Seeded:
    """The runs the fuzzer finds on arrival, and the values their inputs carried."""

    run_ids: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _start(stack: FaultStack, workflow: str, seeded: Seeded) -> str:
    marker = uuid.uuid4().hex
    seeded.markers.append(marker)
    answer = httpx.post(
        f"{stack.local.url}/v1/workflows/{workflow}/runs",
        json={"input": INPUTS[workflow](marker)},
        headers={**_bearer(stack.producer_token), "Idempotency-Key": f"seed-{marker}"},
        timeout=30.0,
    )
    assert answer.status_code == 201, answer.text
    run_id = str(answer.json()["runId"])
    seeded.run_ids.append(run_id)
    return run_id


def _state(stack: FaultStack, run_id: str) -> str:
    answer = httpx.get(
        f"{stack.local.url}/v1/runs/{run_id}", headers=_bearer(stack.operator_token), timeout=30
    )
    answer.raise_for_status()
    return str(answer.json()["state"])


def _wait_state(stack: FaultStack, run_id: str, states: tuple[str, ...], what: str) -> None:
    wait_until(lambda: _state(stack, run_id) in states, what, timeout=WAIT_SECONDS)


def seed_runs(stack: FaultStack) -> Seeded:
    """Runs in every state an operator meets: waiting for a review, succeeded after a
    decision and its completion event, held on an uncertain call, cancelled; one started
    by a signed event."""
    seeded = Seeded()
    approvals = [_start(stack, "approval-notice", seeded) for _ in range(2)]
    for workflow in ("appointment-booking", "register-change"):
        for _ in range(2):
            _start(stack, workflow, seeded)
    # A signed event starts the first example.
    marker = uuid.uuid4().hex
    seeded.markers.append(marker)
    summary = stack.local.summary["eventSource"]
    event = {
        "specversion": "1.0",
        "id": f"seed-{marker}",
        "source": summary["source"],
        "type": "org.example.application.submitted",
        "data": INPUTS[EXAMPLES[0]](marker),
    }
    content = json.dumps(event).encode()
    answer = httpx.post(
        f"{stack.local.url}/v1/events",
        content=content,
        headers={
            "Content-Type": "application/json",
            "registry-event-signature": sign(
                Path(summary["keyFile"]).read_bytes(), content, int(time.time())
            ),
        },
        timeout=30.0,
    )
    assert answer.status_code == 201, answer.text
    seeded.run_ids.append(str(answer.json()["runId"]))
    # Every run so far settles first: the one-off fault below must meet the next run's
    # booking, not an earlier booking still on its way (which a loaded machine delays).
    for run_id in seeded.run_ids:
        _wait_state(stack, run_id, SETTLED, f"seeded run {run_id} to settle")
    # An uncertain booking: the stand-in processes it, then drops the connection.
    scheduling = stack.local.product_urls["scheduling"]
    httpx.post(
        scheduling + "/dev/faults", json={"mode": "drop-after", "count": 1}, timeout=10
    ).raise_for_status()
    held = _start(stack, "appointment-booking", seeded)
    _wait_state(stack, held, ("held",), "the uncertain booking to hold its run")
    httpx.delete(scheduling + "/dev/faults", timeout=10).raise_for_status()
    # The coordinator saw the connection go, not an answer (a 500 would say status-5xx).
    inspected = httpx.get(
        f"{stack.local.url}/v1/runs/{held}/inspection",
        headers=_bearer(stack.operator_token),
        timeout=30,
    ).json()
    causes = [step["cause"] for step in inspected["steps"] if "cause" in step]
    assert causes == ["connection-lost"], inspected
    # A reviewer approves the first application: Casework's completion event wakes its run.
    casework = stack.local.product_urls["casework-review-producer"]
    reviews = httpx.get(
        f"{casework}/dev/projects/{REVIEW_PROJECT}/review-requests", timeout=10
    ).json()["reviews"]
    application = INPUTS["approval-notice"](seeded.markers[0])["applicationId"]
    (review,) = [r for r in reviews if r["subjectRef"] == application]
    decide(casework, REVIEW_PROJECT, str(review["reviewId"]), "approved")
    _wait_state(stack, approvals[0], ("succeeded",), "the approved application's run")
    # The second application, still waiting for its review, cancelled by an operator.
    cancelled = httpx.post(
        f"{stack.local.url}/v1/runs/{approvals[1]}/cancel",
        json={"reason": "FUZZ-SEED"},
        headers=_bearer(stack.operator_token),
        timeout=30,
    )
    assert cancelled.status_code == 200, cancelled.text
    return seeded


def target_of(stack: FaultStack, seeded: Seeded) -> Target:
    summary = stack.local.summary
    (completion,) = summary["completions"].values()
    return Target(
        base_url=stack.local.url,
        metrics_url=stack.local.metrics_url,
        producer_token=stack.producer_token,
        operator_token=stack.operator_token,
        completion_token=Path(completion["tokenFile"]).read_text().strip(),
        completion_binding=str(completion["recipientBinding"]),
        event_source=str(summary["eventSource"]["source"]),
        event_key=Path(summary["eventSource"]["keyFile"]).read_bytes(),
        run_ids=list(seeded.run_ids),
        workflow_ids=list(EXAMPLES),
        inputs=INPUTS,
        event_workflow=EXAMPLES[0],
    )


def secrets_of(stack: FaultStack, target: Target, document: Any) -> Secrets:
    keys = [target.event_key, stack.admission_key, stack.audit_key]
    credentials = [
        target.producer_token,
        target.operator_token,
        target.completion_token,
        target.completion_binding,
        *(key.hex() for key in keys),
    ]
    return Secrets(
        credentials=credentials,
        known=[*target.run_ids, *target.workflow_ids, target.event_source],
        document_strings=document_strings(document),
        public_url=str(stack.local.summary["audience"]),
    )


# ----------------------------------------------------------------------------- the run

HOUSEKEEPING: Final = "FUZZ-HOUSEKEEPING"


def _attention(call: Callable[..., httpx.Response]) -> list[str]:
    """Every run that needs an operator, following the list's cursor."""
    found: list[str] = []
    cursor = ""
    for _ in range(1000):
        page = call("GET", f"/v1/runs?attention=true&limit=100{cursor}").json()
        found += [str(run["runId"]) for run in page["runs"]]
        if not page["nextCursor"]:
            return found
        cursor = f"&cursor={page['nextCursor']}"
    raise AssertionError("the list of runs that need attention did not end")


def lift_holds(stack: FaultStack) -> int:
    """Open the deployment again the way an operator would after a restore hold: reconcile
    and cancel every run that needs attention (which settles its snapshotted steps),
    attest, release both holds. Answers how many requests it took."""
    headers = _bearer(stack.operator_token)
    url = stack.local.url
    answers: list[str] = []

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        answer = httpx.request(method, url + path, json=body, headers=headers, timeout=30)
        answers.append(f"{method} {path} {answer.status_code} {answer.text[:200]}")
        return answer

    def holds() -> dict[str, bool]:
        answer = call("GET", "/v1/operator/doctor")
        assert answer.status_code == 200, answer.text
        found: dict[str, bool] = answer.json()["holds"]
        return found

    if not any(holds().values()):
        return len(answers)
    attested = {"recoveryReference": HOUSEKEEPING, "priorDeploymentFenced": True}
    for _ in range(5):
        if holds()["execution"]:
            for run_id in _attention(call):
                # The product's receipt settles a snapshotted step (even of an ended run);
                # where there is none to read, the cancel does.
                for action in ("reconcile", "cancel"):
                    call("POST", f"/v1/runs/{run_id}/{action}", {"reason": HOUSEKEEPING})
            call(
                "POST",
                "/v1/operator/complete-execution-recovery",
                {**attested, "executionHistoryComplete": True},
            )
            call("POST", "/v1/operator/release-restore-hold", {"reason": HOUSEKEEPING})
        if not holds()["execution"]:
            call(
                "POST",
                "/v1/operator/release-admission-hold",
                {**attested, "admissionHistoryComplete": True},
            )
        if not any(holds().values()):
            return len(answers)
    raise AssertionError("the holds stay:\n" + "\n".join(answers))


def negatable(ops: dict[str, Operation]) -> dict[str, bool]:
    """Whether schemathesis can break each operation's request at all (``/metrics`` and
    ``/ready`` take nothing to break)."""
    found: dict[str, bool] = {}
    for name, operation in ops.items():

        @settings(
            max_examples=1,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            verbosity=Verbosity.quiet,
        )
        @seed(SEED)
        @given(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        def probe(case: Any) -> None:
            pass

        try:
            probe()
        except Unsatisfiable:
            found[name] = False
        else:
            found[name] = True
    return found


OPEN_PHASE: Final = (
    "startRun",
    "postSignedEvent",
    "postReviewCompletion",
    "listRuns",
    "getRunStatus",
    "getRunInspection",
    "reconcileRun",
    "retrySameRun",
    "cancelRun",
    "bulkRetrySame",
    "bulkCancel",
    "bulkReconcile",
    "retainRuns",
    "getDoctorReport",
    "getReadiness",
    "getMetrics",
)
HOLD_PHASE: Final = (
    "placeRestoreHold",
    "completeExecutionRecovery",
    "releaseRestoreHold",
    "releaseAdmissionHold",
    "startRun",
    "postSignedEvent",
    "reconcileRun",
    "retrySameRun",
    "cancelRun",
    "bulkRetrySame",
    "bulkCancel",
    "bulkReconcile",
)
"""Each round fuzzes the operations of the open deployment first, then the restore holds
and what they change; then :func:`lift_holds` opens the deployment again, so that starts
and run actions of the next round are not all refused by a hold the fuzzer placed."""


def fuzz(session: FuzzSession, schema: Any, requests: int, lift: Callable[[], None]) -> None:
    """Send about ``requests`` generated requests, every operation by its weight, positive
    and negative, in rounds; seeded, with no example database."""
    ops = operations(schema)
    assert set(OPEN_PHASE) | set(HOLD_PHASE) == set(ops) == set(WEIGHTS)
    modes = negatable(ops)
    total = sum(WEIGHTS.values())
    rounds = ROUNDS_LONG if LONG else ROUNDS
    appearances = Counter([*OPEN_PHASE, *HOLD_PHASE])
    started = time.monotonic()
    try:
        for round_number in range(rounds):
            for phase, names in enumerate((OPEN_PHASE, HOLD_PHASE)):
                for name in names:
                    share = requests * WEIGHTS[name] / total / rounds / appearances[name]
                    for mode in GenerationMode:
                        if mode is GenerationMode.NEGATIVE and not modes[name]:
                            continue
                        count = round(share / CREDENTIALS_PER_CASE / (2 if modes[name] else 1))
                        label = f"{SEED}-{round_number}-{phase}-{name}-{mode}"
                        _run(session, schema, name, mode, label, count)
            lift()
    finally:
        session.tally.wall_seconds += time.monotonic() - started


def _run(
    session: FuzzSession, schema: Any, name: str, mode: GenerationMode, label: str, count: int
) -> None:
    strategy = planned_requests(schema, session.target, name, mode, label)

    @seed(label)
    @settings(
        max_examples=max(count, 1),
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(strategy)
    def send(requests: tuple[Planned, ...]) -> None:
        session.tally.cases += 1
        for planned in requests:
            session.send(planned)

    send()


def _keeper() -> Callable[[Planned, httpx.Response], None]:
    """Keeps, for the tier's secrets check, every problem document and the first
    :data:`KEPT_SAMPLES` garbage tokens, signatures and start-input markers sent."""
    numbers = itertools.count(1)

    def keep(planned: Planned, response: httpx.Response) -> None:
        if response.status_code >= 400 and response.content:
            EXPOSURE.keep_response("api-fuzz/problems", response)
        for value in (*planned.extra_credentials, *planned.markers):
            number = next(numbers)
            if number <= KEPT_SAMPLES:
                EXPOSURE.keep_secret(f"api-fuzz/sent-{number}", value)

    return keep


REACHED: Final = (
    "getReadiness",
    "listRuns",
    "getRunStatus",
    "getRunInspection",
    "getDoctorReport",
    "startRun",
    "postSignedEvent",
    "postReviewCompletion",
    "getMetrics",
)
"""Operations the fuzzer must get a 2xx from at least once: proof that its requests reach
the code behind authentication and validation."""


@pytest.mark.timeout(3600 if LONG else 600)
def test_fuzzed_requests_get_no_5xx_but_503_only_problems_and_no_echo(
    database: DatabaseHandle,
) -> None:
    document = yaml.safe_load(DOCUMENT_PATH.read_text())
    schema = schemathesis.openapi.from_path(str(DOCUMENT_PATH))
    ops = operations(schema)
    requests = LONG_REQUESTS if LONG else DEFAULT_REQUESTS
    with example_stack(database) as stack:
        coordinator = stack.start()
        try:
            seeded = seed_runs(stack)
            for index, marker in enumerate(seeded.markers):
                EXPOSURE.keep_secret(f"api-fuzz/seed-input-{index}", marker)
            target = target_of(stack, seeded)
            session = FuzzSession(target, secrets_of(stack, target, document), _keeper())
            try:
                lifting = Counter[str]()

                def lift() -> None:
                    lifting["requests"] += lift_holds(stack)

                fuzz(session, schema, requests, lift)
            finally:
                session.close()
            EXPOSURE.keep_response(
                "api-fuzz/metrics", httpx.get(stack.local.metrics_url + "/metrics", timeout=30)
            )
            log = stack.log_of(coordinator)
        finally:
            EXPOSURE.keep_stack("api-fuzz", stack)
    tally = session.tally
    figures = {"seed": SEED, "long": LONG, "planned": requests, **tally.figures()}
    figures["housekeepingRequests"] = lifting["requests"]
    figures["faults"] = [
        {"operation": op, "fault": fault, "count": entry[0], "example": entry[1]}
        for (op, fault), entry in sorted(tally.faults.items())
    ]
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n")
    print(
        f"\napi fuzz: {tally.sent} requests sent, {tally.server_errors} answered 5xx other "
        f"than 503, {tally.unavailable} answered 503, {len(tally.faults)} kinds of faulty "
        f"answer, {tally.sent / tally.wall_seconds:.0f} requests/s; figures in {FIGURES}"
    )

    assert tally.server_errors == 0, figures["faults"]
    # Nothing the fuzzer sent made a component fail: no traceback, no unexpected failure.
    assert "Traceback" not in log and "unexpected failure" not in log, log[-4000:]
    assert not tally.faults, figures["faults"]
    # Every operation of the document, with every credential its scheme has.
    wanted: dict[str, tuple[str, ...]] = {
        "bearer": BEARER_VARIANTS,
        "completion": COMPLETION_VARIANTS,
        "event": EVENT_VARIANTS,
    }
    for name, operation in ops.items():
        counts = tally.by_operation.get(name, Counter())
        assert counts.get("sent", 0) > 0, f"{name} was never sent"
        for variant in wanted.get(security_of(schema, operation), ()):
            assert counts.get(f"credential:{variant}", 0) > 0, f"{name} never with {variant}"
    for name in REACHED:
        assert tally.by_operation[name].get("2xx", 0) > 0, f"{name} never answered 2xx"
    # Hypothesis may stop early on an operation whose requests it has run out of.
    assert tally.sent >= (LONG_MINIMUM if LONG else requests * 0.8), figures


# ------------------------------------------------- the check itself rejects what it must

RUN: Final = "0d8d8f2c-5f0a-8a3b-9c1d-2e3f4a5b6c7d"
TOKEN: Final = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJmdXp6In0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
SECRETS = Secrets(
    credentials=[TOKEN],
    known=[RUN],
    document_strings=document_strings({"/v1/review-completions": {"example": "rv-8841-0001"}}),
    public_url="http://127.0.0.1:8080",
)
START = Sent(
    method="POST",
    path="/v1/workflows/approval-notice/runs",
    headers={"Idempotency-Key": "key-5b1f0e7a9c", "Authorization": "Bearer x"},
    body={"input": {"applicantRef": "person-7f3a9b2c1d"}},
)


def _problem(code: str, status: int, **members: Any) -> Answer:
    known = Code.parse(code)
    document = {
        "type": known.type_uri if known else f"https://registry-coordinator.dev/problems/{code}",
        "title": known.info.title if known else "Something",
        "status": status,
        "detail": "the request is malformed",
        "code": code,
        "instance": "http://127.0.0.1:8080/v1/workflows/approval-notice/runs",
        **members,
    }
    headers = {"content-type": "application/problem+json"}
    if status == 401:
        headers["www-authenticate"] = 'Bearer error="invalid_token"'
    return Answer(status, headers, json.dumps(document).encode())


DATABASE_DOWN: Final = Conditions(down=("database",))


def test_a_catalogued_problem_and_a_success_pass_the_check() -> None:
    assert answer_faults(START, _problem("request.invalid", 400), SECRETS) == []
    unavailable = _problem("service.unavailable", 503)
    assert answer_faults(START, unavailable, SECRETS, DATABASE_DOWN) == []
    assert answer_faults(START, unavailable, SECRETS, Conditions(over_limit=True)) == []
    assert answer_faults(START, _problem("authentication.refused", 401), SECRETS) == []
    created = Answer(
        201,
        {"content-type": "application/json", "location": f"/v1/runs/{RUN}"},
        json.dumps({"runId": RUN, "state": "running"}).encode(),
    )
    assert answer_faults(START, created, SECRETS) == []


def test_the_check_rejects_a_500() -> None:
    faults = answer_faults(START, _problem("internal", 500, correlationId="0" * 16), SECRETS)
    assert "answered 500" in faults


def test_the_check_rejects_a_problem_with_an_uncatalogued_code() -> None:
    faults = answer_faults(START, _problem("request.weird", 400), SECRETS)
    assert faults == ["problem code not in the catalogue (400)"]
    # A catalogued code with another status than the catalogue's is no better.
    assert answer_faults(START, _problem("run.not-found", 400), SECRETS) == [
        "problem code run.not-found answered with 400"
    ]


def test_the_check_rejects_a_text_plain_error() -> None:
    answer = Answer(400, {"content-type": "text/plain; charset=utf-8"}, b"Bad Request")
    faults = answer_faults(START, answer, SECRETS)
    assert "error 400 as text/plain" in faults
    assert "error 400 whose body is no JSON object" in faults


def test_the_check_rejects_an_answer_that_echoes_a_sent_value() -> None:
    echoed = _problem("input.invalid", 422, detail="person-7f3a9b2c1d is not allowed")
    assert answer_faults(START, echoed, SECRETS) == ["answer holds a sent value (17 characters)"]
    header = Answer(204, {"x-debug": "key-5b1f0e7a9c"}, b"")
    assert answer_faults(START, header, SECRETS) == ["answer holds a sent value (14 characters)"]
    # A value is caller text wherever it comes back; a member name may come back as the
    # JSON pointer of the place a 422 refuses (CONTRACT §8), a value never.
    named = Sent(method="POST", path=START.path, body={"input": {"zz-stray-member": "v-9e1d2c3b"}})
    stray = _problem("input.invalid", 422, detail="/input/zz-stray-member is not an allowed field")
    assert answer_faults(named, stray, SECRETS) == []
    valued = _problem("input.invalid", 422, detail="/input/zz-stray-member: v-9e1d2c3b")
    assert answer_faults(named, valued, SECRETS) == ["answer holds a sent value (10 characters)"]
    # A body that spells a header value the gateway always sends echoes nothing.
    problem = _problem("request.invalid", 400, detail="the body is not well-formed JSON")
    constant = Answer(400, {**problem.headers, "cache-control": "no-store"}, problem.body)
    for spelling in ("no-store", "application/"):
        spelled = Sent(method="POST", path=START.path, body={"time": spelling})
        assert answer_faults(spelled, constant, SECRETS) == [], spelling


def test_the_check_spares_a_sent_value_that_is_our_own_words() -> None:
    # Seed 20270003, long run: the fuzzer sent "is missing" as a workflow id, and the
    # gateway's refusal of a request without a token says "... is missing or ...".
    path = "/v1/workflows/is%20missing/runs"
    sent = Sent(method="POST", path=path, body={"input": {}})
    refused = _problem(
        "authentication.refused",
        401,
        detail="the access token is missing or not acceptable",
        instance="http://127.0.0.1:8080" + path,
    )
    assert "the access token is missing or not acceptable" in own_words()
    assert answer_faults(sent, refused, SECRETS) == []
    # The words inside more than our text holds are the caller's: still an echo.
    longer = "/v1/workflows/is%20missing-7f3a/runs"
    named = _problem(
        "workflow.not-found",
        404,
        detail="workflow 'is missing-7f3a' is not active",
        instance="http://127.0.0.1:8080" + longer,
    )
    assert answer_faults(Sent(method="POST", path=longer), named, SECRETS) == [
        "answer holds a sent value (15 characters)"
    ]
    # And so is a value that holds a whole sentence of ours and more, echoed whole.
    spelled = "the access token is missing or not acceptable, said fz-31c7"
    echoed = _problem("request.invalid", 400, detail=f"refused: {spelled}")
    assert answer_faults(
        Sent(method="POST", path=START.path, body={"a": spelled}), echoed, SECRETS
    ) == [f"answer holds a sent value ({len(spelled)} characters)"]


# The 503 check and its broken variants: an honest 503 passes; each variant, broken in one
# way, must be flagged with the fault named here.
HONEST_503: Final = (_problem("service.unavailable", 503), DATABASE_DOWN)
BROKEN_503: Final[dict[str, tuple[Answer, Conditions]]] = {
    "right-code-nothing-down": (_problem("service.unavailable", 503), NOTHING_DOWN),
    "another-503-code": (_problem("audit.response-unavailable", 503), DATABASE_DOWN),
    "not-a-problem": (
        Answer(503, {"content-type": "text/plain"}, b"Service Unavailable"),
        DATABASE_DOWN,
    ),
}
EXPECTED_503_FAULT: Final = {
    "right-code-nothing-down": "503 while no dependency was down",
    "another-503-code": "503 audit.response-unavailable, not service.unavailable",
    "not-a-problem": "error 503 as text/plain",
}


def test_an_honest_503_passes_the_check() -> None:
    answer, conditions = HONEST_503
    assert answer_faults(START, answer, SECRETS, conditions) == []


@pytest.mark.parametrize("variant", sorted(BROKEN_503))
def test_the_check_rejects_a_broken_503(variant: str) -> None:
    answer, conditions = BROKEN_503[variant]
    faults = answer_faults(START, answer, SECRETS, conditions)
    assert any(fault.startswith(EXPECTED_503_FAULT[variant]) for fault in faults), faults


def offline_target() -> Target:
    """A fuzz target at a port nothing serves: for session tests whose answers come from a
    mock transport."""
    return Target(
        base_url="http://127.0.0.1:9",
        metrics_url="http://127.0.0.1:9",
        producer_token="p" * 16,
        operator_token="o" * 16,
        completion_token="c" * 16,
        completion_binding="binding-0001",
        event_source="urn:fuzz",
        event_key=b"k" * 32,
        run_ids=[],
        workflow_ids=[],
        inputs={},
        event_workflow="none",
    )


def _session(over_limit: Callable[[], float | None], answer: Answer) -> FuzzSession:
    target = offline_target()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(answer.status, headers=dict(answer.headers), content=answer.body)

    return FuzzSession(
        target,
        SECRETS,
        lambda *_: None,
        over_limit=over_limit,
        transport=httpx.MockTransport(handler),
    )


def _start_planned() -> Planned:
    return Planned(
        operation="startRun",
        mode="positive",
        credential="producer",
        method="POST",
        url="http://127.0.0.1:9" + START.path,
        query=[],
        headers=dict(START.headers),
        content=b"{}",
        body={},
    )


def test_the_session_accepts_a_503_only_while_it_has_something_down_or_the_limit_rose() -> None:
    # The gateway's over-limit count as the session reads it: before the first request,
    # then at each 503 it has no outage to explain.
    counts = iter([3.0, 3.0, 4.0, 4.0])
    session = _session(lambda: next(counts), _problem("service.unavailable", 503))
    try:
        session.send(_start_planned())  # nothing down, count unchanged: a fault
        with session.outage("database"):
            session.send(_start_planned())  # explained by the outage
        session.send(_start_planned())  # the count rose: an over-limit refusal
        session.send(_start_planned())  # unchanged again: a fault
    finally:
        session.close()
    assert session.tally.unavailable == 4
    (fault,) = session.tally.faults
    assert fault == (
        "startRun",
        "503 while no dependency was down and the listener was under its limit",
    )
    assert session.tally.faults[fault][0] == 2
    assert next(counts, None) is None


def test_the_over_limit_count_is_read_from_the_gateways_own_series() -> None:
    metrics = HttpMetrics()
    metrics.observe("/v1/runs", 200)
    metrics.over_limit()
    metrics.over_limit()
    pages = {"/metrics": httpx.Response(200, text=metrics.render())}

    def handler(request: httpx.Request) -> httpx.Response:
        return pages.get(request.url.path, httpx.Response(404))

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert over_limit_count(client, "http://127.0.0.1:9") == 2
        assert over_limit_count(client, "http://127.0.0.1:9/elsewhere") is None


def test_the_check_rejects_a_token_in_any_form() -> None:
    token = TOKEN
    whole = _problem("authentication.refused", 401, detail=f"refused {token}")
    signature = _problem("authentication.refused", 401, detail=token.rsplit(".", 1)[1])
    for answer in (whole, signature):
        assert "answer holds a credential" in answer_faults(START, answer, SECRETS)


def test_the_check_spares_the_documented_path_and_document_values_but_not_a_forged_instance() -> (
    None
):
    by_id = Sent(method="GET", path="/v1/runs/not-a-run-id-4d2c9e")
    missing = _problem(
        "run.not-found", 404, instance="http://127.0.0.1:8080/v1/runs/not-a-run-id-4d2c9e"
    )
    assert answer_faults(by_id, missing, SECRETS) == []
    forged = _problem("run.not-found", 404, instance="http://elsewhere/not-a-run-id-4d2c9e")
    assert answer_faults(by_id, forged, SECRETS) == ["problem instance is not the request's path"]
    example = Sent(
        method="POST", path="/v1/review-completions", body={"rv-8841-0001": "rv-8841-0001"}
    )
    accepted = Answer(
        200, {"content-type": "application/json"}, b'{"at": "/v1/review-completions/rv-8841-0001"}'
    )
    assert answer_faults(example, accepted, SECRETS) == []


def test_the_check_knows_head_answers_and_the_readiness_document() -> None:
    head = Sent(method="HEAD", path="/v1/runs")
    refused = Answer(
        401,
        {"content-type": "application/problem+json", "www-authenticate": "Bearer"},
        b"",
    )
    assert answer_faults(head, refused, SECRETS) == []
    assert answer_faults(head, Answer(401, {"content-type": "text/html"}, b""), SECRETS) == [
        "error 401 as text/html",
        "401 without WWW-Authenticate",
    ]
    ready = Sent(method="GET", path="/ready")
    not_ready = Answer(
        503,
        {"content-type": "application/json"},
        b'{"ready": false, "reasons": ["store-unavailable"]}',
    )
    assert answer_faults(ready, not_ready, SECRETS, DATABASE_DOWN) == []
    # Not ready while nothing was down is as wrong as any other such 503.
    assert answer_faults(ready, not_ready, SECRETS) == [
        "503 while no dependency was down and the listener was under its limit"
    ]
    assert answer_faults(ready, Answer(500, {"content-type": "application/json"}, b""), SECRETS)


def test_the_session_counts_a_500_and_keeps_its_fault() -> None:
    target = offline_target()
    kept: list[int] = []
    session = FuzzSession(target, SECRETS, lambda _, response: kept.append(response.status_code))
    planned = Planned(
        operation="startRun",
        mode="positive",
        credential="producer",
        method="POST",
        url=target.base_url + START.path,
        query=[],
        headers=dict(START.headers),
        content=b"{}",
        body={},
    )
    request = httpx.Request("POST", planned.url)
    session.judge(planned, request, httpx.Response(500, text="Internal Server Error"))
    session.close()
    assert (session.tally.sent, session.tally.server_errors, kept) == (1, 1, [500])
    faults = {fault for (_, fault) in session.tally.faults}
    assert {"answered 500", "error 500 as text/plain"} <= faults


def test_schemathesis_judges_an_answer_against_the_document() -> None:
    schema = schemathesis.openapi.from_path(str(DOCUMENT_PATH))
    case = operations(schema)["getRunStatus"].Case(path_parameters={"runId": "a-run"})
    request = httpx.Request("GET", "http://127.0.0.1:9/v1/runs/a-run")

    def answer(status: int, content_type: str, body: bytes) -> httpx.Response:
        response = httpx.Response(
            status, headers={"content-type": content_type}, content=body, request=request
        )
        response.elapsed = timedelta(0)
        return response

    problem = _problem("run.not-found", 404)
    assert conformance_faults(case, answer(404, PROBLEM, problem.body)) == []
    assert conformance_faults(case, answer(418, PROBLEM, problem.body)) == [
        "schemathesis: Undocumented status code"
    ]
    assert conformance_faults(case, answer(200, "application/json", b'{"runId": 7}')) == [
        "schemathesis: Response violates schema"
    ]
    assert conformance_faults(case, answer(404, "text/plain", b"no")) == [
        "schemathesis: Undocumented Content-Type"
    ]
