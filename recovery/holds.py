"""The restore holds (CONTRACT §10.5): restore-hold, complete-execution-recovery,
release-restore-hold and release-admission-hold.

The order of a restore procedure, as these actions enforce it:

1. ``restore-hold`` sets the execution and admission holds, raises the hold epoch, opens the
   epoch's recovery record and snapshots every call step that may have sent a command since
   the backup; those steps become uncertain and their runs held. Issued again while held,
   it starts a new epoch with a new snapshot, and only the newest snapshot is waited for.
2. The operator settles each snapshotted step (reconcile, retry-same left for after the
   release, or cancel) and states with ``complete-execution-recovery`` that the execution
   history is complete and the prior deployment fenced.
3. ``release-restore-hold`` lifts the execution hold, only once no snapshotted step is
   uncertain without a decision and the statement of step 2 is recorded.
4. ``release-admission-hold`` lifts the admission hold, only after step 3.

Each action is one transaction that first locks the hold row, so operators acting at the
same time are served one after the other and each sees what the previous one did. Every
action that succeeds logs an operator action; a refusal rolls everything back and leaves
its record to the audit journal. The hold row's trigger notifies ``<ns>_hold``.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from core.clock import timestamp
from core.codes import Code
from core.db.statements import RecoveryHoldLockRow, Statements
from core.errors import CoordinatorError
from core.payloads import transaction
from recovery.env import RecoveryEnv


def _holds(execution: bool, admission: bool) -> dict[str, bool]:
    return {"execution": execution, "admission": admission}


async def _lock_holds(conn: asyncpg.Connection, q: Statements) -> RecoveryHoldLockRow:
    row = await q.recovery_hold_lock(conn)
    if row is None:
        raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "the namespace has no hold row")
    return row


def _hold_required(detail: str) -> CoordinatorError:
    return CoordinatorError(Code.RESTORE_HOLD_REQUIRED, detail)


async def _log(conn: asyncpg.Connection, q: Statements, kind: str, reference: str) -> None:
    await q.recovery_operator_log(conn, run_id=None, kind=kind, reason=reference)


async def restore_hold(env: RecoveryEnv, reason: str) -> dict[str, Any]:
    """Set both holds in a new epoch and hold for review every step possibly sent."""
    q = env.store.queries
    async with transaction(env.store) as conn:
        await _lock_holds(conn, q)
        raised = await q.recovery_hold_raise(conn, reason=reason)
        assert raised is not None  # _lock_holds found the hold row
        epoch = int(raised)
        # The snapshot first: a leased call step must be found while it still shows its
        # lease; recovery_leases_drop then frees the leases of every other kind of step.
        snapshot = await q.recovery_snapshot_take(conn, epoch=epoch)
        await q.recovery_leases_drop(conn)
        await _log(conn, q, "restore-hold", reason)
    assert snapshot is not None  # an aggregate always answers one row
    return {
        "holds": _holds(True, True),
        "epoch": epoch,
        "snapshot": {"steps": snapshot.steps, "runs": snapshot.runs},
    }


async def complete_execution_recovery(env: RecoveryEnv, reference: str) -> dict[str, Any]:
    """Record the operator's statement that execution recovery is complete."""
    q = env.store.queries
    async with transaction(env.store) as conn:
        hold = await _lock_holds(conn, q)
        if not hold.execution_hold:
            raise _hold_required("the execution hold is not set; there is nothing to recover")
        epoch = hold.epoch
        recovered_at = await q.recovery_execution_recovered(conn, epoch=epoch, reference=reference)
        if recovered_at is None:
            # Only restore-hold opens a recovery record; a hold set any other way has none
            # to attest to, and a new restore-hold is the way forward.
            raise _hold_required("the execution hold has no recovery record; issue restore-hold")
        await _log(conn, q, "complete-execution-recovery", reference)
    return {
        "holds": _holds(True, hold.admission_hold),
        "epoch": epoch,
        "executionRecoveredAt": timestamp(recovered_at),
    }


async def release_restore_hold(env: RecoveryEnv, reason: str) -> dict[str, Any]:
    """Lift the execution hold once every snapshotted step is decided and recovery attested."""
    q = env.store.queries
    async with transaction(env.store) as conn:
        hold = await _lock_holds(conn, q)
        if not hold.execution_hold:
            raise _hold_required("the execution hold is not set")
        epoch = hold.epoch
        unresolved = int(await q.recovery_snapshot_unresolved(conn, epoch=epoch))
        if unresolved:
            raise CoordinatorError(
                Code.RESTORE_UNRESOLVED,
                f"{unresolved} snapshotted step(s) are still uncertain; reconcile, cancel or "
                "leave each for retry-same before releasing",
            )
        record = await q.recovery_record_read(conn, epoch=epoch)
        if record is None or record.execution_recovered_at is None:
            raise CoordinatorError(
                Code.RESTORE_REVIEW_REQUIRED,
                "complete-execution-recovery has not been recorded for this hold",
            )
        await q.recovery_execution_release(conn, epoch=epoch, reason=reason)
        await _log(conn, q, "release-restore-hold", reason)
    return {"holds": _holds(False, hold.admission_hold), "epoch": epoch}


async def release_admission_hold(env: RecoveryEnv, reference: str) -> dict[str, Any]:
    """Lift the admission hold, which only follows the execution hold's release."""
    q = env.store.queries
    async with transaction(env.store) as conn:
        hold = await _lock_holds(conn, q)
        if hold.execution_hold:
            raise _hold_required("release-restore-hold must lift the execution hold first")
        await q.recovery_admission_release(conn, reference=reference)
        await _log(conn, q, "release-admission-hold", reference)
    return {"holds": _holds(False, False), "epoch": hold.epoch}
