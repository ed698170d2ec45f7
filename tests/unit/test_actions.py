"""The table of actions (core/actions.py): what each body must hold, and that every room
that names actions names exactly the table's."""

from __future__ import annotations

import pytest
import typer

from cli import console
from cli.main import app
from core.actions import (
    ACTIONS,
    DEPLOYMENT,
    DEPLOYMENT_ACTIONS,
    RUN,
    RUN_ACTIONS,
    check,
    instant,
    operator_actions,
    reason_body,
)
from core.errors import CoordinatorError
from gateway.routes import main_routes
from recovery.actions import HANDLERS as RUN_HANDLERS
from recovery.operator import HANDLERS as DEPLOYMENT_HANDLERS


def refused(code: str = "request.invalid") -> pytest.RaisesExc[CoordinatorError]:
    return pytest.raises(CoordinatorError, check=lambda exc: exc.code == code)


def test_unknown_member_names_are_not_echoed() -> None:
    with refused() as info:
        reason_body({"reason": "x", "alice-smith": 1})
    assert "alice" not in info.value.detail


@pytest.mark.parametrize(
    "value",
    ["2027-01-01T00:00:00Z", "2027-01-01t00:00:00.123456789+02:00", "2027-06-30T23:59:59-05:30"],
)
def test_instants_with_an_offset_are_accepted(value: str) -> None:
    assert instant({"before": value}, "before") == value


@pytest.mark.parametrize(
    "value",
    ["2027-02-30T00:00:00Z", "2027-01-01 00:00:00Z", "2027-01-01T25:00:00Z", 1700000000, None],
)
def test_bad_instants_are_refused(value: object) -> None:
    with refused():
        instant({"before": value}, "before")


def test_attestations_must_be_literally_true() -> None:
    validate = ACTIONS["complete-execution-recovery"].body
    assert validate is not None
    body = {
        "recoveryReference": "r-1",
        "executionHistoryComplete": 1,
        "priorDeploymentFenced": True,
    }
    with refused():
        validate(body)
    body["executionHistoryComplete"] = True
    assert validate(body).reference == "r-1"


def test_a_body_is_checked_by_its_action_and_only_an_operator_action_takes_one() -> None:
    assert check("retain", {"before": "2027-01-01T00:00:00Z", "limit": 5}).members == {
        "before": "2027-01-01T00:00:00Z",
        "limit": 5,
    }
    for name in ("doctor", "status", "start", "no-such-action"):
        with refused() as info:
            check(name, {"reason": "r-1"})
        assert "no-such" not in info.value.detail


def test_the_scopes_split_the_policy_words() -> None:
    assert RUN_ACTIONS == ("start", "status", "inspect", "retry-same", "cancel", "reconcile")
    assert DEPLOYMENT_ACTIONS == (
        "doctor",
        "restore-hold",
        "release-restore-hold",
        "release-admission-hold",
        "complete-execution-recovery",
        "retain",
    )
    assert set(ACTIONS) == {*RUN_ACTIONS, *DEPLOYMENT_ACTIONS}


def test_recovery_carries_out_exactly_the_operator_actions() -> None:
    assert set(RUN_HANDLERS) == {a.name for a in operator_actions(RUN)}
    assert set(DEPLOYMENT_HANDLERS) == {a.name for a in operator_actions(DEPLOYMENT)}


def test_the_gateway_routes_every_action_by_its_method() -> None:
    routed = {(route.path, method) for route in main_routes() for method in route.methods or ()}
    for action in ACTIONS.values():
        assert (action.route, action.method) in routed, action.name


def test_a_path_fills_the_route_with_one_encoded_segment_each() -> None:
    assert ACTIONS["cancel"].path(runId="r-1") == "/v1/runs/r-1/cancel"
    assert ACTIONS["inspect"].path(runId="a/b?c") == "/v1/runs/a%2Fb%3Fc/inspection"
    assert ACTIONS["start"].path(workflowId="approval-notice") == (
        "/v1/workflows/approval-notice/runs"
    )
    assert ACTIONS["retain"].path() == "/v1/operator/retain"


def test_the_cli_has_a_command_for_every_action_with_the_table_s_help() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for action in ACTIONS.values():
        assert commands[action.name].help == action.help, action.name


def test_the_console_offers_the_forms_the_table_names() -> None:
    assert tuple(a.name for a in operator_actions(RUN) if a.form) == console.FORMS
    assert set(console.FORMS) == {"reconcile", "retry-same", "cancel"}
