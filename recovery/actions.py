"""Operator actions on one run: reconcile, retry-same and cancel (CONTRACT §8.5, §10.1–10.4).

The gateway validated the request, authorized the caller and audits the action before the
answer is released; this module checks the action and reason again (a component does not
trust its caller's validation) and hands over to :mod:`recovery.reconcile`,
:mod:`recovery.retry_same` or :mod:`recovery.cancel`. Each answers the run's status document
with ``result``, or raises the refusal of §10 as a :class:`CoordinatorError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from core.codes import Code
from core.errors import CoordinatorError
from core.runs import REFERENCE
from recovery.cancel import cancel
from recovery.env import RecoveryEnv
from recovery.reconcile import reconcile
from recovery.retry_same import retry_same

Action = Callable[[RecoveryEnv, str, str], Awaitable[dict[str, Any]]]

HANDLERS: Final[Mapping[str, Action]] = MappingProxyType(
    {"reconcile": reconcile, "retry-same": retry_same, "cancel": cancel}
)
"""What carries out each operator action on a run (the names of
:func:`core.actions.operator_actions`, as a test checks)."""


async def run_action(
    env: RecoveryEnv, run_id: str, action: str, reason: str, verdict_wait: float | None = None
) -> dict[str, Any]:
    """Carry out ``action`` on ``run_id``; answers the run's status with ``result``.
    ``verdict_wait`` shortens retry-same's wait for the dispatcher's verdict."""
    handler = HANDLERS.get(action)
    if handler is None:
        *others, last = HANDLERS
        raise CoordinatorError(
            Code.REQUEST_INVALID, f"action: must be {', '.join(others)} or {last}"
        )
    if not REFERENCE.fullmatch(reason):
        raise CoordinatorError(
            Code.REQUEST_INVALID, "reason: must be 1 to 128 characters of A-Z a-z 0-9 . _ : / -"
        )
    if action == "retry-same" and verdict_wait is not None:
        return await retry_same(env, run_id, reason, verdict_wait)
    return await handler(env, run_id, reason)
