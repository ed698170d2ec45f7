"""Authorization of verified callers against ``deployment.authentication.policies``.

A policy is found by the token's verified ``client_id`` (CONTRACT §5, §8.1). Pure functions:
each returns the policy that allowed the request or raises.

- No policy for the client, or the action not in its ``actions``: 403
  ``authorization.refused``.
- Deployment-wide actions (``doctor``, holds, ``retain`` …) need ``operator: true``.
- ``start`` needs the workflow among the policy's ``workflows``.
- Actions on one run: the order of the checks keeps a non-operator from learning anything
  about runs it did not start. After the action itself is allowed, a missing run and a run
  another principal started both answer 404 ``run.not-found``; only then is the run's
  workflow compared with the policy's ``workflows`` (403 when it is not listed). Operators
  act on every run of their listed workflows.
- Listing: operators see every run of their workflows, others only the runs their principal
  started; :func:`list_scope` says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from core.actions import DEPLOYMENT_ACTIONS, RUN_ACTIONS
from core.callers import Caller
from core.codes import Code
from core.config.model import Policy
from core.errors import CoordinatorError

LIST_ACTION: Final = "inspect"
"""The action ``GET /v1/runs`` needs."""


class AuthorizationRefused(CoordinatorError):
    """403 ``authorization.refused``."""

    def __init__(self, action: str, workflow_id: str | None = None) -> None:
        # The workflow stays out of the detail: it may be caller text, or tell an operator
        # which workflow a run of another scope belongs to.
        scope = " for this workflow" if workflow_id is not None else ""
        super().__init__(
            Code.AUTHORIZATION_REFUSED, f"the client's policy does not allow {action}{scope}"
        )
        self.action = action
        self.workflow_id = workflow_id


class RunNotFound(CoordinatorError):
    """404 ``run.not-found``: the same answer for a missing run and someone else's run."""

    def __init__(self) -> None:
        super().__init__(Code.RUN_NOT_FOUND, "no such run")


@dataclass(frozen=True)
class RunOwner:
    """What authorization needs to know about an existing run."""

    workflow_id: str
    """The workflow the run was started from."""
    iss: str
    """Issuer of the principal that started it."""
    sub: str
    """Subject of the principal that started it."""


@dataclass(frozen=True)
class ListScope:
    """Which runs a list request may show."""

    workflows: tuple[str, ...]
    """Only runs of these workflows."""
    principal: tuple[str, str] | None
    """Only runs started by this ``(iss, sub)``; ``None`` for operators (every principal)."""


def _allowed(policies: Mapping[str, Policy], caller: Caller, action: str) -> Policy:
    policy = policies.get(caller.client_id)
    if policy is None or action not in policy.actions:
        raise AuthorizationRefused(action)
    return policy


def _workflows(policy: Policy) -> tuple[str, ...]:
    return policy.workflows or ()


def authorize_deployment(policies: Mapping[str, Policy], caller: Caller, action: str) -> Policy:
    """Allow a deployment-wide action: listed in the policy, and the policy is an operator's."""
    if action not in DEPLOYMENT_ACTIONS:
        raise ValueError(f"{action!r} is not a deployment-wide action")
    policy = _allowed(policies, caller, action)
    if not policy.operator:
        raise AuthorizationRefused(action)
    return policy


def authorize_start(policies: Mapping[str, Policy], caller: Caller, workflow_id: str) -> Policy:
    """Allow starting a run of ``workflow_id``."""
    policy = _allowed(policies, caller, "start")
    if workflow_id not in _workflows(policy):
        raise AuthorizationRefused("start", workflow_id)
    return policy


def authorize_run(
    policies: Mapping[str, Policy], caller: Caller, action: str, run: RunOwner | None
) -> Policy:
    """Allow ``action`` on one run; ``run`` is ``None`` when no such run exists."""
    if action not in RUN_ACTIONS or action == "start":
        raise ValueError(f"{action!r} is not an action on an existing run")
    policy = _allowed(policies, caller, action)
    if run is None:
        raise RunNotFound()
    if not policy.operator and (run.iss, run.sub) != (caller.iss, caller.sub):
        raise RunNotFound()
    if run.workflow_id not in _workflows(policy):
        raise AuthorizationRefused(action, run.workflow_id)
    return policy


def allow_action(policies: Mapping[str, Policy], caller: Caller, action: str) -> Policy:
    """The policy that lists ``action`` for the caller (403 when none does), before anything
    of the request is read; which runs it may touch is :func:`list_scope`'s."""
    return _allowed(policies, caller, action)


def list_scope(
    policies: Mapping[str, Policy],
    caller: Caller,
    workflow_id: str | None = None,
    action: str = LIST_ACTION,
) -> ListScope:
    """The runs a list request may show, optionally narrowed to one workflow; with another
    ``action`` (a bulk action's), the runs the caller may do that to: the same workflows and
    principals as that action on one run allows."""
    policy = _allowed(policies, caller, action)
    workflows = _workflows(policy)
    if workflow_id is not None:
        if workflow_id not in workflows:
            raise AuthorizationRefused(action, workflow_id)
        workflows = (workflow_id,)
    principal = None if policy.operator else (caller.iss, caller.sub)
    return ListScope(workflows=workflows, principal=principal)


def is_operator(policies: Mapping[str, Policy], caller: Caller) -> bool:
    """True when the caller's policy has ``operator: true``."""
    policy = policies.get(caller.client_id)
    return policy is not None and policy.operator
