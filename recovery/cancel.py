"""cancel: stop a run's future calls, or send it along its onCancel path (CONTRACT §10.3).

Cancel only writes the database, so it is allowed under the execution hold and from a
``--recovery-only`` instance; an onCancel path is dispatched once dispatch runs again. The
order of things, in one transaction, steps 2 and 3 being one call of ``run_cancel``
(``core/db/transitions.sql``) with the run row locked:

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
from core.states import Transition
from core.workflow.model import step_kind
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

    on_cancel = workflow.on_cancel
    on_cancel_type = None if on_cancel is None else step_kind(workflow.step(on_cancel))

    async def write(conn: asyncpg.Connection) -> dict[str, Any]:
        row = await queries.recovery_run_cancel(
            conn,
            run_id=run_id,
            on_cancel=on_cancel,
            on_cancel_type=on_cancel_type,
        )
        assert row is not None  # one call: always one row
        if row.outcome == Transition.RUN_ENDED:
            raise _ended()
        result = str(row.run_state)
        await resolve_snapshot(conn, env, run_id, None, "cancel", overwrite=False)
        await log_action(conn, env, run_id, "cancel", reason)
        return await answer(conn, env, run_id, result)

    return await in_transaction(env, write)
