"""`workflow check`'s warnings (core/workflow/advice.py): a call to a product without
receipts whose deadline leaves an operator under an hour for retry-same."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from core.workflow.advice import SHORT_DEADLINE_SECONDS, advise
from core.workflow.check import check_source
from tests.unit.test_workflow_refusals import BASE, dump, steps

ASK = "steps.ask.call.deadlineSeconds"


def _with(ask: int | None = None, notify: int | None = None) -> dict[str, Any]:
    document = copy.deepcopy(BASE)
    if ask is not None:
        steps(document)["ask"]["call"]["deadlineSeconds"] = ask
    if notify is not None:
        steps(document)["notify"]["call"]["deadlineSeconds"] = notify
    return document


@pytest.mark.parametrize(
    ("ask", "warned"),
    [(None, True), (SHORT_DEADLINE_SECONDS - 1, True), (SHORT_DEADLINE_SECONDS, False)],
    ids=["default-300", "just-under", "an-hour"],
)
def test_a_casework_call_with_a_short_deadline_is_warned_about(
    ask: int | None, warned: bool
) -> None:
    found = advise(check_source(dump(_with(ask=ask))))
    assert [advice.path for advice in found] == ([ASK] if warned else [])
    if warned:
        seconds = 300 if ask is None else ask
        assert found[0].message.startswith(f"{seconds} s is under an hour")
        assert "create-review-request" in found[0].message


def test_a_product_with_receipts_is_never_warned_about() -> None:
    # Messaging keeps receipts: reconcile settles its calls whatever the deadline.
    found = advise(check_source(dump(_with(ask=86_400, notify=1))))
    assert found == []


def test_workflow_check_prints_the_warning_and_still_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "workflow.yaml").write_bytes(dump(_with()))
    with pytest.raises(SystemExit) as exited:
        main(["workflow", "check", str(tmp_path), "--output", "json"])
    out, err = capsys.readouterr()
    assert (exited.value.code, err) == (0, "")
    document = json.loads(out)
    assert document["status"] == "valid"
    assert [w["path"] for w in document["warnings"]] == [ASK]

    (tmp_path / "workflow.yaml").write_bytes(dump(_with(ask=SHORT_DEADLINE_SECONDS)))
    with pytest.raises(SystemExit) as exited:
        main(["workflow", "check", str(tmp_path), "--output", "json"])
    out, _ = capsys.readouterr()
    assert exited.value.code == 0
    assert json.loads(out) == {"status": "valid", "id": "sample", "version": "1.0.0"}


@pytest.mark.parametrize("name", ["approval-notice", "register-change", "appointment-booking"])
def test_the_examples_follow_the_advice(name: str) -> None:
    source = Path(__file__).resolve().parents[2] / "examples" / name / "workflow.yaml"
    assert advise(check_source(source.read_bytes())) == []
