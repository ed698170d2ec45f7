"""retry-same: send a held call's stored command again under its original key
(CONTRACT §10.2).

Recovery never sends a command itself. It makes the step ``ready`` again with its stored
command and command key, and the dispatcher of an ordinary instance sends exactly that
command under the same ``Idempotency-Key`` (as it does for any ready step with a stored
command) and classifies the answer as it classifies every answer. A step a restore-hold
found leased before its command was prepared has none stored; the dispatcher maps it as it
maps any first attempt, and sends it under the same key, derived from the run and step. The
order of things:

1. Look (read-only), refusing in this order: the run is missing, erased or depends on
   changed connection settings; this is a ``--recovery-only`` instance, which sends nothing
   (``retry.refused``); the execution hold is set (``execution.held``); the run has ended;
   it has no uncertain or not-sent call; a cancel abandoned that call; the product's
   idempotency window since the first attempt is over; the step's deadline has passed.
2. In one transaction: one call of ``step_retry_same`` (``core/db/transitions.sql``) — the
   hold row share-locked so that a restore-hold waits for it and then snapshots the ready
   step, then the run and the step locked — checks nothing moved meanwhile (the step is
   still the row version step 1 read), makes the step ready and due now and the run running
   (held while another call is uncertain); then the step's snapshot rows are marked
   ``retry`` and the action is logged.
3. After the commit, wait a bounded time for the dispatcher's verdict and answer it:
   ``accepted``, ``refused``, ``uncertain`` (held again), ``retrying`` (a retryable answer;
   due again later), ``failed`` (deadline or mapping-invalid), ``cancelled`` (a cancel came
   in meanwhile and the dispatcher abandoned the step), or ``pending`` when no verdict came
   within the wait (the resend still happens).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

import asyncpg

from core.codes import Code
from core.db.statements import RecoveryStepPollRow
from core.errors import CoordinatorError
from core.execution.operator import retry_same_refusal
from core.runs import VERDICT_WAIT_SECONDS
from core.states import StepState, Transition
from core.workflow.catalogue import connection_type
from recovery.env import RecoveryEnv
from recovery.targets import (
    RESENDABLE,
    answer,
    held_call,
    in_transaction,
    log_action,
    looking,
    read_action_run,
    read_held_step,
    resolve_snapshot,
)

WAIT_SECONDS: Final = VERDICT_WAIT_SECONDS
"""How long retry-same waits for the dispatcher's verdict before answering ``pending``,
unless the request asks for less (a bulk request shares one budget among its runs)."""
POLL_SECONDS: Final = 0.05

# The step states that are the dispatcher's verdict on the resent command.
_VERDICTS: Final[dict[str, str]] = {
    StepState.COMPLETED: "accepted",
    StepState.REFUSED: "refused",
    StepState.UNCERTAIN: "uncertain",
    StepState.FAILED: "failed",
    StepState.CANCELLED: "cancelled",
}


def _refused(detail: str) -> CoordinatorError:
    return CoordinatorError(Code.RETRY_REFUSED, detail)


def _held() -> CoordinatorError:
    return CoordinatorError(
        Code.EXECUTION_HELD, "the restore hold stops execution; nothing can be resent"
    )


def _ended() -> CoordinatorError:
    return _refused("the run has ended")


def _abandoned() -> CoordinatorError:
    return _refused("the run is being cancelled; its held call is no longer wanted")


def _changed() -> CoordinatorError:
    return _refused("the step changed meanwhile; look again")


# What step_retry_same's outcomes other than written mean to the operator.
_REFUSALS: Final[dict[Transition, Callable[[], CoordinatorError]]] = {
    Transition.HELD: _held,
    Transition.RUN_ENDED: _ended,
    Transition.ABANDONED: _abandoned,
    Transition.CHANGED: _changed,
}


async def retry_same(
    env: RecoveryEnv, run_id: str, reason: str, wait_seconds: float = WAIT_SECONDS
) -> dict[str, Any]:
    """Make the run's held call due again with its stored command; see the module docstring.
    ``wait_seconds`` bounds the wait for the verdict (at most :data:`WAIT_SECONDS`; 0 answers
    ``pending`` at once after the commit)."""
    queries = env.store.queries
    async with looking(env) as conn:
        run = await read_action_run(conn, env, run_id, refuse_erased=True)
        if env.recovery_only:
            raise _refused(
                "this instance runs --recovery-only and sends nothing; use the ordinary service"
            )
        if run.execution_hold:
            raise _held()
        if run.ended:
            raise _ended()
        step = await read_held_step(conn, env, run_id, RESENDABLE)
        if step is None:
            raise _refused("no held call to resend")
        if step.abandoned:
            raise _abandoned()
        call = await held_call(conn, env, run, step, Code.RETRY_REFUSED)
    # Without a recorded first attempt (a step a restore-hold found leased but not prepared)
    # the step's start is the earliest the command can have gone out: counting from there
    # errs on the side of refusing.
    kind = connection_type(call.connection_type)
    refusal = retry_same_refusal(
        call.operation,
        kind.product if kind is not None else call.connection_type,
        first_attempt_at=step.first_attempt_at or step.started_at,
        deadline_at=step.deadline_at,
        now=run.now,
    )
    if refusal is not None:
        raise _refused(refusal)

    async def make_ready(conn: asyncpg.Connection) -> int:
        row = await queries.recovery_step_retry_same(
            conn, run_id=run_id, step_id=step.step_id, row_version=step.row_version
        )
        assert row is not None  # one call: always one row
        outcome = Transition(row.outcome)
        if outcome is not Transition.WRITTEN:
            raise _REFUSALS[outcome]()
        await resolve_snapshot(conn, env, run_id, step.step_id, "retry", overwrite=True)
        await log_action(conn, env, run_id, "retry-same", reason)
        assert row.attempts is not None  # when written
        return row.attempts

    attempts = await in_transaction(env, make_ready)
    wait = min(max(wait_seconds, 0.0), WAIT_SECONDS)
    result = await _verdict(env, run_id, step.step_id, attempts, wait)
    async with env.store.connection() as conn:
        return await answer(conn, env, run_id, result)


def _judge(row: RecoveryStepPollRow | None, attempts: int) -> str | None:
    """The dispatcher's verdict on the resend from the step row, or ``None`` while pending."""
    if row is None:
        return None
    state = row.state
    verdict = _VERDICTS.get(state)
    if verdict is not None:
        return verdict
    if state == StepState.READY and row.attempts > attempts:
        # Sent, answered "not processed, try later": due again after a backoff.
        return "retrying"
    return None


async def _verdict(env: RecoveryEnv, run_id: str, step_id: str, attempts: int, wait: float) -> str:
    """Poll the step until the dispatcher has answered, at most ``wait`` seconds."""
    sleep = env.sleep or asyncio.sleep
    ends = time.monotonic() + wait
    for _ in range(int(wait / POLL_SECONDS)):
        await sleep(POLL_SECONDS)
        async with env.store.connection() as conn:
            row = await env.store.queries.recovery_step_poll(conn, run_id=run_id, step_id=step_id)
        verdict = _judge(row, attempts)
        if verdict is not None:
            return verdict
        if time.monotonic() >= ends:
            break
    return "pending"
