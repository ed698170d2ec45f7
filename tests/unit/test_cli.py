"""coordinatorctl basics: version, exit codes, error lines, token files, references, output."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cli.main import default_idempotency_key, json_requested
from core import __version__
from tests.helpers.cli_run import run_cli
from tests.helpers.refusals import json_refusal


@pytest.fixture(autouse=True)
def _no_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # An operator's shell may export these; the tests below say what they expect explicitly.
    monkeypatch.delenv("COORDINATOR_URL", raising=False)
    monkeypatch.delenv("COORDINATOR_TOKEN_FILE", raising=False)
    monkeypatch.delenv("COORDINATOR_RUNTIME_CONFIG", raising=False)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


class Recorder:
    """A stand-in gateway for the client side only: records requests, answers scripted bodies."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answer: tuple[int, str, dict[str, Any]] = (200, "application/json", {})
        self.script: list[tuple[int, str, dict[str, Any]]] = []
        """Answers for the next requests, in order, before ``answer`` again."""


@pytest.fixture
def gateway() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            recorder.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": json.loads(body) if body else None,
                }
            )
            status, content_type, document = (
                recorder.script.pop(0) if recorder.script else recorder.answer
            )
            data = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _handle
        do_POST = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator-token"
    path.write_text("header.payload.signature\n")
    path.chmod(0o600)
    return path


@dataclass
class Ctl:
    """Runs coordinatorctl against the recording gateway with the operator token file."""

    url: str
    recorder: Recorder
    token_file: Path
    capsys: pytest.CaptureFixture[str]

    def __call__(self, *args: str) -> tuple[int, str, str]:
        """Exit code, standard output and standard error of ``args`` plus --url and
        --token-file."""
        return run_cli(
            [*args, "--url", self.url, "--token-file", str(self.token_file)], self.capsys
        )


@pytest.fixture
def ctl(capsys: pytest.CaptureFixture[str], gateway: tuple[str, Recorder], token_file: Path) -> Ctl:
    url, recorder = gateway
    return Ctl(url, recorder, token_file, capsys)


