"""Every action an API caller can be allowed, in one table (CONTRACT §5, §8, §10, §11).

An action has a name (the word a policy lists and the audit record carries), a scope — a
run's actions are allowed per workflow, a deployment's need ``operator: true`` — the way it
is asked for (its method and route), what its body must hold, and the line ``coordinatorctl``
and the console show for it. The gateway builds its routes from :data:`ACTIONS`, the policy
loader checks names against it, recovery dispatches the names its handlers carry out and
checks that they are exactly the table's, and the CLI and the console take their commands,
help and forms from it.

A body is checked by its action's :class:`Body`: exactly the members the action takes, each
of the right kind. The gateway checks it before it calls a component, and recovery checks it
again (a component does not act on a body it did not check). Every refusal is
``request.invalid`` naming the JSON pointer at fault, never the value sent.

Adding an action: a row of :data:`ACTIONS` (with its body, when it takes one), its handler
in recovery, and the contract's words for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import quote

from core.clock import parse_offset_instant
from core.codes import Code
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.runs import MAX_RETAIN_LIMIT, REFERENCE
from core.workflow.jsonvalue import pointer_token

RUN: Final = "run"
"""An action on one run: a policy allows it for the workflows it names."""
DEPLOYMENT: Final = "deployment"
"""An action on the whole deployment: a policy allows it with ``operator: true``."""

_REASON_RULE: Final = "must be 1-128 characters of letters, digits and . _ : / -"


def _invalid(detail: str) -> CoordinatorError:
    return CoordinatorError(Code.REQUEST_INVALID, detail)


def _pointer(key: str) -> str:
    return "/" + pointer_token(key)


# --------------------------------------------------------------------------- the members


def exact_members(body: Mapping[str, Any], required: tuple[str, ...]) -> None:
    """Refuse a body that lacks one of ``required`` or has any other member."""
    if any(key not in required for key in body):
        # The stray name is caller text: it is not repeated back.
        raise _invalid("the body has a member this request does not take")
    for key in required:
        if key not in body:
            raise _invalid(f"{_pointer(key)}: required")


def reference(body: Mapping[str, Any], key: str) -> str:
    """An investigation reference member (``reason``, ``recoveryReference``)."""
    value = body.get(key)
    if not isinstance(value, str) or not REFERENCE.fullmatch(value):
        raise _invalid(f"{_pointer(key)}: {_REASON_RULE}")
    return value


def attested(body: Mapping[str, Any], key: str) -> bool:
    """An attestation flag; only ``true`` is accepted."""
    if body.get(key) is not True:
        raise _invalid(f"{_pointer(key)}: must be true")
    return True


def bounded_int(body: Mapping[str, Any], key: str, low: int, high: int) -> int:
    """An integer member within ``low..high`` (booleans are not integers here)."""
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(f"{_pointer(key)}: must be an integer from {low} to {high}")
    return value


def instant(body: Mapping[str, Any], key: str) -> str:
    """An RFC 3339 date-time member with an offset, returned as sent."""
    value = body.get(key)
    if isinstance(value, str) and parse_offset_instant(value) is not None:
        return value
    raise _invalid(f"{_pointer(key)}: must be an RFC 3339 date-time with an offset")


# ------------------------------------------------------------------------------ the bodies


@dataclass(frozen=True)
class Checked:
    """A body its action's :class:`Body` accepted."""

    members: dict[str, Any]
    """Exactly the members the action takes, as sent (what the gateway forwards)."""
    reference: str | None
    """``reason`` or ``recoveryReference`` when the action takes one (the audit record's)."""


Body = Callable[[Mapping[str, Any]], Checked]
"""What checks an action's body."""


@dataclass(frozen=True)
class Wire:
    """How a deployment-wide action's checked body travels to recovery: the field of the
    ``OperatorActionRequest`` body it fills, and the way from the members to that message
    and back (recovery checks the members it reads back again)."""

    field: str
    """The member of ``OperatorActionRequest``'s ``body`` oneof."""
    out: Callable[[Mapping[str, Any]], Any]
    """The message of the checked members."""
    back: Callable[[Any], dict[str, Any]]
    """The members of the message, as the operator sent them."""


