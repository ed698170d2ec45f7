"""cancel: stop a run's future calls, or send it along its onCancel path (CONTRACT §10.3).

Cancel only writes the database, so it is allowed under the execution hold and from a
``--recovery-only`` instance; an onCancel path is dispatched once dispatch runs again. The
order of things, in one transaction with the run row locked:

1. Refuse a missing run, changed connection settings and an ended run (``cancel.refused``).
   A run that is already cancelling is answered as it is (idempotent), and the action is
   logged all the same.
2. Cancel the run's steps that wait to be worked on and that no dispatcher holds: ready,
   waiting (a timer or product wait is abandoned at once) and not-sent. A step a dispatcher
   holds is settled by that dispatcher, which sees the run is cancelling and never goes on
   from it. An uncertain step stays uncertain — its effect is unknown and inspection keeps
   showing it — and the run keeps its attention while one remains.
3. With an ``onCancel`` step: the run is cancelling with ``cancel_seq`` the number of that
   step, which is made due now, and the run is running; result ``cancelling``. Steps before
   ``cancel_seq`` are the abandoned ones; the path's own steps run normally and its finish
   ends the run ``cancelled`` with the outcome. Without one: the run is cancelling and, when
   no step of it is left to work on or held, ends ``cancelled`` now (result ``cancelled``);
   otherwise the dispatcher ends it when it settles the held step (result ``cancelling``).
4. The run's snapshot rows of the current hold epoch still unresolved are marked ``cancel``.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from core.codes import Code
from core.errors import CoordinatorError
from core.workflow.model import Workflow, step_kind
from recovery.env import RecoveryEnv
from recovery.targets import (
    answer,
    in_transaction,
    log_action,
    looking,
    read_action_run,
    resolve_snapshot,
)


def _ended() -> CoordinatorError:
    return CoordinatorError(Code.CANCEL_REFUSED, "the run has already ended")


async def cancel(env: RecoveryEnv, run_id: str, reason: str) -> dict[str, Any]:
    """Cancel the run; see the module docstring."""
    queries = env.store.queries
    async with looking(env) as conn:
        run = await read_action_run(conn, env, run_id, refuse_erased=False)
        if run.ended:
            raise _ended()
        workflow = await env.workflows.get(conn, queries, run.package_digest)

    async def write(conn: asyncpg.Connection) -> dict[str, Any]:
        locked = await queries.recovery_run_lock(conn, run_id=run_id)
        assert locked is not None  # run rows are never deleted
        if locked["ended"]:
            raise _ended()
        if locked["cancelling"]:
            # Already on its way out. Should nothing be left to work on (the dispatcher
            # settled the last held step without ending the run), end it now.
            ended = await queries.recovery_run_cancel_end(conn, run_id=run_id)
            result = "cancelled" if ended else "cancelling"
        else:
            result = await _begin(conn, env, workflow, run_id)
        await resolve_snapshot(conn, env, run_id, None, "cancel", overwrite=False)
        await log_action(conn, env, run_id, "cancel", reason)
        return await answer(conn, env, run_id, result)

    return await in_transaction(env, write)


async def _begin(
    conn: asyncpg.Connection, env: RecoveryEnv, workflow: Workflow, run_id: str
) -> str:
    queries = env.store.queries
    await queries.recovery_steps_cancel(conn, run_id=run_id)
    cancel_seq = None
    if workflow.on_cancel is not None:
        # None when the run already reached a step of that name (an onCancel step that is
        # also on the ordinary path): the path cannot be entered twice, so the run simply
        # stops, as without one.
        cancel_seq = await queries.recovery_cancel_path_insert(
            conn,
            run_id=run_id,
            step_id=workflow.on_cancel,
            step_type=step_kind(workflow.step(workflow.on_cancel)),
        )
    await queries.recovery_run_cancelling(conn, run_id=run_id, cancel_seq=cancel_seq)
    if cancel_seq is not None:
        return "cancelling"
    ended = await queries.recovery_run_cancel_end(conn, run_id=run_id)
    return "cancelled" if ended else "cancelling"
