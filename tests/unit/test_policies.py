"""Authorization by client policy: every rule of CONTRACT §5 and §8.1."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from core.actions import DEPLOYMENT_ACTIONS
from core.codes import Code
from core.config.model import Policy
from core.errors import CoordinatorError
from gateway.policies import (
    ListScope,
    RunOwner,
    authorize_deployment,
    authorize_run,
    authorize_start,
    is_operator,
    list_scope,
)

ISS = "https://issuer.example.org"
RUN_ACTIONS_ON_RUNS = ("status", "inspect", "retry-same", "cancel", "reconcile")


@dataclass(frozen=True)
class Caller:
    client_id: str
    iss: str = ISS
    sub: str = "portal-user-7"


POLICIES = {
    "intake-portal": Policy(
        client_id="intake-portal",
        operator=False,
        workflows=("approval-notice",),
        actions=("start", "status", "inspect", "cancel"),
    ),
    "case-operators": Policy(
        client_id="case-operators",
        operator=True,
        workflows=("approval-notice", "slot-booking"),
        actions=("inspect", "status", "retry-same", "cancel", "reconcile"),
    ),
    "platform-operators": Policy(
        client_id="platform-operators",
        operator=True,
        workflows=None,
        actions=DEPLOYMENT_ACTIONS,
    ),
    # Not a valid policy for `check` (deployment actions without operator), but the gateway
    # must still refuse it if such a record ever reached it.
    "confused": Policy(
        client_id="confused",
        operator=False,
        workflows=("approval-notice",),
        actions=("doctor", "status"),
    ),
}

PORTAL = Caller("intake-portal")
OTHER_PORTAL_USER = Caller("intake-portal", sub="portal-user-8")
CASE_OPERATOR = Caller("case-operators", sub="operator-1")
PLATFORM = Caller("platform-operators", sub="operator-2")
STRANGER = Caller("unknown-client")

OWN_RUN = RunOwner(workflow_id="approval-notice", iss=ISS, sub="portal-user-7")


def code_of(call: object) -> str:
    assert callable(call)
    with pytest.raises(CoordinatorError) as caught:
        call()
    return caught.value.code


# -- no policy ----------------------------------------------------------------------------------


def test_a_client_without_a_policy_is_refused_everything() -> None:
    assert code_of(lambda: authorize_start(POLICIES, STRANGER, "approval-notice")) == (
        Code.AUTHORIZATION_REFUSED
    )
    for action in RUN_ACTIONS_ON_RUNS:
        assert code_of(lambda a=action: authorize_run(POLICIES, STRANGER, a, OWN_RUN)) == (
            Code.AUTHORIZATION_REFUSED
        )
    for action in DEPLOYMENT_ACTIONS:
        assert code_of(lambda a=action: authorize_deployment(POLICIES, STRANGER, a)) == (
            Code.AUTHORIZATION_REFUSED
        )
    assert code_of(lambda: list_scope(POLICIES, STRANGER)) == Code.AUTHORIZATION_REFUSED
    assert not is_operator(POLICIES, STRANGER)


def test_a_missing_run_does_not_hide_a_missing_policy() -> None:
    # Without a policy the answer is 403 whether or not the run exists: nothing to learn.
    assert code_of(lambda: authorize_run(POLICIES, STRANGER, "status", None)) == (
        Code.AUTHORIZATION_REFUSED
    )


# -- start --------------------------------------------------------------------------------------


def test_start_needs_the_workflow_in_the_policy() -> None:
    assert authorize_start(POLICIES, PORTAL, "approval-notice") is POLICIES["intake-portal"]
    assert code_of(lambda: authorize_start(POLICIES, PORTAL, "slot-booking")) == (
        Code.AUTHORIZATION_REFUSED
    )


def test_start_needs_the_start_action() -> None:
    assert code_of(lambda: authorize_start(POLICIES, CASE_OPERATOR, "approval-notice")) == (
        Code.AUTHORIZATION_REFUSED
    )
    assert code_of(lambda: authorize_start(POLICIES, PLATFORM, "approval-notice")) == (
        Code.AUTHORIZATION_REFUSED
    )


def test_refusals_do_not_echo_the_requested_workflow() -> None:
    with pytest.raises(CoordinatorError) as caught:
        authorize_start(POLICIES, PORTAL, "person-4711-workflow")
    assert "person-4711" not in caught.value.detail


# -- run actions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["status", "inspect", "cancel"])
def test_a_non_operator_acts_on_its_own_runs(action: str) -> None:
    assert authorize_run(POLICIES, PORTAL, action, OWN_RUN) is POLICIES["intake-portal"]


@pytest.mark.parametrize("action", ["retry-same", "reconcile"])
def test_run_actions_not_listed_are_refused(action: str) -> None:
    assert code_of(lambda: authorize_run(POLICIES, PORTAL, action, OWN_RUN)) == (
        Code.AUTHORIZATION_REFUSED
    )


def test_a_non_operator_cannot_see_another_principals_run() -> None:
    assert code_of(lambda: authorize_run(POLICIES, OTHER_PORTAL_USER, "status", OWN_RUN)) == (
        Code.RUN_NOT_FOUND
    )


def test_same_subject_from_another_issuer_is_another_principal() -> None:
    elsewhere = Caller("intake-portal", iss="https://other-issuer.example.org")
    assert code_of(lambda: authorize_run(POLICIES, elsewhere, "status", OWN_RUN)) == (
        Code.RUN_NOT_FOUND
    )


def test_someone_elses_run_and_a_missing_run_answer_alike() -> None:
    def detail(run: RunOwner | None) -> tuple[str, str]:
        with pytest.raises(CoordinatorError) as caught:
            authorize_run(POLICIES, OTHER_PORTAL_USER, "status", run)
        return caught.value.code, caught.value.detail

    assert detail(OWN_RUN) == detail(None) == (Code.RUN_NOT_FOUND, "no such run")
    # Also when the other principal's run belongs to a workflow outside the policy.
    outside = RunOwner(workflow_id="slot-booking", iss=ISS, sub="portal-user-7")
    assert detail(outside) == detail(None)


def test_a_non_operators_own_run_of_an_unlisted_workflow_is_refused() -> None:
    own_elsewhere = RunOwner(workflow_id="slot-booking", iss=ISS, sub="portal-user-7")
    assert code_of(lambda: authorize_run(POLICIES, PORTAL, "status", own_elsewhere)) == (
        Code.AUTHORIZATION_REFUSED
    )


@pytest.mark.parametrize("action", RUN_ACTIONS_ON_RUNS)
def test_operators_act_on_every_run_of_their_workflows(action: str) -> None:
    for workflow in ("approval-notice", "slot-booking"):
        run = RunOwner(workflow_id=workflow, iss="https://elsewhere.example", sub="someone")
        assert authorize_run(POLICIES, CASE_OPERATOR, action, run) is POLICIES["case-operators"]


def test_operators_are_refused_runs_of_other_workflows() -> None:
    run = RunOwner(workflow_id="escalation", iss=ISS, sub="someone")
    assert code_of(lambda: authorize_run(POLICIES, CASE_OPERATOR, "status", run)) == (
        Code.AUTHORIZATION_REFUSED
    )


def test_a_missing_run_is_not_found_for_operators_too() -> None:
    assert code_of(lambda: authorize_run(POLICIES, CASE_OPERATOR, "cancel", None)) == (
        Code.RUN_NOT_FOUND
    )


def test_a_deployment_operator_has_no_run_actions() -> None:
    assert code_of(lambda: authorize_run(POLICIES, PLATFORM, "status", OWN_RUN)) == (
        Code.AUTHORIZATION_REFUSED
    )


@pytest.mark.parametrize("action", ["start", "doctor", "delete"])
def test_authorize_run_takes_only_actions_on_existing_runs(action: str) -> None:
    with pytest.raises(ValueError, match="existing run"):
        authorize_run(POLICIES, CASE_OPERATOR, action, OWN_RUN)


# -- deployment-wide actions ----------------------------------------------------------------------


@pytest.mark.parametrize("action", DEPLOYMENT_ACTIONS)
def test_deployment_actions_for_operators_that_list_them(action: str) -> None:
    assert authorize_deployment(POLICIES, PLATFORM, action) is POLICIES["platform-operators"]


@pytest.mark.parametrize("action", DEPLOYMENT_ACTIONS)
def test_deployment_actions_need_them_listed(action: str) -> None:
    assert code_of(lambda: authorize_deployment(POLICIES, CASE_OPERATOR, action)) == (
        Code.AUTHORIZATION_REFUSED
    )


def test_deployment_actions_need_operator_even_when_listed() -> None:
    confused = Caller("confused")
    assert code_of(lambda: authorize_deployment(POLICIES, confused, "doctor")) == (
        Code.AUTHORIZATION_REFUSED
    )


def test_authorize_deployment_takes_only_deployment_actions() -> None:
    with pytest.raises(ValueError, match="deployment-wide"):
        authorize_deployment(POLICIES, PLATFORM, "status")


# -- lists --------------------------------------------------------------------------------------


def test_a_non_operators_list_is_its_own_runs() -> None:
    assert list_scope(POLICIES, PORTAL) == ListScope(
        workflows=("approval-notice",), principal=(ISS, "portal-user-7")
    )


def test_an_operators_list_is_every_run_of_its_workflows() -> None:
    assert list_scope(POLICIES, CASE_OPERATOR) == ListScope(
        workflows=("approval-notice", "slot-booking"), principal=None
    )
    assert is_operator(POLICIES, CASE_OPERATOR)
    assert not is_operator(POLICIES, PORTAL)


def test_a_list_narrowed_to_one_workflow() -> None:
    scope = list_scope(POLICIES, CASE_OPERATOR, "slot-booking")
    assert scope == ListScope(workflows=("slot-booking",), principal=None)
    assert code_of(lambda: list_scope(POLICIES, CASE_OPERATOR, "escalation")) == (
        Code.AUTHORIZATION_REFUSED
    )


def test_listing_needs_the_inspect_action() -> None:
    assert code_of(lambda: list_scope(POLICIES, PLATFORM)) == Code.AUTHORIZATION_REFUSED
    assert code_of(lambda: list_scope(POLICIES, Caller("confused"))) == Code.AUTHORIZATION_REFUSED