def test_both_scripts_print_the_same_version() -> None:
    ctl = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main(['--version'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    svc = subprocess.run(
        [sys.executable, "-c", "from core.launcher import main; main(['--version'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ctl.stdout.strip() == svc.stdout.strip() == __version__


def test_no_arguments_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli([], capsys)
    assert code == 2


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli(["doctor", "--token", "abc"], capsys)
    assert code == 2


def test_api_command_without_url_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], token_file: Path
) -> None:
    code, _, _ = run_cli(["doctor", "--token-file", str(token_file)], capsys)
    assert code == 2


@pytest.mark.parametrize("defect", ["missing", "empty", "group-readable", "world-readable"])
def test_token_file_defects_are_refused(
    defect: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], gateway: tuple[str, Recorder]
) -> None:
    url, recorder = gateway
    path = tmp_path / "token"
    if defect != "missing":
        path.write_text("" if defect == "empty" else "abc\n")
        path.chmod({"empty": 0o600, "group-readable": 0o640, "world-readable": 0o604}[defect])
    code, _, err = run_cli(["doctor", "--url", url, "--token-file", str(path)], capsys)
    assert code == 1
    assert last_line(err).startswith("coordinator.auth.token-file:")
    assert recorder.requests == []


def test_token_is_sent_without_its_trailing_newline(ctl: Ctl) -> None:
    recorder = ctl.recorder
    recorder.answer = (200, "application/json", {"activationReady": True})
    code, out, _ = ctl("doctor", "--output", "json")
    assert code == 0
    assert json.loads(out) == {"activationReady": True}
    assert recorder.requests[0]["headers"]["Authorization"] == "Bearer header.payload.signature"
    assert recorder.requests[0]["path"] == "/v1/operator/doctor"


def test_options_are_accepted_before_the_subcommand(
    capsys: pytest.CaptureFixture[str], gateway: tuple[str, Recorder], token_file: Path
) -> None:
    url, recorder = gateway
    recorder.answer = (200, "application/json", {"runs": [], "nextCursor": None})
    code, out, _ = run_cli(
        ["--url", url, "--token-file", str(token_file), "--output", "json", "list", "--limit", "5"],
        capsys,
    )
    assert code == 0
    assert json.loads(out) == {"runs": [], "nextCursor": None}
    assert recorder.requests[0]["path"] == "/v1/runs?limit=5"


def test_problem_becomes_a_prefixed_code_and_exit_1(ctl: Ctl) -> None:
    recorder = ctl.recorder
    recorder.answer = (
        409,
        "application/problem+json",
        {"code": "execution.held", "status": 409, "title": "held", "detail": "restore hold"},
    )
    code, _, err = ctl("retry-same", "--run", "r1", "--reason", "inc-1")
    assert code == 1
    assert last_line(err) == "coordinator.execution.held: restore hold"
    assert recorder.requests[0]["body"] == {"reason": "inc-1"}


@pytest.mark.parametrize("reason", ["has space", "mail@example.org", "x" * 129, ""])
def test_bad_reasons_are_refused_before_sending(reason: str, ctl: Ctl) -> None:
    recorder = ctl.recorder
    code, _, err = ctl("cancel", "--run", "r1", "--reason", reason)
    assert code == 1
    assert last_line(err).startswith("coordinator.request.invalid:")
    assert reason not in last_line(err) or reason == ""
    assert recorder.requests == []


def test_bad_recovery_reference_is_refused_before_sending(ctl: Ctl) -> None:
    recorder = ctl.recorder
    code, _, err = ctl(
        "release-admission-hold",
        "--recovery-reference",
        "a b",
        "--admission-history-complete",
        "--prior-deployment-fenced",
    )
    assert code == 1
    assert last_line(err).startswith("coordinator.request.invalid:")
    assert recorder.requests == []


def test_attestations_are_required(ctl: Ctl) -> None:
    recorder = ctl.recorder
    code, _, _ = ctl(
        "complete-execution-recovery",
        "--recovery-reference",
        "inc-7",
        "--execution-history-complete",
    )
    assert code == 2
    assert recorder.requests == []


def test_start_sends_input_and_a_stable_default_key(tmp_path: Path, ctl: Ctl) -> None:
    recorder = ctl.recorder
    recorder.answer = (201, "application/json", {"runId": "r-1", "state": "running"})
    input_file = tmp_path / "input.json"
    input_file.write_text('{"applicationId": "APP-1"}')
    args = ["start", "--workflow", "approval-notice", "--input-file", str(input_file)]
    assert ctl(*args, "--output", "json")[0] == 0
    assert ctl(*args, "--output", "json")[0] == 0
    first, second = recorder.requests
    assert first["path"] == "/v1/workflows/approval-notice/runs"
    assert first["body"] == {"input": {"applicationId": "APP-1"}}
    key = first["headers"]["Idempotency-Key"]
    assert key == second["headers"]["Idempotency-Key"]
    assert key == default_idempotency_key("approval-notice", input_file.read_bytes())
    assert key != default_idempotency_key("approval-notice", b'{"applicationId": "APP-2"}')


def test_unreachable_coordinator_is_a_refusal_not_a_traceback(
    capsys: pytest.CaptureFixture[str], token_file: Path
) -> None:
    code, _, err = run_cli(
        ["status", "--run", "r1", "--url", "http://127.0.0.1:9", "--token-file", str(token_file)],
        capsys,
    )
    assert code == 1
    assert last_line(err).startswith("coordinator.service.unavailable:")
    assert "Traceback" not in err


def test_retain_validates_the_cutoff_locally(ctl: Ctl) -> None:
    recorder = ctl.recorder
    code, _, err = ctl("retain", "--before", "2026-07-01", "--limit", "10")
    assert code == 1
    assert last_line(err).startswith("coordinator.request.invalid:")
    code, _, _ = ctl("retain", "--before", "2026-07-01T00:00:00Z", "--limit", "101")
    assert code == 2
    assert recorder.requests == []


def test_retain_refuses_a_cutoff_later_than_now_before_sending(ctl: Ctl) -> None:
    later = (datetime.now(UTC) + timedelta(days=365)).strftime("%Y-%m-%dT%H:%M:%SZ")
    code, _, err = ctl("retain", "--before", later, "--limit", "10", "--dry-run")
    assert code == 1
    assert last_line(err).startswith("coordinator.request.invalid: --before is later than now")
    assert ctl.recorder.requests == []


def test_retain_dry_run_asks_for_a_dry_run_and_a_plain_retain_does_not(ctl: Ctl) -> None:
    recorder = ctl.recorder
    recorder.answer = (200, "application/json", {"dryRun": True, "erased": 0, "wouldErase": 0})
    args = ["retain", "--before", "2026-07-01T00:00:00Z", "--limit", "10", "--output", "json"]
    assert ctl(*args, "--dry-run")[0] == 0
    recorder.answer = (200, "application/json", {"erased": 0, "runIds": []})
    assert ctl(*args)[0] == 0
    dry, real = recorder.requests
    assert dry["path"] == real["path"] == "/v1/operator/retain"
    assert dry["body"] == {"before": "2026-07-01T00:00:00Z", "limit": 10, "dryRun": True}
    assert real["body"] == {"before": "2026-07-01T00:00:00Z", "limit": 10}


def test_retain_older_than_computes_the_cutoff_from_now(ctl: Ctl) -> None:
    ctl.recorder.answer = (200, "application/json", {"erased": 0, "runIds": []})
    earliest = datetime.now(UTC).replace(microsecond=0) - timedelta(days=30)
    assert ctl("retain", "--older-than", "30d", "--limit", "10")[0] == 0
    latest = datetime.now(UTC) - timedelta(days=30)
    [sent] = ctl.recorder.requests
    cutoff = datetime.fromisoformat(sent["body"]["before"].replace("Z", "+00:00"))
    assert earliest <= cutoff <= latest


@pytest.mark.parametrize(
    "args",
    [
        ["--limit", "10"],
        ["--limit", "10", "--before", "2026-07-01T00:00:00Z", "--older-than", "30d"],
        ["--limit", "10", "--older-than", "30 days"],
        ["--limit", "10", "--older-than", "0d"],
        ["--limit", "10", "--older-than", "30d", "--all", "--dry-run"],
    ],
)
def test_retain_cutoff_options_are_usage_errors_when_wrong(ctl: Ctl, args: list[str]) -> None:
    assert ctl("retain", *args)[0] == 2
    assert ctl.recorder.requests == []


def test_retain_all_calls_again_with_one_cutoff_until_a_call_erases_less_than_the_limit(
    ctl: Ctl,
) -> None:
    ctl.recorder.script = [
        (200, "application/json", {"erased": 2, "runIds": ["a", "b"]}),
        (200, "application/json", {"erased": 2, "runIds": ["c", "d"]}),
        (200, "application/json", {"erased": 1, "runIds": ["e"]}),
    ]
    ctl.recorder.answer = (500, "application/json", {})  # a fourth call would fail the test
    code, out, err = ctl(
        "retain", "--before", "2026-07-01T00:00:00Z", "--limit", "2", "--all", "--output", "json"
    )
    assert code == 0, err
    assert json.loads(out) == {
        "before": "2026-07-01T00:00:00Z",
        "erased": 5,
        "calls": 3,
        "runIds": ["a", "b", "c", "d", "e"],
    }
    assert [r["body"] for r in ctl.recorder.requests] == [
        {"before": "2026-07-01T00:00:00Z", "limit": 2}
    ] * 3


def test_retain_all_stops_at_the_first_refusal(ctl: Ctl) -> None:
    ctl.recorder.script = [(200, "application/json", {"erased": 2, "runIds": ["a", "b"]})]
    ctl.recorder.answer = (
        403,
        "application/problem+json",
        {"code": "authorization.refused", "detail": "no"},
    )
    code, _, err = ctl("retain", "--older-than", "400d", "--limit", "2", "--all")
    assert code == 1
    assert last_line(err).startswith("coordinator.authorization.refused")
    assert len(ctl.recorder.requests) == 2


def test_text_output_of_a_run_list_is_a_table(ctl: Ctl) -> None:
    recorder = ctl.recorder
    recorder.answer = (
        200,
        "application/json",
        {
            "runs": [
                {
                    "runId": "r-2",
                    "workflow": {"id": "approval-notice"},
                    "state": "held",
                    "attention": True,
                    "createdAt": "2026-12-01T10:00:00Z",
                }
            ],
            "nextCursor": "c2",
            "total": 1,
            "totalIsEstimate": False,
        },
    )
    code, out, _ = ctl("list", "--state", "held")
    assert code == 0
    header, row, total, cursor = out.strip().splitlines()
    assert header.split() == ["runId", "workflow", "state", "outcome", "attention", "createdAt"]
    assert row.split() == ["r-2", "approval-notice", "held", "-", "true", "2026-12-01T10:00:00Z"]
    assert (total, cursor) == ("total: 1", "nextCursor: c2")
    assert recorder.requests[0]["path"] == "/v1/runs?state=held"


def test_the_attention_list_shows_each_runs_step_and_since_when(ctl: Ctl) -> None:
    run = {
        "runId": "r-2",
        "workflow": {"id": "approval-notice"},
        "state": "held",
        "attention": True,
        "createdAt": "2026-12-01T10:00:00Z",
        "attentionStep": {
            "step": "send-approval",
            "cause": "status-5xx",
            "since": "2026-12-01T10:05:00Z",
        },
    }
    ctl.recorder.answer = (
        200,
        "application/json",
        {"runs": [run], "nextCursor": None, "total": 12345, "totalIsEstimate": True},
    )
    code, out, _ = ctl(
        "list", "--attention", "true", "--order", "oldest", "--cause", "status-5xx",
        "--step", "send-approval", "--updated-before", "2026-12-01T11:00:00Z",
    )  # fmt: skip
    assert code == 0
    header, row, total, cursor = out.strip().splitlines()
    assert header.split() == ["runId", "workflow", "state", "step", "cause", "since"]
    assert row.split() == [
        "r-2", "approval-notice", "held", "send-approval", "status-5xx", "2026-12-01T10:05:00Z"
    ]  # fmt: skip
    assert (total, cursor) == ("total: 12345 (an estimate)", "nextCursor: -")
    assert ctl.recorder.requests[0]["path"] == (
        "/v1/runs?attention=true&step=send-approval&cause=status-5xx"
        "&updatedBefore=2026-12-01T11%3A00%3A00Z&order=oldest"
    )
    code, _, err = ctl("list", "--order", "sideways")
    assert code == 2 and "'sideways' is not one of" in err


def test_bulk_posts_the_filters_and_prints_the_dry_runs_runs(ctl: Ctl) -> None:
    ctl.recorder.answer = (
        200,
        "application/json",
        {"dryRun": True, "matched": 2, "runIds": ["r-1", "r-2"]},
    )
    code, out, _ = ctl(
        "bulk", "retry-same", "--reason", "INC-2041", "--attention", "true",
        "--cause", "status-5xx", "--state", "held", "--limit", "1000", "--dry-run",
    )  # fmt: skip
    assert code == 0
    assert out.strip().splitlines() == [
        "runId",
        "r-1",
        "r-2",
        "retry-same would act on 2 runs (dry run)",
    ]
    (request,) = ctl.recorder.requests
    assert (request["method"], request["path"]) == ("POST", "/v1/runs/bulk/retry-same")
    assert request["body"] == {
        "reason": "INC-2041",
        "filter": {"attention": True, "state": "held", "cause": "status-5xx"},
        "limit": 1000,
        "dryRun": True,
    }


def test_bulk_prints_each_runs_result_or_code_and_a_tally(ctl: Ctl) -> None:
    results = [
        {"runId": "r-1", "result": "accepted"},
        {"runId": "r-2", "code": "retry.refused"},
        {"runId": "r-3", "result": "accepted"},
    ]
    ctl.recorder.answer = (
        200,
        "application/json",
        {"dryRun": False, "matched": 3, "results": results},
    )
    code, out, _ = ctl("bulk", "cancel", "--reason", "INC-2041")
    assert code == 0
    lines = out.strip().splitlines()
    assert [line.split() for line in lines[1:4]] == [
        ["r-1", "accepted", "-"],
        ["r-2", "-", "retry.refused"],
        ["r-3", "accepted", "-"],
    ]
    assert lines[-1] == "cancel on 3 runs: accepted 2, retry.refused 1"
    # No filter: an empty one, and the default limit.
    assert ctl.recorder.requests[0]["body"] == {"reason": "INC-2041", "filter": {}, "limit": 100}


def test_bulk_refuses_a_bad_action_limit_or_reason_before_asking(ctl: Ctl) -> None:
    for args in (
        ("bulk", "erase", "--reason", "INC-1"),
        ("bulk", "cancel", "--reason", "INC-1", "--limit", "1001"),
        ("bulk", "cancel", "--reason", "INC-1", "--limit", "0"),
        ("bulk", "cancel"),
    ):
        code, _, _ = ctl(*args)
        assert code == 2, args
    code, _, err = ctl("bulk", "cancel", "--reason", "not a reference")
    assert code == 1 and "coordinator.request.invalid" in err
    assert ctl.recorder.requests == []


def test_list_by_state_takes_a_run_state_and_refuses_anything_else_before_asking(
    ctl: Ctl,
) -> None:
    ctl.recorder.answer = (200, "application/json", {"runs": [], "nextCursor": None})
    code, _, _ = ctl("list", "--state", "held", "--output", "json")
    assert code == 0 and ctl.recorder.requests[-1]["path"] == "/v1/runs?state=held"
    asked = len(ctl.recorder.requests)
    code, _, err = ctl("list", "--state", "bogus")
    assert code == 2 and "'bogus' is not one of" in err and "'cancelled'" in err
    assert len(ctl.recorder.requests) == asked


def test_list_searches_pass_their_parameters_as_the_api_names_them(ctl: Ctl) -> None:
    ctl.recorder.answer = (200, "application/json", {"runs": [], "nextCursor": None})
    searches = [
        (["--id-prefix", "8e5d07f1"], "runIdPrefix=8e5d07f1"),
        (
            ["--workflow", "approval-notice", "--start-key", "order 77", "--start-sub", "portal"],
            "workflow=approval-notice&startKey=order+77&startSub=portal",
        ),
        (
            ["--event-source", "urn:example:bookings", "--event-id", "evt-9"],
            "eventSource=urn%3Aexample%3Abookings&eventId=evt-9",
        ),
    ]
    for args, query in searches:
        code, _, err = ctl("list", *args, "--output", "json")
        assert code == 0, err
        assert ctl.recorder.requests[-1]["path"] == f"/v1/runs?{query}"


# -- environment defaults ------------------------------------------------------------------


def test_url_and_token_file_default_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    gateway: tuple[str, Recorder],
    token_file: Path,
) -> None:
    url, recorder = gateway
    recorder.answer = (200, "application/json", {"activationReady": True})
    monkeypatch.setenv("COORDINATOR_URL", url)
    monkeypatch.setenv("COORDINATOR_TOKEN_FILE", str(token_file))
    code, out, err = run_cli(["doctor", "--output", "json"], capsys)
    assert code == 0, err
    assert json.loads(out) == {"activationReady": True}
    assert recorder.requests[0]["headers"]["Authorization"] == "Bearer header.payload.signature"