REASON_WIRE: Final = Wire(
    "reason",
    lambda members: pb.ReasonBody(reason=members["reason"]),
    lambda message: {"reason": message.reason},
)


def attestation_wire(history_flag: str) -> Wire:
    """The wire of an attestation whose history flag is ``history_flag``."""
    return Wire(
        "attestation",
        lambda members: pb.AttestationBody(
            recovery_reference=members["recoveryReference"],
            history_complete=members[history_flag],
            prior_deployment_fenced=members["priorDeploymentFenced"],
        ),
        lambda message: {
            "recoveryReference": message.recovery_reference,
            history_flag: message.history_complete,
            "priorDeploymentFenced": message.prior_deployment_fenced,
        },
    )


def _retain_back(message: Any) -> dict[str, Any]:
    members: dict[str, Any] = {"before": message.before, "limit": message.limit}
    if message.dry_run:
        members["dryRun"] = True
    return members


RETAIN_WIRE: Final = Wire(
    "retain",
    lambda members: pb.RetainBody(
        before=members["before"], limit=members["limit"], dry_run=members.get("dryRun", False)
    ),
    _retain_back,
)


def reason_body(body: Mapping[str, Any]) -> Checked:
    """A body of ``reason`` alone."""
    exact_members(body, ("reason",))
    reason = reference(body, "reason")
    return Checked({"reason": reason}, reason)


def attestation_body(history_flag: str) -> Body:
    """A recovery attestation: ``recoveryReference``, ``history_flag`` and
    ``priorDeploymentFenced``, both flags ``true``."""
    members = ("recoveryReference", history_flag, "priorDeploymentFenced")

    def check(body: Mapping[str, Any]) -> Checked:
        exact_members(body, members)
        ref = reference(body, "recoveryReference")
        attested(body, history_flag)
        attested(body, "priorDeploymentFenced")
        return Checked(
            {"recoveryReference": ref, history_flag: True, "priorDeploymentFenced": True}, ref
        )

    return check


def retain_body(body: Mapping[str, Any]) -> Checked:
    """``before`` and ``limit``, and ``dryRun`` when given (without it, or false, the runs
    are erased)."""
    exact_members({k: v for k, v in body.items() if k != "dryRun"}, ("before", "limit"))
    before = instant(body, "before")
    limit = bounded_int(body, "limit", 1, MAX_RETAIN_LIMIT)
    dry_run = body.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise _invalid(f"{_pointer('dryRun')}: must be true or false")
    members: dict[str, Any] = {"before": before, "limit": limit}
    if dry_run:
        members["dryRun"] = True
    return Checked(members, None)


# ------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Action:
    """One action of the API."""

    name: str
    scope: str
    """:data:`RUN` or :data:`DEPLOYMENT`."""
    method: str
    """How it is asked for: ``GET`` (reads) or ``POST``."""
    route: str
    """Where it is asked for: the API path, with ``{runId}`` or ``{workflowId}`` standing for
    the resource (the gateway's route, the CLI's and the console's request)."""
    body: Body | None
    """What checks its body; ``None`` for an action without one, or whose body is not an
    operator's (a start's input is the workflow's to check)."""
    help: str
    """One line for ``coordinatorctl --help`` and the console."""
    form: bool = False
    """Offered as a form on the console's run page (with a reason)."""
    wire: Wire | None = None
    """How its body travels to recovery, for a deployment-wide action with one (a run
    action's reason travels in ``RunActionRequest.reason``)."""

    def path(self, **segments: str) -> str:
        """The request path of this action with each ``{name}`` of :attr:`route` filled in
        from ``segments`` (percent-encoded, so a value is always one path segment)."""
        path = self.route
        for name, value in segments.items():
            path = path.replace("{" + name + "}", quote(value, safe=""))
        return path


