"""Retention (CONTRACT §11): erase the payloads of runs that ended long enough ago.

One ``retain`` is one transaction and one statement (``recovery_retain``): it picks up to
``limit`` ended, not yet erased runs without an uncertain step, oldest ended first, skipping
runs another transaction holds; tombstones each run's start identity and command keys;
deletes the start identity row and every payload row of the run; and stamps ``erased_at``.
The run rows stay with their ids, states, outcomes, failures and timings, so status and
inspection still answer. Afterwards admission refuses a start with a spent identity
(``run.payload-erased``), and no command key is ever handed out again.

Erasure deletes the ciphertext rows; nothing is merely flagged. The operator action is
logged without a reason, since retain takes none.

A cutoff later than now is refused (``request.invalid``): a mistyped year must not erase
runs that ended a moment ago. A dry run (``dryRun: true``) answers the runs that the same
call would erase — chosen the same way, in the same order — and erases, locks and logs
nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.codes import Code
from core.errors import CoordinatorError
from core.payloads import transaction
from recovery.env import RecoveryEnv


async def retain(
    env: RecoveryEnv, before: datetime, limit: int, *, dry_run: bool = False
) -> dict[str, Any]:
    """Erase up to ``limit`` runs that ended before ``before``; answers their ids. A dry
    run answers the ids it would erase and erases nothing."""
    q = env.store.queries
    async with transaction(env.store) as conn:
        if await q.recovery_retain_check(conn, before=before):
            raise CoordinatorError(Code.REQUEST_INVALID, "/before: the cutoff is later than now")
        if dry_run:
            chosen = await q.recovery_retain_preview(conn, before=before, limit=limit)
            run_ids = [row.id for row in chosen]
            return {"dryRun": True, "erased": 0, "wouldErase": len(run_ids), "runIds": run_ids}
        erased = await q.recovery_retain(conn, before=before, limit=limit)
        await q.recovery_operator_log(conn, run_id=None, kind="retain", reason=None)
    run_ids = [row.id for row in erased]
    return {"erased": len(run_ids), "runIds": run_ids}