@pytest.mark.parametrize("position", ["before", "after"])
def test_the_command_line_wins_over_the_environment(
    position: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    gateway: tuple[str, Recorder],
    token_file: Path,
) -> None:
    url, recorder = gateway
    recorder.answer = (200, "application/json", {"activationReady": True})
    # Both would fail: nothing listens on port 9, and the token file does not exist.
    monkeypatch.setenv("COORDINATOR_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("COORDINATOR_TOKEN_FILE", str(tmp_path / "absent-token"))
    given = ["--url", url, "--token-file", str(token_file)]
    args = [*given, "doctor"] if position == "before" else ["doctor", *given]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    assert len(recorder.requests) == 1


def test_without_url_or_environment_it_is_still_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, token_file: Path
) -> None:
    monkeypatch.setenv("COORDINATOR_TOKEN_FILE", str(token_file))
    code, _, err = run_cli(["doctor"], capsys)
    assert code == 2
    assert "COORDINATOR_URL" in err


# -- refusals under --output json ------------------------------------------------------------


def test_a_problem_under_json_output_is_one_json_document_on_stderr(ctl: Ctl) -> None:
    ctl.recorder.answer = (
        409,
        "application/problem+json",
        {"code": "execution.held", "status": 409, "title": "held", "detail": "restore hold"},
    )
    code, out, err = ctl("retry-same", "--run", "r1", "--reason", "inc-1", "--output", "json")
    assert (code, out) == (1, "")
    document = json_refusal(err)
    assert document["code"] == "coordinator.execution.held"
    assert document["detail"] == "restore hold"
    assert document["errors"] == [{"code": "coordinator.execution.held", "detail": "restore hold"}]


