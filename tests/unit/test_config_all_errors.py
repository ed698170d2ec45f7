"""`check` reports every problem of a runtime file in one run, each with its key path and
its place in the file; a rule that depends on a refused value is skipped, not reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import check_runtime_file, load_runtime_file
from core.errors import ConfigInvalid, CoordinatorError, PackageInvalid
from core.yamlsafe import Marks, load_marked, problems_of
from tests.helpers.cli_run import run_cli
from tests.helpers.refusals import json_refusal
from tests.helpers.runtime_files import complete_runtime, write_runtime

FOUR = [
    "namespace",
    "deployment.authentication.colour",
    "connections.notices.authorization.scopes",
    "eventSources.intake.workflow",
]


@pytest.fixture(autouse=True)
def _no_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COORDINATOR_URL", raising=False)
    monkeypatch.delenv("COORDINATOR_TOKEN_FILE", raising=False)


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    return complete_runtime(tmp_path)


def four_mistakes(document: dict[str, Any]) -> None:
    """A bad value, an unknown key, a missing key and a workflow that is not pinned."""
    document["namespace"] = "registry_prod"
    document["deployment"]["authentication"]["colour"] = "blue"
    del document["connections"]["notices"]["authorization"]["scopes"]
    document["eventSources"]["intake"]["workflow"] = "unpinned"


def position(text: str, needle: str, above: int = 0) -> tuple[int, int]:
    """1-based line and column of the first line holding ``needle``; with ``above``, of the
    key that many lines higher (its first non-blank character)."""
    lines = text.splitlines()
    found = next(number for number, line in enumerate(lines) if needle in line) - above
    line = lines[found]
    column = line.index(needle) if not above else len(line) - len(line.lstrip(" "))
    return found + 1, column + 1


def refusal_of(path: Path) -> CoordinatorError:
    with pytest.raises(CoordinatorError) as caught:
        check_runtime_file(path)
    return caught.value


def paths_of(error: CoordinatorError) -> list[str | None]:
    return [entry.get("path") for entry in problems_of(error)]


# -- every problem, in one run ---------------------------------------------------------------


def test_four_independent_mistakes_are_four_problems(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    four_mistakes(document)
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    error = refusal_of(runtime)
    assert isinstance(error, ConfigInvalid)
    # The first is what a one-line surface shows, exactly as before.
    assert error.path == "namespace"
    assert error.cli_line() == (
        "coordinator.config.invalid: namespace: "
        "must be coordinator_ followed by lowercase letters, digits or _"
    )
    assert paths_of(error) == FOUR
    assert {entry["code"] for entry in problems_of(error)} == {"config.invalid"}
    assert "registry_prod" not in json.dumps(problems_of(error))  # values are never repeated


def test_each_problem_has_the_line_and_column_of_its_key(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    four_mistakes(document)
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    text = runtime.read_text()
    places = [(entry["line"], entry["column"]) for entry in problems_of(refusal_of(runtime))]
    assert places == [
        position(text, "namespace:"),
        position(text, "colour:"),
        # A missing key is placed at the mapping that lacks it.
        position(text, "clientId: coordinator-notices", above=1),
        position(text, "workflow: unpinned"),
    ]


def test_check_prints_one_line_per_problem(
    tmp_path: Path, document: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    four_mistakes(document)
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    code, out, err = run_cli(["--runtime-config", str(runtime), "check"], capsys)
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert len(lines) == 4
    for line, path in zip(lines, FOUR, strict=True):
        assert line.startswith(f"coordinator.config.invalid: {path}: ")
        assert line.endswith(")") and "(line " in line
    assert lines[0].startswith(
        "coordinator.config.invalid: namespace: must be coordinator_ followed by lowercase "
        "letters, digits or _ (line 1, column 1)"
    )


def test_check_under_json_prints_one_document_listing_every_problem(
    tmp_path: Path, document: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    four_mistakes(document)
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    code, out, err = run_cli(
        ["--runtime-config", str(runtime), "check", "--output", "json"], capsys
    )
    assert (code, out) == (1, "")
    refusal = json_refusal(err)
    assert refusal["code"] == "coordinator.config.invalid"
    assert refusal["path"] == "namespace"
    assert (refusal["line"], refusal["column"]) == (1, 1)
    assert [entry["path"] for entry in refusal["errors"]] == FOUR
    for entry in refusal["errors"]:
        assert entry["code"] == "coordinator.config.invalid"
        assert entry["detail"].startswith(entry["path"] + ": ")
        assert isinstance(entry["line"], int) and isinstance(entry["column"], int)


def test_a_single_problem_keeps_its_line_and_the_service_sees_one_line(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    document["deployment"]["listener"]["bind"] = "0.0.0.0:8108"
    document["deployment"]["stateKeys"][0]["version"] = "one"
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    with pytest.raises(ConfigInvalid) as caught:
        load_runtime_file(runtime)
    # The service prints "<code>: <detail>" of what it catches: the first problem only.
    assert caught.value.detail == (
        "deployment.listener.bind: must not listen on every address (0.0.0.0 or ::)"
    )
    assert "\n" not in caught.value.detail
    assert paths_of(caught.value) == ["deployment.listener.bind", "deployment.stateKeys[0].version"]


def test_every_unknown_and_missing_key_of_a_block_is_reported(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    listener = document["deployment"]["listener"]
    listener["port"] = 8108
    listener["tls"] = True
    del listener["tlsTermination"]
    listener["bind"] = "8.8.8.8:8108"
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    assert [(entry["path"], entry["detail"].split(": ", 1)[1]) for entry in problems_of(error)] == [
        ("deployment.listener.port", "unknown key"),
        ("deployment.listener.tls", "unknown key"),
        ("deployment.listener.tlsTermination", "required key is missing"),
        (
            "deployment.listener.bind",
            "must be a private (RFC 1918 or ULA), loopback or link-local address",
        ),
    ]


def test_every_bad_entry_of_a_list_is_reported(tmp_path: Path, document: dict[str, Any]) -> None:
    document["deployment"]["authentication"]["algorithms"] = ["HS256", "RS256", "XY1", "RS256"]
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    assert paths_of(error) == [f"deployment.authentication.algorithms[{n}]" for n in (0, 2, 3)]


# -- what depends on a refused value is skipped -------------------------------------------------


def test_active_state_key_is_not_judged_against_refused_state_keys(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    document["deployment"]["stateKeys"] = "secret:file/state-key"
    document["deployment"]["activeStateKey"] = 7
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    assert paths_of(error) == ["deployment.stateKeys"]


def test_references_are_judged_by_form_when_the_providers_were_refused(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    document["secretProviders"] = ["file"]
    document["deployment"]["auditKeyRef"] = "/run/secrets/audit-key"
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    # No "needs secretProviders.file" for each of the file's references.
    assert paths_of(error) == ["secretProviders", "deployment.auditKeyRef"]


def test_the_metrics_listener_is_not_compared_with_a_refused_listener(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    document["deployment"]["listener"]["bind"] = "127.0.0.1"
    document["deployment"]["metricsListener"]["bind"] = "127.0.0.1:8108"
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    assert paths_of(error) == ["deployment.listener.bind"]


def test_operator_rules_are_skipped_when_operator_is_refused(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    policies = document["deployment"]["authentication"]["policies"]
    policies["platform-operators"]["operator"] = "yes"
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    # Not six more problems saying each deployment-wide action needs operator: true.
    assert paths_of(error) == ["deployment.authentication.policies.platform-operators.operator"]


def test_connection_rules_are_skipped_when_the_type_is_refused(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    document["connections"]["review"]["type"] = "casework"
    document["connections"]["review"]["resultCheckSeconds"] = 5
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    # Neither "only casework connections take ..." nor a package's "needs this connection
    # to be casework-review-producer" for a connection whose type is refused.
    assert paths_of(error) == ["connections.review.type"]


def test_a_package_that_does_not_verify_is_reported_with_the_files_problems(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    shutil.rmtree(tmp_path / "packages" / "escalation-1.0.0")
    document["deployment"]["runtimeRole"] = "Runtime Role"
    policies = document["deployment"]["authentication"]["policies"]
    policies["case-operators"]["workflows"] = ["approval-notice", "unpinned"]
    del document["connections"]["slots"]
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    error = refusal_of(runtime)
    entries = problems_of(error)
    assert [entry["code"] for entry in entries] == [
        "config.invalid",
        "package.invalid",
        "config.invalid",
    ]
    assert entries[0]["path"] == "deployment.runtimeRole"
    assert entries[1]["path"].endswith("escalation-1.0.0")
    # Placed at the pin that names it, in the runtime file (the list item's first key).
    assert (entries[1]["line"], entries[1]["column"]) == position(
        runtime.read_text(), "root: " + document["deployment"]["packages"][2]["root"]
    )
    # The packages that verify are still joined with the file...
    assert entries[2]["path"] == "connections.slots"
    # ...but with one package unknown, no policy is told its workflow is not pinned.
    assert "unpinned" not in json.dumps(entries)


def test_a_policy_naming_an_unpinned_workflow_is_reported_beside_other_problems(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    document["deployment"]["databaseId"] = "not-a-uuid"
    policies = document["deployment"]["authentication"]["policies"]
    policies["case-operators"]["workflows"] = ["approval-notice", "unpinned"]
    error = refusal_of(write_runtime(tmp_path / "runtime.yaml", document))
    assert paths_of(error) == [
        "deployment.databaseId",
        "deployment.authentication.policies.case-operators.workflows[1]",
    ]


def test_a_package_refusal_alone_is_still_a_package_error(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    shutil.rmtree(tmp_path / "packages" / "escalation-1.0.0")
    with pytest.raises(PackageInvalid) as caught:
        check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert caught.value.code == "package.invalid"
    assert len(problems_of(caught.value)) == 1


# -- where each key sits -----------------------------------------------------------------------


def test_marks_place_keys_and_list_items() -> None:
    text = "a:\n  b: 1\n  list:\n    - x\n    - {k: v}\n"
    document, marks = load_marked(text, ConfigInvalid)
    assert document == {"a": {"b": 1, "list": ["x", {"k": "v"}]}}
    assert marks.locate("a") == (1, 1)
    assert marks.locate("a.b") == (2, 3)
    assert marks.locate("a.list[1]") == (5, 7)
    assert marks.locate("a.list[1].k") == (5, 8)
    # A key that is not there is placed at its nearest ancestor; the document has no place.
    assert marks.locate("a.missing") == (1, 1)
    assert marks.locate("a.list[1].absent") == (5, 7)
    assert marks.locate("") is None
    assert Marks().locate("a") is None


def test_yaml_refusals_stay_single_and_unlocated(tmp_path: Path, document: dict[str, Any]) -> None:
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    runtime.write_text(runtime.read_text().replace("namespace: ", "namespace: &a ", 1))
    with pytest.raises(ConfigInvalid) as caught:
        check_runtime_file(runtime)
    assert "anchors" in caught.value.reason
    assert len(problems_of(caught.value)) == 1


# -- robustness: any edit is accepted or refused, never a crash -------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("runtime")
    return folder, complete_runtime(folder)


def _entries(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for name, value in node.items():
            found += _entries(value, (*prefix, name))
    elif isinstance(node, list):
        for position_, value in enumerate(node):
            found += _entries(value, (*prefix, position_))
    return found


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 100_000),
    st.sampled_from(["", "x", "secret:file/a", "127.0.0.1:1", "https://a.example", "start"]),
    st.lists(st.sampled_from(["x", "start", "RS256"]), max_size=2),
    st.dictionaries(st.sampled_from(["bind", "root", "type", "x"]), st.just("x"), max_size=2),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), VALUES, st.booleans()), max_size=4))
def test_random_edits_are_accepted_or_refused_with_every_problem_named(
    base: tuple[Path, dict[str, Any]], edits: list[tuple[int, Any, bool]]
) -> None:
    folder, original = base
    document = json.loads(json.dumps(original))
    for choice, value, delete in edits:
        places = _entries(document)
        keys = places[choice % len(places)]
        parent: Any = document
        for name in keys[:-1]:
            parent = parent[name]
        if delete and isinstance(parent, dict):
            del parent[keys[-1]]
        else:
            parent[keys[-1]] = value
    runtime = write_runtime(folder / "edited.yaml", document)
    try:
        check_runtime_file(runtime)
    except CoordinatorError as refusal:
        entries = problems_of(refusal)
        assert entries[0]["code"] == str(refusal.code)
        assert entries[0]["detail"] == refusal.detail
        for entry in entries:
            assert entry["code"] in {"config.invalid", "package.invalid", "package.digest-mismatch"}
            assert entry["detail"]