ACTIONS: Final[Mapping[str, Action]] = MappingProxyType(
    {
        action.name: action
        for action in (
            Action(
                "start",
                RUN,
                "POST",
                "/v1/workflows/{workflowId}/runs",
                None,
                "Start a run of a workflow.",
            ),
            Action("status", RUN, "GET", "/v1/runs/{runId}", None, "One run's status."),
            Action(
                "inspect",
                RUN,
                "GET",
                "/v1/runs/{runId}/inspection",
                None,
                "One run's steps, effects and waits (never payloads).",
            ),
            Action(
                "retry-same",
                RUN,
                "POST",
                "/v1/runs/{runId}/retry-same",
                reason_body,
                "Resend an uncertain command with its original key.",
                form=True,
            ),
            Action(
                "cancel",
                RUN,
                "POST",
                "/v1/runs/{runId}/cancel",
                reason_body,
                "Cancel a run (its onCancel path runs where one exists).",
                form=True,
            ),
            Action(
                "reconcile",
                RUN,
                "POST",
                "/v1/runs/{runId}/reconcile",
                reason_body,
                "Ask the product for its receipt of an uncertain command.",
                form=True,
            ),
            Action(
                "doctor",
                DEPLOYMENT,
                "GET",
                "/v1/operator/doctor",
                None,
                "The deployment's doctor report.",
            ),
            Action(
                "restore-hold",
                DEPLOYMENT,
                "POST",
                "/v1/operator/restore-hold",
                reason_body,
                "Hold execution and admissions after a restore.",
                wire=REASON_WIRE,
            ),
            Action(
                "release-restore-hold",
                DEPLOYMENT,
                "POST",
                "/v1/operator/release-restore-hold",
                reason_body,
                "Release the execution hold once held work is resolved.",
                wire=REASON_WIRE,
            ),
            Action(
                "release-admission-hold",
                DEPLOYMENT,
                "POST",
                "/v1/operator/release-admission-hold",
                attestation_body("admissionHistoryComplete"),
                "Reopen admissions once every spent key is established.",
                wire=attestation_wire("admissionHistoryComplete"),
            ),
            Action(
                "complete-execution-recovery",
                DEPLOYMENT,
                "POST",
                "/v1/operator/complete-execution-recovery",
                attestation_body("executionHistoryComplete"),
                "Attest that the execution history after the backup is established.",
                wire=attestation_wire("executionHistoryComplete"),
            ),
            Action(
                "retain",
                DEPLOYMENT,
                "POST",
                "/v1/operator/retain",
                retain_body,
                "Erase the payloads of runs that ended before the cutoff (never later than now).",
                wire=RETAIN_WIRE,
            ),
        )
    }
)
"""Every action, by name, in the order the contract lists them."""

RUN_ACTIONS: Final = tuple(name for name, a in ACTIONS.items() if a.scope == RUN)
"""The names of the actions on runs, scoped by a policy's ``workflows``."""
DEPLOYMENT_ACTIONS: Final = tuple(name for name, a in ACTIONS.items() if a.scope == DEPLOYMENT)
"""The names of the actions on the whole deployment; they need ``operator: true``."""


def operator_actions(scope: str) -> tuple[Action, ...]:
    """The actions of ``scope`` an operator posts with a body (reason, attestation, ...)."""
    return tuple(a for a in ACTIONS.values() if a.scope == scope and a.body is not None)


def check(name: str, body: Mapping[str, Any]) -> Checked:
    """``body`` checked as action ``name`` takes it; ``request.invalid`` for an action that
    takes no operator body (the name is caller text: it is not repeated back)."""
    action = ACTIONS.get(name)
    if action is None or action.body is None:
        raise _invalid("no such operator action")
    return action.body(body)


def request_body(name: str, members: Mapping[str, Any]) -> dict[str, Any]:
    """The ``OperatorActionRequest`` body of deployment-wide action ``name`` with its
    checked ``members``: ``{field: message}``, to pass as keyword arguments."""
    wire = ACTIONS[name].wire
    assert wire is not None  # every deployment-wide action with a body has its wire
    return {wire.field: wire.out(members)}


def members_of(name: str, request: Any) -> dict[str, Any]:
    """The members an ``OperatorActionRequest`` carries for action ``name`` (refused when
    the request's body is not the action's: it is checked again after this)."""
    action = ACTIONS.get(name)
    wire = None if action is None else action.wire
    if wire is None or request.WhichOneof("body") != wire.field:
        raise _invalid("no such operator action, or not its body")
    return wire.back(getattr(request, wire.field))