def test_text_refusals_keep_their_exact_line(ctl: Ctl) -> None:
    ctl.recorder.answer = (
        409,
        "application/problem+json",
        {"code": "execution.held", "status": 409, "title": "held", "detail": "restore hold"},
    )
    code, _, err = ctl("retry-same", "--run", "r1", "--reason", "inc-1")
    assert (code, err) == (1, "coordinator.execution.held: restore hold\n")


@pytest.mark.parametrize("position", ["before", "after"])
def test_a_local_refusal_under_json_output_is_json_too(
    position: str,
    capsys: pytest.CaptureFixture[str],
    gateway: tuple[str, Recorder],
    token_file: Path,
) -> None:
    url, recorder = gateway
    command = ["cancel", "--run", "r1", "--reason", "has space"]
    options = ["--url", url, "--token-file", str(token_file), "--output", "json"]
    args = [*options, *command] if position == "before" else [*command, *options]
    code, out, err = run_cli(args, capsys)
    assert (code, out) == (1, "")
    document = json_refusal(err)
    assert document["code"] == "coordinator.request.invalid"
    assert "has space" not in err
    assert recorder.requests == []


def test_a_token_file_refusal_under_json_output_names_no_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gateway: tuple[str, Recorder]
) -> None:
    url, _ = gateway
    path = tmp_path / "token"
    path.write_text("s3cr3t-token-value\n")
    path.chmod(0o644)
    code, _, err = run_cli(
        ["doctor", "--url", url, "--token-file", str(path), "--output", "json"], capsys
    )
    assert code == 1
    assert json_refusal(err)["code"] == "coordinator.auth.token-file"
    assert "s3cr3t" not in err


