"""Deployment-wide operator actions: the restore holds and retention (CONTRACT §10.5, §11).

The gateway checked the body before it called; it is checked again here, with the same
check (:func:`core.actions.check`), since this component must not act on a body nobody
checked (another caller of the internal API, a gateway of another version). Then the action
is carried out in :mod:`recovery.holds` or :mod:`recovery.retention`. Every refusal is
``request.invalid`` naming the member at fault, never the value sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from core import actions
from core.clock import parse_offset_instant
from core.codes import Code
from core.errors import CoordinatorError
from recovery import holds, retention
from recovery.env import RecoveryEnv

Handler = Callable[[RecoveryEnv, actions.Checked], Awaitable[dict[str, Any]]]


def _reference(checked: actions.Checked) -> str:
    assert checked.reference is not None  # the action's body names its reference
    return checked.reference


async def _retain(env: RecoveryEnv, checked: actions.Checked) -> dict[str, Any]:
    before = parse_offset_instant(checked.members["before"])
    assert before is not None  # checked
    limit = int(checked.members["limit"])
    return await retention.retain(
        env, before, limit, dry_run=bool(checked.members.get("dryRun", False))
    )


HANDLERS: Final[Mapping[str, Handler]] = MappingProxyType(
    {
        "restore-hold": lambda env, c: holds.restore_hold(env, _reference(c)),
        "release-restore-hold": lambda env, c: holds.release_restore_hold(env, _reference(c)),
        "release-admission-hold": lambda env, c: holds.release_admission_hold(env, _reference(c)),
        "complete-execution-recovery": lambda env, c: holds.complete_execution_recovery(
            env, _reference(c)
        ),
        "retain": _retain,
    }
)
"""What carries out each deployment-wide action with a body (the names of
:func:`core.actions.operator_actions`, as a test checks)."""


async def operator_action(
    env: RecoveryEnv, action: str, members: Mapping[str, Any]
) -> dict[str, Any]:
    """Carry out the deployment-wide ``action`` with the members of its body, checked again
    here."""
    handler = HANDLERS.get(action)
    if handler is None:
        # The action name is caller text: it is not repeated back.
        raise CoordinatorError(Code.REQUEST_INVALID, "no such operator action")
    return await handler(env, actions.check(action, members))
