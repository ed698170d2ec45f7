"""`workflow check` reports every problem of a workflow source in one run, each with its key
path and its place in workflow.yaml; a rule that depends on a refused part is skipped."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from core.errors import PackageInvalid
from core.workflow.check import check_source
from core.workflow.schema import check_schema
from core.yamlsafe import problems_of
from tests.helpers.refusals import json_refusal
from tests.unit.test_workflow_refusals import BASE, dump, steps


def refused(document: dict[str, Any]) -> PackageInvalid:
    with pytest.raises(PackageInvalid) as caught:
        check_source(dump(document))
    return caught.value


def paths_of(error: PackageInvalid) -> list[str | None]:
    return [entry.get("path") for entry in problems_of(error)]


def edited(*edits: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    document = copy.deepcopy(BASE)
    for edit in edits:
        edit(document)
    return document


def several_mistakes(doc: dict[str, Any]) -> None:
    """Five independent mistakes: an unknown key, a version, a command field, an undeclared
    input field and an outcome not listed."""
    doc["colour"] = "blue"
    doc["version"] = "1.0"
    steps(doc)["notify"]["call"]["input"]["priority"] = "high"
    steps(doc)["ask"]["call"]["input"]["summary"] = "Case ${input.caseNumber}"
    steps(doc)["expired"]["finish"]["outcome"] = "lapsed"


SEVERAL = [
    "colour",
    "version",
    "steps.expired.finish.outcome",
    "steps.ask.call.input.summary",
    "steps.notify.call.input.priority",
]


def test_several_mistakes_are_reported_together_in_source_order_of_the_checks() -> None:
    error = refused(edited(several_mistakes))
    # The first is what it always was: the first key an author has to change.
    assert error.path == "colour"
    assert error.reason.startswith("is not a key of a workflow")
    assert paths_of(error) == SEVERAL
    assert {entry["code"] for entry in problems_of(error)} == {"package.invalid"}


def test_each_problem_has_the_line_of_its_key() -> None:
    document = edited(several_mistakes)
    text = dump(document).decode()
    lines = text.splitlines()
    for entry in problems_of(refused(document)):
        name = entry["path"].rsplit(".", 1)[-1]
        assert lines[entry["line"] - 1][entry["column"] - 1 :].startswith(name + ":"), entry


def test_workflow_check_prints_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "workflow.yaml").write_bytes(dump(edited(several_mistakes)))
    with pytest.raises(SystemExit) as exited:
        main(["workflow", "check", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (exited.value.code, out) == (1, "")
    lines = err.splitlines()
    assert len(lines) == len(SEVERAL)
    for line, path in zip(lines, SEVERAL, strict=True):
        assert line.startswith(f"coordinator.package.invalid: {path}: "), line
        assert "(line " in line


def test_workflow_check_under_json_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "workflow.yaml").write_bytes(dump(edited(several_mistakes)))
    with pytest.raises(SystemExit) as exited:
        main(["workflow", "check", str(tmp_path), "--output", "json"])
    out, err = capsys.readouterr()
    assert (exited.value.code, out) == (1, "")
    refusal = json_refusal(err)
    assert refusal["code"] == "coordinator.package.invalid"
    assert refusal["path"] == "colour"
    assert [entry["path"] for entry in refusal["errors"]] == SEVERAL


def test_package_refuses_with_every_problem_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "workflow.yaml").write_bytes(dump(edited(several_mistakes)))
    with pytest.raises(SystemExit) as exited:
        main(["package", str(source), "--out", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert exited.value.code == 1
    assert len(err.splitlines()) == len(SEVERAL)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_every_broken_step_is_reported() -> None:
    def break_steps(doc: dict[str, Any]) -> None:
        steps(doc)["ask"]["call"]["deadlineSeconds"] = 0
        steps(doc)["wait"]["wait-for"]["timeoutSeconds"] = "soon"
        steps(doc)["decide"]["choose"][0]["when"] = {"matches": ["a", "b"]}

    assert paths_of(refused(edited(break_steps))) == [
        "steps.ask.call.deadlineSeconds",
        "steps.wait.wait-for.timeoutSeconds",
        "steps.decide.choose[0].when.matches",
    ]


def test_every_schema_problem_is_reported() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "a": {"type": "text"},
            "b": {"type": "string", "minimum": 1},
            "c": {"type": "integer", "oneOf": []},
        },
        "required": ["a", "ghost"],
    }
    with pytest.raises(PackageInvalid) as caught:
        check_schema(schema)
    assert caught.value.path == "input.properties.a.type"
    assert paths_of(caught.value) == [
        "input.properties.a.type",
        "input.properties.b.minimum",
        "input.properties.c.oneOf",
        "input.required[1]",
    ]


# -- what depends on a refused part is skipped --------------------------------------------------


def test_references_into_a_refused_input_schema_are_not_judged() -> None:
    def bad_schema(doc: dict[str, Any]) -> None:
        doc["input"]["properties"]["caseRef"] = {"type": "text"}
        steps(doc)["ask"]["call"]["input"]["summary"] = "${input.ghost}"

    # Not also "declares no field 'ghost'": the schema it would be looked up in is refused.
    assert paths_of(refused(edited(bad_schema))) == ["input.properties.caseRef.type"]


def test_a_wait_on_an_undeclared_connection_does_not_make_its_readers_noisy() -> None:
    def undeclared(doc: dict[str, Any]) -> None:
        steps(doc)["wait"]["wait-for"]["connection"] = "reviews"

    # What the wait keeps is unknown, so ${steps.wait.outcome} in decide is not judged.
    assert paths_of(refused(edited(undeclared))) == ["steps.wait.wait-for.connection"]


def test_a_loop_is_reported_without_ordering_noise() -> None:
    def loop(doc: dict[str, Any]) -> None:
        steps(doc)["notify"]["next"] = "decide"

    error = refused(edited(loop))
    assert paths_of(error) == ["steps.notify.next"]
    assert "loop" in error.reason


def test_a_step_that_does_not_parse_leaves_the_graph_unjudged_but_names_still_resolve() -> None:
    def broken(doc: dict[str, Any]) -> None:
        steps(doc)["notify"] = {"call": "send it", "next": "done"}
        steps(doc)["ask"]["next"] = "nowhere"

    # notify exists by name, so decide's branch to it is fine; "nowhere" does not.
    assert paths_of(refused(edited(broken))) == ["steps.notify.call", "steps.ask.next"]


def test_an_unknown_key_beside_a_step_keeps_the_step_in_the_graph() -> None:
    def extra(doc: dict[str, Any]) -> None:
        steps(doc)["ask"]["retries"] = 3
        steps(doc)["notify"]["call"]["input"]["recipientRef"] = "${steps.ghost.x}"

    assert paths_of(refused(edited(extra))) == [
        "steps.ask.retries",
        "steps.notify.call.input.recipientRef",
    ]


def test_yaml_refusals_stay_single() -> None:
    with pytest.raises(PackageInvalid) as caught:
        check_source(b"id: &a sample\nversion: *a\n")
    assert caught.value.path == "workflow.yaml"
    assert len(problems_of(caught.value)) == 1
