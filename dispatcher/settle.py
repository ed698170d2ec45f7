"""Writing what happened to a step, each outcome in one transaction with what follows it.

An executor opens :meth:`Settler.locked` for its claimed step: a transaction that first
locks the step row (and its run's), and only while this dispatcher still holds its lease in
the current hold epoch. Inside, :class:`Tx` records the outcome — kept payloads, the step's
end, the run's new state and the next step made due — so that a crash leaves either all of
it or none of it (CONTRACT §9.3: an outcome is committed before the next step is due). A
lost lease (another dispatcher found it expired, or a restore-hold raised the epoch) yields
no ``Tx``: the step is no longer ours to move, and one line in the log says which of the two
it was (``restore.lease-incompatible`` for the epoch).

A step abandoned by a cancel (``Tx.abandoned``: the run is cancelling and the step comes
before its onCancel path, or there is no such path) still gets its own outcome — an
accepted effect is kept, a refusal or an uncertain answer recorded — but :class:`Tx` never
makes another step due after it and never schedules it again: a retry or a wait ends it
``cancelled``. When the cancel has no onCancel path and the run is left with no live step,
the same transaction ends the run ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from core.crypto import Keyring
from core.errors import CoordinatorError
from core.runtime import Store
from core.workflow.model import Workflow, step_kind
from dispatcher.context import Claimed, seal_json, transaction

log = logging.getLogger("coordinator.dispatcher")

T = TypeVar("T")

# Delays between attempts to record an outcome while the database is unreachable. Their
# sum stays well inside a lease, so the lease is still ours when the database returns.
STORE_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_TRANSIENT = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)


@dataclass(frozen=True)
class Failure:
    """Why a run failed (CONTRACT §8.3): kind, and a JSON pointer where one applies."""

    kind: str
    path: str | None = None


@dataclass(frozen=True)
class Prepared:
    """A command committed as prepared, about to be sent."""

    attempts: int
    first_of_run: bool
    since_admission: float


class Tx:
    """The open, step-locked transaction of one claimed step."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        settler: Settler,
        claimed: Claimed,
        row: Mapping[str, Any],
    ) -> None:
        self.conn = conn
        self._settler = settler
        self._queries = settler.store.queries
        self.claimed = claimed
        self.now: datetime = row["now"]
        self.seq = int(row["seq"])
        self.state = str(row["state"])
        self.deadline_at: datetime | None = row["deadline_at"]
        self.timeout_at: datetime | None = row["timeout_at"]
        self.cancelling = bool(row["cancelling"])
        self.cancel_seq: int | None = row["cancel_seq"]
        self.abandoned = bool(row["abandoned"])
        """A cancel abandoned this step: record its outcome, continue nowhere."""
        self.execution_held = bool(row["execution_hold"])
        self.run_ended = bool(row["run_ended"])

    async def keep(self, purpose: str, value: Any) -> int:
        """Seal and store a payload of this step; answers its id."""
        return await self._settler.insert_payload(
            self.conn, self.claimed.run_id, self.claimed.step_id, purpose, value
        )

    async def end_step(self, state: str, effect: str | None = None) -> None:
        """End this step in ``state`` (completed, refused, failed, cancelled)."""
        await self.conn.execute(
            self._queries["dispatcher_step_end"],
            self.claimed.run_id,
            self.claimed.step_id,
            state,
            effect,
        )
        await self._after_abandoned()

    async def cancel(self) -> None:
        """End this abandoned step ``cancelled``: whatever it was about to do is not done."""
        await self.end_step("cancelled")

    async def _after_abandoned(self) -> None:
        """End a run cancelled without an onCancel path once no step of it is live."""
        if not self.abandoned or self.cancel_seq is not None or self.run_ended:
            return
        live = await self.conn.fetchval(
            self._queries["dispatcher_run_live_steps"], self.claimed.run_id, self.claimed.step_id
        )
        if live:
            return
        await self.conn.fetchrow(
            self._queries["dispatcher_run_end"],
            self.claimed.run_id,
            "cancelled",
            None,
            None,
            None,
            None,
        )
        self.run_ended = True

    async def next_step(self, workflow: Workflow, step_id: str) -> None:
        """Make ``step_id`` the run's next step, due now, and the run running."""
        if self.run_ended or self.abandoned:
            # An ended run goes nowhere; a cancelled one continues, if at all, on its
            # onCancel path, which recovery already made due.
            return
        kind = step_kind(workflow.step(step_id))
        await self.conn.fetchrow(
            self._queries["dispatcher_step_insert"],
            self.claimed.run_id,
            step_id,
            self.seq + 1,
            kind,
        )
        await self.conn.execute(
            self._queries["dispatcher_run_progress"], self.claimed.run_id, "running"
        )

    async def advance(
        self,
        workflow: Workflow,
        next_step: str,
        *,
        state: str = "completed",
        effect: str | None = None,
    ) -> None:
        """End this step and continue at ``next_step``."""
        await self.end_step(state, effect)
        await self.next_step(workflow, next_step)

    async def end_run(
        self,
        *,
        step_state: str,
        run_state: str,
        effect: str | None = None,
        outcome: str | None = None,
        failure: Failure | None = None,
    ) -> None:
        """End this step and the run (succeeded with ``outcome`` or failed with ``failure``).

        An abandoned step ends alone: its run ends on its onCancel path, or — without one —
        cancelled once nothing else of it is live.
        """
        await self.end_step(step_state, effect)
        if self.abandoned:
            return
        await self.conn.fetchrow(
            self._queries["dispatcher_run_end"],
            self.claimed.run_id,
            run_state,
            outcome,
            None if failure is None else failure.kind,
            None if failure is None else failure.path,
            None if failure is None else self.claimed.step_id,
        )

    async def uncertain(self) -> None:
        """The command may have been processed: the step waits for an operator, run held."""
        await self.conn.execute(
            self._queries["dispatcher_step_uncertain"], self.claimed.run_id, self.claimed.step_id
        )
        await self.conn.execute(self._queries["dispatcher_run_hold"], self.claimed.run_id)
        # The run keeps its attention (the step stays unknown), even once it is cancelled.
        await self._after_abandoned()

    async def retry(self, delay: float) -> bool:
        """Due again in ``delay`` seconds; False (nothing written) if that misses the deadline.

        An abandoned step is never tried again: it ends cancelled (True: nothing more to do).
        """
        if self.abandoned:
            await self.cancel()
            return True
        if self.deadline_at is not None and (self.deadline_at - self.now).total_seconds() <= delay:
            return False
        await self.conn.fetchrow(
            self._queries["dispatcher_step_retry"], self.claimed.run_id, self.claimed.step_id, delay
        )
        return True

    async def wait(self, due_at: datetime | None, timeout_at: datetime | None = None) -> None:
        """The step waits until ``due_at`` (or an outside event); the run is waiting.

        An abandoned step does not wait for anything: it ends cancelled.
        """
        if self.abandoned:
            await self.cancel()
            return
        await self.conn.execute(
            self._queries["dispatcher_step_wait"],
            self.claimed.run_id,
            self.claimed.step_id,
            due_at,
            timeout_at,
        )
        await self.conn.execute(
            self._queries["dispatcher_run_progress"], self.claimed.run_id, "waiting"
        )


