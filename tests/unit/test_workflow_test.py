"""``coordinatorctl workflow test``: every script of a workflow in one command, its verdicts,
the coverage of the graph's edges (and each call's way to failure), the exit statuses and
the coverage picture. Each shipped example's suite passes at 100 % of its edges."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import suite as tests
from core.workflow.check import check_source
from core.workflow.graph import graph_of
from tests.helpers.cli_run import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/workflow.yaml"))

# A choose whose branch and otherwise lead to the same step, so a path of step ids alone
# cannot tell which was taken; a call with onRefused; a wait-for with onTimeout.
WORKFLOW: dict[str, Any] = {
    "format": "registry-coordinator/workflow/v1",
    "id": "coverage-probe",
    "version": "1.0.0",
    "description": "A workflow whose every way out can be told apart.",
    "input": {
        "type": "object",
        "additionalProperties": False,
        "required": ["applicantRef", "urgent"],
        "properties": {"applicantRef": {"type": "string"}, "urgent": {"type": "boolean"}},
    },
    "connections": {"notices": "messaging"},
    "outcomes": ["done", "refused"],
    "start": "which",
    "steps": {
        "which": {
            "choose": [{"when": {"equals": ["${input.urgent}", True]}, "next": "send"}],
            "otherwise": "send",
        },
        "send": {
            "call": {
                "connection": "notices",
                "operation": "send-notice",
                "input": {
                    "template": "t",
                    "recipientRef": "${input.applicantRef}",
                    "parameters": {},
                },
            },
            "next": "done",
            "onRefused": "refused",
        },
        "done": {"finish": {"outcome": "done"}},
        "refused": {"finish": {"outcome": "refused"}},
    },
}
SENT = {"status": 202, "body": {"messageId": "m-1"}}


def source(tmp_path: Path, scripts: dict[str, dict[str, Any]]) -> Path:
    folder = tmp_path / "probe"
    (folder / "simulations").mkdir(parents=True)
    (folder / "workflow.yaml").write_text(yaml.safe_dump(WORKFLOW, sort_keys=False))
    for name, script in scripts.items():
        (folder / "simulations" / f"{name}.yaml").write_text(yaml.safe_dump(script))
    return folder


def script(urgent: bool, answer: dict[str, Any], **expect: Any) -> dict[str, Any]:
    return {
        "input": {"applicantRef": "p-1", "urgent": urgent},
        "answers": {"send": answer},
        "expect": expect,
    }


def workflow_test(folder: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run_cli(["workflow", "test", str(folder), *args, "--output", "json"], capsys)
    return code, json.loads(out) if out else None, err


def test_the_ways_out_are_the_graphs_edges_and_each_calls_failure() -> None:
    workflow = check_source(yaml.safe_dump(WORKFLOW, sort_keys=False).encode())
    ways = tests.ways_of(workflow)
    assert [w.document() for w in ways] == [
        {"from": None, "to": "which", "kind": "start"},
        {"from": "which", "to": "send", "kind": "choose[0]"},
        {"from": "which", "to": "send", "kind": "otherwise"},
        {"from": "send", "to": "done", "kind": "next"},
        {"from": "send", "to": "refused", "kind": "onRefused"},
        {"from": "send", "to": None, "kind": "failure"},
    ]
    assert len(ways) == len(graph_of(workflow).edges) + 1


def test_coverage_tells_a_branch_from_otherwise_to_the_same_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = source(tmp_path, {"urgent": script(True, SENT, state="succeeded", outcome="done")})
    code, document, _ = workflow_test(folder, capsys)
    assert code == 0
    assert document["scripts"] == [{"script": "simulations/urgent.yaml", "passed": True}]
    assert document["coverage"]["steps"] == {"reached": 3, "total": 4, "missing": ["refused"]}
    assert document["coverage"]["edges"] == {
        "taken": 3,
        "total": 6,
        "percent": 50.0,
        "missing": [
            {"from": "which", "to": "send", "kind": "otherwise"},
            {"from": "send", "to": "refused", "kind": "onRefused"},
            {"from": "send", "to": None, "kind": "failure"},
        ],
    }


def test_every_way_taken_is_full_coverage_and_min_coverage_decides_the_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts = {
        "urgent": script(True, SENT, state="succeeded", outcome="done"),
        "plain-refused": script(
            False, {"status": 422, "body": {"code": "x"}}, state="succeeded", outcome="refused"
        ),
    }
    folder = source(tmp_path, scripts)
    code, document, _ = workflow_test(folder, capsys, "--min-coverage", "90")
    assert code == 1 and document["coverage"]["edges"]["taken"] == 5
    # A call's failure: every attempt answered 503 until the deadline.
    scripts["unavailable"] = script(
        False,
        {"status": 503, "body": {"code": "service.unavailable"}},
        state="failed",
        failure={"kind": "deadline-exceeded", "step": "send"},
    )
    folder = source(tmp_path / "again", scripts)
    code, document, _ = workflow_test(folder, capsys, "--min-coverage", "100")
    assert code == 0
    assert document["coverage"]["edges"] == {
        "taken": 6,
        "total": 6,
        "percent": 100.0,
        "missing": [],
    }
    assert [s["passed"] for s in document["scripts"]] == [True, True, True]


def test_a_failing_script_is_exit_1_and_a_refused_one_exit_2_and_the_others_still_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = script(True, SENT, state="succeeded", outcome="refused")
    folder = source(tmp_path, {"a-wrong": wrong})
    code, document, _ = workflow_test(folder, capsys)
    assert code == 1
    assert document["scripts"] == [
        {
            "script": "simulations/a-wrong.yaml",
            "passed": False,
            "difference": 'expect.outcome: expected "refused", the run gave "done"',
        }
    ]
    refused = {**wrong, "answers": {"no-such-step": SENT}}
    folder = source(tmp_path / "again", {"a-wrong": wrong, "b-refused": refused})
    code, document, _ = workflow_test(folder, capsys)
    assert code == 2
    assert document["scripts"][1] == {
        "script": "simulations/b-refused.yaml",
        "passed": False,
        "difference": "script: answers.no-such-step: the workflow has no step 'no-such-step'",
        "code": "coordinator.request.invalid",
    }
    # The refused script adds no coverage; the failing one still counts what it reached.
    assert document["coverage"]["steps"]["reached"] == 3


def test_the_text_names_each_script_and_what_no_script_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = source(tmp_path, {"urgent": script(True, SENT, state="succeeded", outcome="done")})
    code, out, _ = run_cli(["workflow", "test", str(folder), "--min-coverage", "50"], capsys)
    assert code == 0
    assert out.splitlines() == [
        "testing coverage-probe 1.0.0: 1 scripts",
        "  pass     simulations/urgent.yaml",
        "steps reached: 3 of 4",
        "  never reached: refused",
        "edges taken: 3 of 6 (50 %), at least 50 % wanted",
        "  never taken: which -> send (otherwise)",
        "  never taken: send -> refused (onRefused)",
        "  never taken: send -> (the run fails) (failure)",
        "1 of 1 scripts passed",
    ]


def test_the_coverage_picture_marks_what_no_script_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = source(tmp_path, {"urgent": script(True, SENT, state="succeeded", outcome="done")})
    picture = tmp_path / "coverage.svg"
    code, _, _ = workflow_test(folder, capsys, "--coverage-svg", str(picture))
    assert code == 0
    drawn = picture.read_text()
    assert 'id="edge-which-choose-0"' in drawn
    assert 'class="edge choose covered" id="edge-which-choose-0"' in drawn
    assert 'class="edge otherwise uncovered" id="edge-which-otherwise"' in drawn
    assert 'class="edge onRefused uncovered" id="edge-send-onRefused"' in drawn
    assert 'class="node finish unreached" id="step-refused"' in drawn
    assert "never failed at send" in drawn


def test_no_scripts_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = source(tmp_path, {})
    code, _, err = run_cli(["workflow", "test", str(folder)], capsys)
    assert code == 2 and "holds no *.yaml" in err


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_examples_suite_passes_and_takes_every_edge(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, document, err = workflow_test(
        ROOT / "examples" / example, capsys, "--min-coverage", "100"
    )
    assert (code, err) == (0, ""), document
    assert all(result["passed"] for result in document["scripts"])
    assert document["coverage"]["edges"]["missing"] == []
    assert document["coverage"]["steps"]["missing"] == []
