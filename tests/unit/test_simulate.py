"""``coordinatorctl workflow simulate``: the example workflows' shipped simulations, what the
simulator refuses, and that it runs the dispatcher's own decisions (keys, classification,
the one resend after a 401, retries up to the deadline)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import simulate as sim
from cli import simulation_script as scripts
from core import derive
from core.errors import CoordinatorError
from core.workflow.check import check_source, check_source_dir
from core.workflow.model import Workflow
from tests.helpers.cli_run import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SIMULATIONS = sorted(EXAMPLES.glob("*/simulations/*.yaml"))
APPROVAL = EXAMPLES / "approval-notice"

# What each example's steps can reach besides its outcomes: failure kinds (CONTRACT §8.3).
# invalid-command is reachable in none of them: every value a command takes is a required
# input field or a value an earlier step kept with its catalogued type.
REACHABLE_FAILURES = {
    "approval-notice": {"refused", "deadline-exceeded", "mapping-invalid"},
    "appointment-booking": {"refused", "deadline-exceeded", "mapping-invalid"},
    "register-change": {"refused", "deadline-exceeded", "mapping-invalid"},
}
APPROVAL_INPUT = {"applicationId": "APP-2041", "applicantRef": "person-1"}


def simulate_file(
    source: Path, script: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str]:
    return run_cli(["workflow", "simulate", str(source), "--script", str(script), *extra], capsys)


def write_script(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def approval() -> Workflow:
    return check_source_dir(APPROVAL)


def approval_script(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "input": APPROVAL_INPUT,
        "answers": {
            "request-review": {"status": 201, "body": {"reviewId": "rev-1"}},
            "await-decision": {"decision": {"outcome": "approved"}},
            "send-approval": {"status": 202, "body": {"messageId": "msg-1"}},
        },
        "expect": {"state": "succeeded", "outcome": "approved"},
    }
    document.update(changes)
    return document


# ------------------------------------------------------------------- the shipped simulations


@pytest.mark.parametrize(
    "script", SIMULATIONS, ids=[f"{p.parent.parent.name}/{p.stem}" for p in SIMULATIONS]
)
def test_each_shipped_simulation_ends_as_it_expects(
    script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = simulate_file(script.parent.parent, script, capsys, "--output", "json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document["asExpected"] is True and document["mismatches"] == []
    expect = yaml.safe_load(script.read_text())["expect"]
    assert document["end"]["state"] == expect["state"]


@pytest.mark.parametrize("example", sorted(REACHABLE_FAILURES))
def test_the_simulations_cover_every_outcome_and_failure_kind(example: str) -> None:
    workflow = check_source_dir(EXAMPLES / example)
    scripts = [yaml.safe_load(p.read_text()) for p in (EXAMPLES / example).glob("simulations/*")]
    ends = [s["expect"] for s in scripts]
    assert {e["outcome"] for e in ends if e.get("outcome")} == set(workflow.outcomes)
    assert {e["failure"]["kind"] for e in ends if "failure" in e} == REACHABLE_FAILURES[example]
    assert any(e["state"] == "held" for e in ends), "an uncertain send that holds the run"
    timed = [s.id for s in workflow.steps.values() if getattr(s, "on_timeout", None)]
    for step_id in timed:
        assert any(s["answers"].get(step_id) == "timeout" for s in scripts), step_id


def test_the_text_shows_the_path_commands_keys_and_the_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = APPROVAL / "simulations" / "held-uncertain-send.yaml"
    code, out, _ = simulate_file(APPROVAL, script, capsys)
    assert code == 0
    run_id = sim.simulation_run_id("approval-notice")
    assert f"run {run_id}" in out.splitlines()[0]
    key = derive.command_key(sim.SIMULATION_KEY, run_id, "send-rejection")
    assert f"key     {key}" in out
    assert '"template": "application-rejected"' in out
    assert "500 -> uncertain (500, cause status-5xx)" in out
    assert out.strip().splitlines()[-2:] == [
        "end: held at step send-rejection (effect unknown, cause status-5xx)",
        "as expected",
    ]


def test_a_run_that_ends_otherwise_than_expected_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path, approval_script(expect={"state": "succeeded", "outcome": "x"}))
    code, out, _ = simulate_file(APPROVAL, script, capsys)
    assert code == 1
    assert out.strip().splitlines()[-1] == ('expect.outcome: expected "x", the run gave "approved"')


def test_the_input_file_replaces_the_scripts_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path, approval_script())
    other = tmp_path / "input.json"
    other.write_text(json.dumps({"applicationId": "APP-9999", "applicantRef": "person-2"}))
    code, out, _ = simulate_file(APPROVAL, script, capsys, "--input-file", str(other))
    assert code == 0
    assert '"subjectRef": "APP-9999"' in out and "APP-2041" not in out


def test_nothing_is_contacted(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("the simulator opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    workflow = approval()
    simulation = sim.simulate(workflow, scripts.parse_script(workflow, approval_script()))
    assert simulation.end == {"state": "succeeded", "outcome": "approved"}


# ------------------------------------------------------------------- the dispatcher's decisions


def test_keys_and_run_id_are_derived_as_a_deployment_derives_them() -> None:
    workflow = approval()
    key = bytes(range(32))
    run_id = "0190c2a4-1111-8222-9333-444455556666"
    simulation = sim.simulate(
        workflow,
        scripts.parse_script(workflow, approval_script()),
        admission_key=key,
        run_id=run_id,
    )
    assert [(c["step"], c["key"]) for c in simulation.commands] == [
        ("request-review", derive.command_key(key, run_id, "request-review")),
        ("send-approval", derive.command_key(key, run_id, "send-approval")),
    ]
    identity = derive.api_start_identity(
        sim.SIMULATION_KEY, sim.SIMULATION_ISSUER, "simulation", "approval-notice", "simulation"
    )
    assert sim.simulation_run_id("approval-notice") == derive.run_id(sim.SIMULATION_KEY, identity)


def test_a_401_is_sent_once_more_and_a_second_401_is_a_refusal() -> None:
    workflow = approval()
    answers = approval_script()["answers"]
    once = {
        **answers,
        "request-review": [{"status": 401}, {"status": 201, "body": {"reviewId": "r"}}],
    }
    simulation = sim.simulate(
        workflow, scripts.parse_script(workflow, approval_script(answers=once))
    )
    assert simulation.end["state"] == "succeeded"
    assert [a["result"] for a in simulation.events[0].attempts] == ["refused", "accepted"]

    twice = {"request-review": [{"status": 401}, {"status": 401}]}
    script = approval_script(answers=twice, expect={"state": "failed"})
    simulation = sim.simulate(workflow, scripts.parse_script(workflow, script))
    assert simulation.end == {
        "state": "failed",
        "failure": {"kind": "refused", "step": "request-review"},
    }


def test_retries_back_off_without_jitter_until_the_deadline() -> None:
    # The example gives request-review four hours; five minutes keeps the sequence short.
    text = (APPROVAL / "workflow.yaml").read_bytes()
    assert b"deadlineSeconds: 14400" in text
    workflow = check_source(text.replace(b"deadlineSeconds: 14400", b"deadlineSeconds: 300"))
    script = approval_script(
        answers={"request-review": {"status": 429}}, expect={"state": "failed"}
    )
    simulation = sim.simulate(workflow, scripts.parse_script(workflow, script))
    times = [a["at"][11:19] for a in simulation.events[0].attempts]
    # 1, 2, 4 … seconds apart; the next delay (256 s) would pass the 300-second deadline.
    assert times == ["09:00:00", "09:00:01", "09:00:03", "09:00:07", "09:00:15", "09:00:31",
                     "09:01:03", "09:02:07", "09:04:15"]  # fmt: skip
    assert simulation.end["failure"]["kind"] == "deadline-exceeded"


def test_a_wait_for_timeout_passes_the_whole_timeout() -> None:
    workflow = approval()
    answers = {
        "request-review": {"status": 201, "body": {"reviewId": "r"}},
        "await-decision": "timeout",
    }
    script = scripts.parse_script(workflow, approval_script(answers=answers))
    simulation = sim.simulate(workflow, script)
    assert [e.step for e in simulation.events] == ["request-review", "await-decision", "expired"]
    assert simulation.events[-1].at == "2030-01-21T09:00:00.000Z"  # 14 days on
    assert simulation.end == {"state": "succeeded", "outcome": "expired"}


# ------------------------------------------------------------------- refused scripts


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            # rejected: the run never reaches send-approval
            {
                "answers": {
                    **approval_script()["answers"],
                    "await-decision": {"decision": {"outcome": "rejected"}},
                    "send-rejection": {"status": 202, "body": {"messageId": "m"}},
                }
            },
            "coordinator.request.invalid: script: answers.send-approval: the run never reaches "
            "this step",
        ),
        (
            {"answers": {"nope": {"status": 201}}},
            "coordinator.request.invalid: script: answers.nope: the workflow has no step 'nope'",
        ),
        (
            {"answers": {"decide": {"status": 201}}},
            "coordinator.request.invalid: script: answers.decide: 'decide' is a choose step: "
            "nothing to answer",
        ),
        (
            {"answers": {"request-review": {"status": 201, "body": {"reviewId": "r"}}}},
            "coordinator.request.invalid: script: answers.await-decision: the run reaches this "
            "wait-for and the script does not answer it",
        ),
        (
            {
                "answers": {"request-review": [{"status": 500}, {"status": 201}]},
                "expect": {"state": "held"},
            },
            "coordinator.request.invalid: script: answers.request-review[1]: the run never uses "
            "this answer",
        ),
        (
            {
                "cancel": "await-decision",
                "answers": {
                    "request-review": {"status": 201, "body": {"reviewId": "r"}},
                    "await-decision": "timeout",
                    "notify-cancelled": {"status": 202, "body": {"messageId": "m"}},
                },
            },
            "coordinator.request.invalid: script: answers.await-decision: the run never uses "
            "this answer",
        ),
        (
            {"cancel": "notify-cancelled"},
            "coordinator.request.invalid: script: cancel: the run never reaches 'notify-cancelled'",
        ),
        (
            {"expect": {"state": "succeeded", "outcomes": "approved"}},
            "coordinator.request.invalid: script: expect.outcomes: unknown key; use failure, "
            "held, outcome, path, state, steps",
        ),
        (
            {"input": {"applicationId": "x"}},
            "coordinator.input.invalid: the input does not fit the workflow: /applicantRef: is "
            "required; /applicationId: does not match the required pattern",
        ),
    ],
    ids=[
        "unreachable",
        "unknown-step",
        "local-step",
        "unanswered",
        "unused-answer",
        "cancelled-before-the-answer",
        "cancel-unreached",
        "expect-key",
        "input",
    ],
)
def test_a_refused_script_exits_2_naming_what_is_wrong(
    changes: dict[str, Any], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path, approval_script(**changes))
    code, out, err = simulate_file(APPROVAL, script, capsys)
    assert (code, out, err) == (2, "", line + "\n")


def test_a_script_that_is_not_yaml_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("input: [unclosed\n")
    code, _, err = simulate_file(APPROVAL, script, capsys)
    assert code == 2
    assert err.startswith("coordinator.request.invalid: script: not valid YAML: line 2")
    assert "Traceback" not in err


def test_a_refusal_under_json_output_is_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path, approval_script(answers={"nope": {"status": 201}}))
    code, out, err = simulate_file(APPROVAL, script, capsys, "--output", "json")
    assert (code, out) == (2, "")
    assert json.loads(err.splitlines()[0])["code"] == "coordinator.request.invalid"


# ------------------------------------------------------------------- timed events, the trace


def _run(**changes: Any) -> sim.Simulation:
    workflow = approval()
    return sim.simulate(workflow, scripts.parse_script(workflow, approval_script(**changes)))


def _wait(decision: dict[str, Any]) -> dict[str, Any]:
    return {**approval_script()["answers"], "await-decision": decision}


def test_a_decision_after_the_timeout_is_the_timeout_and_the_trace_says_so() -> None:
    late = _run(
        answers={
            "request-review": {"status": 201, "body": {"reviewId": "r"}},
            "await-decision": {"decision": {"outcome": "approved"}, "afterSeconds": 1209600},
        },
        expect={"state": "succeeded", "outcome": "expired"},
    )
    wait = late.events[1].document()
    assert wait["fired"] == {"why": "timeout", "at": "2030-01-21T09:00:00.000Z"}
    assert wait["ignored"] == {"at": "2030-01-21T09:00:00.000Z"}  # at the timeout: too late
    assert "decision" not in wait and late.end == {"state": "succeeded", "outcome": "expired"}
    in_time = _run(answers=_wait({"decision": {"outcome": "approved"}, "afterSeconds": 1209599}))
    assert in_time.events[1].document()["fired"] == {
        "why": "decision",
        "at": "2030-01-21T08:59:59.000Z",
    }
    assert in_time.events[1].decision == {
        "outcome": "approved",
        "decidedAt": "2030-01-21T08:59:59.000Z",
    }


def test_a_decision_made_before_the_wait_is_found_when_the_run_reaches_it() -> None:
    early = _run(answers=_wait({"decision": {"outcome": "approved"}, "at": "2030-01-01T00:00:00Z"}))
    assert early.events[1].fired == {"why": "decision", "at": "2030-01-07T09:00:00.000Z"}


def test_a_cancel_can_come_at_an_instant_during_a_wait_or_between_retries() -> None:
    answers = {
        "request-review": {"status": 201, "body": {"reviewId": "r"}},
        "notify-cancelled": {"status": 202, "body": {"messageId": "m"}},
    }
    during_wait = _run(
        answers={**answers, "await-decision": "timeout"},
        cancel={"at": "2030-01-09T12:00:00Z"},
        expect={"state": "cancelled", "outcome": "cancelled"},
    )
    wait = during_wait.events[1]
    assert (wait.step, wait.state, wait.fired) == (
        "await-decision",
        "cancelled",
        {"why": "cancel", "at": "2030-01-09T12:00:00.000Z"},
    )
    assert [e.step for e in during_wait.events] == [
        "request-review",
        "await-decision",
        "notify-cancelled",
        "cancelled",
    ]
    # Two seconds in, while request-review waits for its third attempt (after 1 s, then 2 s).
    between = _run(
        answers={
            "request-review": {"status": 503, "body": {"code": "service.unavailable"}},
            "notify-cancelled": {"status": 202, "body": {"messageId": "m"}},
        },
        cancel={"step": "request-review", "afterSeconds": 2},
        expect={"state": "cancelled"},
    )
    call = between.events[0]
    assert [a["at"][17:19] for a in call.attempts] == ["00", "01"]
    assert (call.state, call.ended_at) == ("cancelled", "2030-01-07T09:00:02.000Z")
    assert between.end == {"state": "cancelled", "outcome": "cancelled"}


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"answers": _wait({"decision": {"outcome": "approved"}, "afterSeconds": -1})},
            "answers.await-decision.afterSeconds: whole seconds, 0 to 315360000",
        ),
        (
            {
                "answers": _wait(
                    {"decision": {"outcome": "a"}, "at": "2030-01-08T00:00:00Z", "afterSeconds": 1}
                )
            },
            "answers.await-decision.afterSeconds: give at or afterSeconds, not both",
        ),
        (
            {"answers": _wait({"decision": {"outcome": "a"}, "when": 3})},
            "answers.await-decision.when: unknown key; use decision, at, afterSeconds",
        ),
        ({"cancel": {"at": "2020-01-01T00:00:00Z"}}, "cancel.at: before the run starts"),
        (
            {"cancel": {"step": "decide", "at": "2031-01-01T00:00:00Z"}},
            "cancel.at: an instant stands alone; with a step use afterSeconds",
        ),
        (
            {"cancel": {"at": "2031-01-01T00:00:00Z"}},
            "cancel: the run ends before the cancel comes (2031-01-01T00:00:00.000Z)",
        ),
        (
            {"expect": {"state": "completed"}},
            "expect.state: one of succeeded, failed, cancelled, held, running",
        ),
        (
            {"expect": {"state": "succeeded", "steps": {"decide": "done"}}},
            "expect.steps.decide: one of completed, refused, failed, uncertain, cancelled, ready",
        ),
        (
            {"expect": {"state": "succeeded", "steps": {"nope": "completed"}}},
            "expect.steps.nope: the workflow has no step 'nope'",
        ),
        (
            {"expect": {"state": "succeeded", "path": ["request-review", "nope"]}},
            "expect.path[1]: the workflow has no step 'nope'",
        ),
    ],
    ids=[
        "negative-seconds",
        "at-and-after",
        "unknown-beside",
        "cancel-before-start",
        "cancel-step-and-at",
        "cancel-after-the-end",
        "run-state",
        "step-state",
        "step-id",
        "path-step",
    ],
)
def test_timed_events_and_expectations_no_run_can_meet_are_refused(
    changes: dict[str, Any], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path, approval_script(**changes))
    code, out, err = simulate_file(APPROVAL, script, capsys)
    assert (code, out, err) == (2, "", f"coordinator.request.invalid: script: {line}\n")


def test_the_path_and_each_steps_state_and_end_can_be_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expect = {
        "state": "succeeded",
        "path": ["request-review", "await-decision", "send-approval", "approved"],
        "steps": {
            "decide": {"state": "completed", "at": "2030-01-07T10:00:00Z"},
            "send-rejection": "completed",
        },
    }
    script = write_script(tmp_path, approval_script(expect=expect))
    code, out, _ = simulate_file(APPROVAL, script, capsys)
    assert code == 1
    assert out.strip().splitlines()[-3:] == [
        'expect.path: expected ["request-review", "await-decision", "send-approval", "approved"], '
        'the run took ["request-review", "await-decision", "decide", "send-approval", '
        '"approved"] (first difference at [2])',
        "expect.steps.decide.at: expected 2030-01-07T10:00:00Z, the step ended at "
        "2030-01-07T09:00:00.000Z",
        'expect.steps.send-rejection: expected "completed", the run never reached it',
    ]


def test_the_json_trace_carries_each_decision_as_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = APPROVAL / "simulations" / "approved-after-retry.yaml"
    code, out, _ = simulate_file(APPROVAL, script, capsys, "--output", "json")
    assert code == 0
    path = {entry["step"]: entry for entry in json.loads(out)["path"]}
    assert "note" not in json.dumps(path)
    first = path["request-review"]["attempts"][0]
    assert first["nextAttemptAt"] == "2030-01-07T09:00:01.000Z"
    assert path["request-review"]["kept"] == {"reviewId": "rev-1"}
    assert path["decide"]["branch"] == 0 and path["decide"]["next"] == "send-approval"
    assert path["decide"]["read"] == {"${steps.await-decision.outcome}": "approved"}
    assert path["await-decision"]["fired"]["why"] == "decision"
    assert path["approved"]["outcome"] == "approved"
    assert all("endedAt" in entry for entry in path.values())


# ------------------------------------------------------------------- operators after a hold

LOST = {"status": 500}
NOTICE = {"status": 202, "body": {"messageId": "msg-1"}}


def _held_approval(operator: Any, **changes: Any) -> sim.Simulation:
    answers = {**approval_script()["answers"], "send-approval": LOST}
    changes.setdefault("expect", {"state": "held"})
    return _run(answers=answers, operator=operator, **changes)


def test_a_receipt_that_never_saw_the_key_leaves_the_call_not_sent_for_a_retry_same() -> None:
    simulation = _held_approval(
        [
            {
                "action": "reconcile",
                "receipt": {"status": 404, "body": {"code": "receipt.not-found"}},
            },
            {"action": "retry-same", "afterSeconds": 60, "answer": NOTICE},
        ],
        expect={"state": "succeeded", "outcome": "approved"},
    )
    visits = [e for e in simulation.events if e.step == "send-approval"]
    assert [(e.state, (e.operator or {}).get("action")) for e in visits] == [
        ("uncertain", None),
        ("not-sent", "reconcile"),
        ("completed", "retry-same"),
    ]
    assert visits[1].operator == {
        "action": "reconcile",
        "at": "2030-01-07T09:00:00.000Z",
        "receipt": "not-seen",
    }
    # The resend carries the same command under the same key.
    assert visits[2].request == visits[0].request
    assert simulation.end == {"state": "succeeded", "outcome": "approved"}


def test_a_retry_same_outside_the_products_window_is_refused_and_the_run_stays_held() -> None:
    week = 7 * 86_400
    simulation = _held_approval({"action": "retry-same", "afterSeconds": week + 1})
    last = simulation.events[-1]
    assert last.operator is not None and last.operator["refused"] == "retry.refused"
    assert "Messaging keeps idempotency keys for 7 days" in last.operator["detail"]
    assert simulation.end == {
        "state": "held",
        "held": {"step": "send-approval", "state": "uncertain", "cause": "status-5xx"},
    }


def test_an_operators_cancel_of_a_held_run_takes_on_cancel_and_leaves_the_call_unknown() -> None:
    answers = {
        **approval_script()["answers"],
        "send-approval": LOST,
        "notify-cancelled": NOTICE,
    }
    simulation = _run(
        answers=answers,
        operator={"action": "cancel", "afterSeconds": 600},
        expect={"state": "cancelled", "outcome": "cancelled"},
    )
    held = [e for e in simulation.events if e.step == "send-approval"]
    assert [e.state for e in held] == ["uncertain", "uncertain"]
    assert [e.step for e in simulation.events][-2:] == ["notify-cancelled", "cancelled"]
    assert simulation.events[-2].at == "2030-01-07T09:10:00.000Z"


@pytest.mark.parametrize(
    ("operator", "line"),
    [
        ({"action": "undo"}, "operator.action: one of reconcile, retry-same, cancel"),
        (
            {"action": "cancel", "receipt": {"status": 200}},
            "operator.receipt: not for cancel; use action, afterSeconds, at",
        ),
        ({"action": "reconcile"}, "operator.receipt: Messaging is asked for a receipt"),
        ({"action": "retry-same"}, "operator.answer: the command is resent and needs an answer"),
        (
            [{"action": "retry-same", "answer": NOTICE}, {"action": "cancel"}],
            "operator[1]: the run is not held when this action would come",
        ),
        (
            {
                "action": "retry-same",
                "answer": [NOTICE, {"status": 202, "body": {"messageId": "m2"}}],
            },
            "operator.answer[1]: the run never uses this answer",
        ),
    ],
    ids=["unknown", "receipt-for-cancel", "no-receipt", "no-answer", "unused", "unused-answer"],
)
def test_operator_actions_a_run_cannot_take_are_refused(
    operator: Any, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = {**approval_script()["answers"], "send-approval": LOST}
    document = approval_script(answers=answers, operator=operator, expect={"state": "succeeded"})
    code, out, err = simulate_file(APPROVAL, write_script(tmp_path, document), capsys)
    assert (code, out, err) == (2, "", f"coordinator.request.invalid: script: {line}\n")


def test_an_answers_headers_carry_only_retry_after() -> None:
    workflow = approval()
    busy = {"status": 503, "body": {"code": "service.unavailable"}, "headers": {"X-Trace": "1"}}
    with pytest.raises(CoordinatorError) as caught:
        scripts.parse_script(workflow, approval_script(answers=_wait_answers(busy)))
    assert caught.value.detail == (
        "script: answers.request-review.headers.X-Trace: only Retry-After changes what happens"
    )
    asked = {**busy, "headers": {"retry-after": 30}}
    answers = [asked, {"status": 201, "body": {"reviewId": "r"}}]
    simulation = sim.simulate(
        workflow, scripts.parse_script(workflow, approval_script(answers=_wait_answers(answers)))
    )
    first = simulation.events[0].attempts[0]
    assert first["answer"].endswith("(Retry-After: 30)")
    assert first["nextAttemptAt"] == "2030-01-07T09:00:30.000Z"


def _wait_answers(review: Any) -> dict[str, Any]:
    return {**approval_script()["answers"], "request-review": review}