class _NotPrepared(Exception):
    pass


class Settler:
    """Every write the dispatcher makes to a step it holds."""

    def __init__(
        self,
        store: Store,
        keyring: Keyring,
        owner: str,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.keyring = keyring
        self.owner = owner
        self.namespace = store.runtime.config.namespace
        self._sleep = sleep

    async def insert_payload(
        self, conn: asyncpg.Connection, run_id: str, step_id: str, purpose: str, value: Any
    ) -> int:
        """Seal ``value`` and store it as ``purpose`` of ``step_id``; answers the row id."""
        sealed = seal_json(self.keyring, self.namespace, run_id, purpose, value)
        payload_id = await conn.fetchval(
            self.store.queries["dispatcher_payload_insert"],
            run_id,
            step_id,
            purpose,
            sealed.key_version,
            sealed.nonce,
            sealed.ciphertext,
        )
        return int(payload_id)

    @contextlib.asynccontextmanager
    async def locked(self, claimed: Claimed) -> AsyncIterator[Tx | None]:
        """A transaction holding the step's row lock, or ``None`` when the lease is lost."""
        async with transaction(self.store) as conn:
            row = await conn.fetchrow(
                self.store.queries["dispatcher_step_lock"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
            )
            if row is None:
                await self._report_lost(conn, claimed)
                yield None
            else:
                yield Tx(conn, self, claimed, row)

    async def _report_lost(self, conn: asyncpg.Connection, claimed: Claimed) -> None:
        """Say in one line why a lease could not be used; nothing is written either way."""
        epoch = await conn.fetchval(self.store.queries["dispatcher_hold_epoch"])
        if claimed.lease_epoch is not None and epoch != claimed.lease_epoch:
            # A restore-hold raised the epoch: whatever this execution learnt belongs to
            # before the hold, and the operator's review of the snapshot decides the step.
            log.warning(
                "restore.lease-incompatible: step %s of run %s was leased before the current "
                "restore hold; nothing is recorded for it",
                claimed.step_id,
                claimed.run_id,
            )
        else:
            log.warning(
                "step %s of run %s: the lease was lost; nothing is recorded for it",
                claimed.step_id,
                claimed.run_id,
            )

    async def settle(
        self, claimed: Claimed, action: Callable[[Tx], Awaitable[T]]
    ) -> tuple[bool, T | None]:
        """Run ``action`` in a locked transaction, retrying while the database is away.

        Answers (False, None) when the lease was lost, else (True, the action's result).
        A deadlock victim is tried again too: nothing of it was written.
        """
        for delay in (*STORE_RETRY_DELAYS, None):
            try:
                async with self.locked(claimed) as tx:
                    if tx is None:
                        return False, None
                    return True, await action(tx)
            except CoordinatorError as exc:
                if exc.code != "service.unavailable" or delay is None:
                    raise
            except _TRANSIENT:
                # Rolled back as a whole (an operator action locked the run first, say);
                # the answer is still known, so record it again rather than lose it.
                if delay is None:
                    raise
            await self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def prepare(
        self,
        claimed: Claimed,
        *,
        command: Any,
        command_payload_id: int | None,
        command_key: str,
        deadline_seconds: int,
    ) -> Prepared | None:
        """Commit the command (sealed) and its key as prepared, before it is sent.

        Reuses the stored command when a retry already has one. ``None`` when nothing may
        be sent, with what that calls for already written: the lease was lost (nothing
        written), the execution hold is set (the step is given back, ready), or a cancel
        abandoned the step (it ends cancelled, in the same locked transaction that would
        have prepared it — so a cancel committed first stops the command, and one committed
        later finds the step prepared and leased, and leaves it to be settled).
        """
        queries = self.store.queries
        try:
            async with self.locked(claimed) as tx:
                if tx is None:
                    return None
                if tx.abandoned:
                    await tx.cancel()
                    return None
                if tx.execution_held:
                    raise _NotPrepared
                payload_id = command_payload_id
                if payload_id is None:
                    payload_id = await self.insert_payload(
                        tx.conn, claimed.run_id, claimed.step_id, "command", command
                    )
                row = await tx.conn.fetchrow(
                    queries["dispatcher_command_prepare"],
                    claimed.run_id,
                    claimed.step_id,
                    self.owner,
                    payload_id,
                    command_key,
                    deadline_seconds,
                )
                if row is None:
                    raise _NotPrepared
        except _NotPrepared:
            # Rolled back, the sealed command included; the step is ours, so give it back.
            await self.unprepare(claimed)
            return None
        return Prepared(
            attempts=int(row["attempts"]),
            first_of_run=bool(row["first_of_run"]),
            since_admission=float(row["since_admission"] or 0.0),
        )

    async def unprepare(self, claimed: Claimed, delay: float = 0.0) -> None:
        """Give the step back, ready again: this dispatcher knows it sent nothing."""
        async with transaction(self.store) as conn:
            await conn.fetchrow(
                self.store.queries["dispatcher_step_unprepare"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                delay,
            )

    async def release(self, claimed: Claimed, delay: float = 0.0) -> str | None:
        """Give the lease up without an outcome; a prepared step becomes uncertain.

        Answers the step's state afterwards, or ``None`` if the lease was not ours anymore.
        """
        async with transaction(self.store) as conn:
            state = await conn.fetchval(
                self.store.queries["dispatcher_step_release"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                delay,
            )
        return None if state is None else str(state)

    async def renew(self, claimed: Claimed, seconds: float) -> bool:
        """Extend the lease; False when it is no longer ours."""
        async with transaction(self.store) as conn:
            renewed = await conn.fetchval(
                self.store.queries["dispatcher_lease_renew"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                seconds,
            )
        return renewed is not None