# -- text tables -----------------------------------------------------------------------------


def test_nested_lists_are_tables_and_values_are_shown_as_written(ctl: Ctl) -> None:
    ctl.recorder.answer = (
        200,
        "application/json",
        {
            "activationReady": True,
            "holds": [
                {"kind": "execution", "reason": "[red]inc-1[/red]", "since": None},
                {"kind": "admission", "reason": "inc-2", "since": "2026-12-01T10:00:00Z"},
            ],
        },
    )
    code, out, _ = ctl("doctor")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "activationReady: true"
    assert lines[1] == "holds:"
    assert lines[2].split() == ["kind", "reason", "since"]
    assert lines[3].split() == ["execution", "[red]inc-1[/red]", "-"]
    assert lines[4].split() == ["admission", "inc-2", "2026-12-01T10:00:00Z"]
    assert all(line == line.rstrip() for line in lines)
    # Columns line up: each value starts where its header does.
    assert lines[3].index("[red]") == lines[2].index("reason") == lines[4].index("inc-2")


def test_a_wide_table_is_never_wrapped(ctl: Ctl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    run = {
        "runId": "r-" + "7" * 60,
        "workflow": {"id": "approval-notice"},
        "state": "running",
        "attention": False,
        "createdAt": "2026-12-01T10:00:00Z",
    }
    ctl.recorder.answer = (200, "application/json", {"runs": [run], "nextCursor": None})
    code, out, _ = ctl("list")
    assert code == 0
    header, row, _total, cursor = out.strip().splitlines()
    assert header.split()[0] == "runId"
    assert row.split()[0] == run["runId"]
    assert cursor == "nextCursor: -"


def test_audit_verify_reads_the_runtime_files_journal_and_names_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.runtime_files import complete_runtime, write_runtime

    document = complete_runtime(tmp_path)
    journal = tmp_path / "journal.jsonl"
    document["deployment"]["auditFile"] = str(journal)
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    # Neither --audit-file nor a runtime file: a usage error.
    code, _, err = run_cli(["audit", "verify"], capsys)
    assert code == 2 and "--audit-file" in err
    # The runtime file's journal, absent: refused, naming the file.
    code, _, err = run_cli(["--runtime-config", str(runtime), "audit", "verify"], capsys)
    assert code == 1
    assert last_line(err).startswith(f"coordinator.audit.journal-broken: {journal}: cannot be read")
    # An empty journal is intact: no records.
    journal.write_bytes(b"")
    code, out, _ = run_cli(
        ["--runtime-config", str(runtime), "audit", "verify", "--output", "json"], capsys
    )
    assert code == 0
    assert json.loads(out) == {
        "status": "intact",
        "auditFile": str(journal),
        "records": 0,
        "firstSeq": None,
        "lastSeq": None,
        "lastLineHash": "0" * 64,
    }


def test_coordinator_runtime_config_stands_in_for_the_option_and_the_option_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers.runtime_files import complete_runtime, write_runtime

    document = complete_runtime(tmp_path)
    good = write_runtime(tmp_path / "runtime.yaml", document)
    broken = write_runtime(tmp_path / "broken.yaml", {**document, "namespace": "Not A Name"})
    monkeypatch.setenv("COORDINATOR_RUNTIME_CONFIG", str(good))
    code, out, err = run_cli(["check", "--output", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["status"] == "valid"
    # On the command line, before or after the command, the option wins over the variable.
    for args in (
        ["--runtime-config", str(broken), "check"],
        ["check", "--runtime-config", str(broken)],
    ):
        code, _, err = run_cli(args, capsys)
        assert code == 1 and last_line(err).startswith("coordinator.config.invalid: namespace")


@pytest.mark.parametrize(
    "args",
    [
        ["list", "--state", "bogus", "--output", "json"],
        ["--output", "json", "list", "--state", "bogus"],
        ["retain", "--limit", "10", "--output=json"],
        ["doctor", "--output", "json", "--no-such-option"],
    ],
)
def test_a_usage_error_under_json_output_is_json_too(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert out == ""
    document = json.loads(err.splitlines()[0])
    assert document["code"] == "coordinator.usage.invalid"
    assert document["detail"]


def test_a_usage_error_in_text_has_no_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["list", "--state", "bogus"], capsys)
    assert code == 2
    assert "Usage: coordinatorctl list" in err and "{" not in err.splitlines()[0]


def test_json_is_asked_for_only_by_the_output_option() -> None:
    assert json_requested(["list", "--output", "json"])
    assert json_requested(["--output=json", "doctor"])
    assert not json_requested(["list", "--output", "text"])
    assert not json_requested(["start", "--", "--output", "json"])
    assert not json_requested(["list", "--output"])
