"""The shipped examples check, package and verify, and say what the guide says they do."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import yamlsafe
from core.errors import ConfigInvalid
from core.workflow.check import check_source_dir
from core.workflow.model import CallStep, ChooseStep, FinishStep, WaitForStep, WaitUntilStep
from core.workflow.package import build_package, verify_package

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["approval-notice", "appointment-booking", "register-change"]


@pytest.mark.parametrize("name", NAMES)
def test_each_example_checks_packages_and_verifies(name: str, tmp_path: Path) -> None:
    source = EXAMPLES / name
    workflow = check_source_dir(source)
    assert workflow.id == name
    built = build_package(source, tmp_path)
    assert built.path == tmp_path / f"{name}-{workflow.version}"
    assert sorted(p.name for p in built.path.iterdir()) == ["manifest.json", "workflow.yaml"]
    assert (built.path / "workflow.yaml").read_bytes() == (source / "workflow.yaml").read_bytes()
    verified = verify_package(built.path, built.digest)
    assert (verified.workflow_id, verified.version) == (name, workflow.version)
    assert (source / "README.md").is_file()


def test_approval_notice_is_the_contract_example_completed() -> None:
    wf = check_source_dir(EXAMPLES / "approval-notice")
    assert (wf.id, wf.version, wf.start, wf.on_cancel) == (
        "approval-notice",
        "1.2.0",
        "request-review",
        "notify-cancelled",
    )
    assert wf.outcomes == ("approved", "rejected", "cancelled", "expired")
    assert dict(wf.connections) == {"review": "casework-review-producer", "notices": "messaging"}
    wait = wf.steps["await-decision"]
    assert isinstance(wait, WaitForStep)
    assert (wait.timeout_seconds, wait.on_timeout, wait.next) == (1209600, "expired", "decide")
    decide = wf.steps["decide"]
    assert isinstance(decide, ChooseStep)
    assert decide.otherwise == "send-rejection"
    finishes = {s.outcome for s in wf.steps.values() if isinstance(s, FinishStep)}
    assert finishes == set(wf.outcomes)


def test_the_other_examples_use_timers_choices_and_bookings_or_register_calls() -> None:
    used: set[str] = set()
    for name in NAMES[1:]:
        wf = check_source_dir(EXAMPLES / name)
        for step in wf.steps.values():
            if isinstance(step, WaitUntilStep):
                used.add("wait-until.at" if step.at else "wait-until.afterSeconds")
            elif isinstance(step, ChooseStep):
                used.add("choose")
            elif isinstance(step, CallStep):
                used.add(f"{wf.connections[step.connection]}/{step.operation}")
    assert {
        "wait-until.at",
        "wait-until.afterSeconds",
        "choose",
        "scheduling/book-slot",
        "breg-action/create-proposal",
        "breg-action/submit-action",
    } <= used


@pytest.mark.parametrize("name", NAMES)
def test_runtime_template_names_each_connection_without_secret_values(
    name: str, tmp_path: Path
) -> None:
    built = build_package(EXAMPLES / name, tmp_path)
    template = yamlsafe.load(built.runtime_template.read_bytes(), ConfigInvalid)
    assert template["deployment"]["packages"] == [{"root": "TODO", "expectedDigest": built.digest}]
    assert set(template["connections"]) == set(built.workflow.connections)
    for connection, settings in template["connections"].items():
        assert settings["type"] == built.workflow.connections[connection]
        assert settings["baseUrl"] == "TODO"
        assert settings["profile"] == "TODO"
        assert settings["authorization"] == {
            "clientId": "TODO",
            "signingKeyRef": "TODO",
            "scopes": ["TODO"],
        }
        if settings["type"] == "casework-review-producer":
            assert settings["producer"] == "TODO"
