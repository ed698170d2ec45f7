"""Writing what happened to a step, each outcome in one transaction with what follows it.

The common case of the busiest writes — preparing a first command, and ending a step with
its successor or with its run, in a run neither ended nor being cancelled — is one
statement (:meth:`Settler.fast`): it locks the run row and then the step's exactly as the
locked transaction would, and writes only when the lease is still this dispatcher's in the
current hold epoch. When it writes nothing, the caller takes the locked transaction, which
tells the other cases apart and writes what each of them calls for.

An executor opens :meth:`Settler.locked` for its claimed step: a transaction that first
locks the step row (and its run's), and only while this dispatcher still holds its lease in
the current hold epoch; inside, it writes through :class:`dispatcher.tx.Tx`. A lost lease
(another dispatcher found it expired, or a restore-hold raised the epoch) yields no ``Tx``:
the step is no longer ours to move, and one line in the log says which of the two it was
(``restore.lease-incompatible`` for the epoch). :meth:`Settler.settle` runs an outcome in
such a transaction and tries again while the database is away, so an answer already known
is not lost to an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from core.codes import Code
from core.crypto import Keyring
from core.errors import CoordinatorError
from core.payloads import seal_json, statement, transaction
from core.runtime import Store
from core.states import StepState
from dispatcher.claim import Claimed
from dispatcher.onward import Onward
from dispatcher.tx import Prepared, Tx, sealed_columns

log = logging.getLogger("coordinator.dispatcher")

T = TypeVar("T")

# Delays between attempts to record an outcome while the database is unreachable. Their
# sum stays well inside a lease, so the lease is still ours when the database returns.
STORE_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_TRANSIENT = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)


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
        self._sleep = sleep
        self.steps_done_inline = 0
        """Local steps recorded by a settling statement instead of being claimed."""

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
                tx = None
            else:
                tx = Tx(conn, self.store, self.keyring, self.owner, claimed, row)
            yield tx
        if tx is not None:
            tx.log_changes(log)

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
                if exc.code != Code.SERVICE_UNAVAILABLE or delay is None:
                    raise
            except _TRANSIENT:
                # Rolled back as a whole (an operator action locked the run first, say);
                # the answer is still known, so record it again rather than lose it.
                if delay is None:
                    raise
            await self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def fast(
        self, run: Callable[[asyncpg.Connection], Awaitable[asyncpg.Record | None]]
    ) -> asyncpg.Record | None:
        """Run one of the single-statement common cases (``run`` makes its one call);
        ``None`` when it wrote nothing — also when the database is away or the statement
        lost a deadlock, since the locked transaction retries those."""
        try:
            async with statement(self.store) as conn:
                return await run(conn)
        except CoordinatorError as exc:
            if exc.code != Code.SERVICE_UNAVAILABLE:
                raise
        except _TRANSIENT:
            pass
        return None

    async def fast_advance(
        self,
        claimed: Claimed,
        way: Onward,
        *,
        state: str = StepState.COMPLETED,
        effect: str | None = None,
        keep: dict[str, Any] | None = None,
    ) -> bool:
        """End the step (keeping ``keep``'s payloads), record the local steps ``way`` passes
        and make its next step due (or end the run at its finish), in one statement; False
        when that common case did not hold and nothing was written."""
        namespace = self.store.runtime.config.namespace
        purposes, versions, nonces, ciphertexts = sealed_columns(
            self.keyring, namespace, claimed.run_id, keep or {}
        )
        queries = self.store.queries
        row = await self.fast(
            lambda conn: conn.fetchrow(
                queries["dispatcher_fast_advance"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                state,
                effect,
                purposes,
                versions,
                nonces,
                ciphertexts,
                way.next_step,
                way.next_kind,
                way.step_ids,
                way.step_types,
                way.outcome,
            )
        )
        if row is None:
            return False
        self.steps_done_inline += len(way.passed)
        if log.isEnabledFor(logging.INFO):
            _log_onward(claimed, state, way)
        return True

    async def fast_end_run(
        self, claimed: Claimed, *, step_state: str, run_state: str, outcome: str | None
    ) -> bool:
        """End the step and its run in one statement; False when that common case did not
        hold and nothing was written."""
        queries = self.store.queries
        row = await self.fast(
            lambda conn: conn.fetchrow(
                queries["dispatcher_fast_end_run"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                step_state,
                None,
                run_state,
                outcome,
                None,
                None,
            )
        )
        if row is None:
            return False
        log.info(
            "run %s step %s: %s; the run %s (outcome %s)",
            claimed.run_id,
            claimed.step_id,
            step_state,
            run_state,
            outcome,
        )
        return True

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
        if command_payload_id is None:
            fast = await self._fast_prepare(claimed, command, command_key, deadline_seconds)
            if fast is not None:
                return fast
        try:
            async with self.locked(claimed) as tx:
                if tx is None:
                    return None
                if tx.abandoned:
                    await tx.cancel()
                    return None
                if tx.execution_held:
                    raise _NotPrepared
                prepared = await tx.prepare_command(
                    command_payload_id, command, command_key, deadline_seconds
                )
                if prepared is None:
                    raise _NotPrepared
        except _NotPrepared:
            # Rolled back, the sealed command included; the step is ours, so give it back.
            await self.unprepare(claimed)
            return None
        return prepared

    async def _fast_prepare(
        self, claimed: Claimed, command: Any, command_key: str, deadline_seconds: int
    ) -> Prepared | None:
        sealed = seal_json(
            self.keyring, self.store.runtime.config.namespace, claimed.run_id, "command", command
        )
        queries = self.store.queries
        row = await self.fast(
            lambda conn: conn.fetchrow(
                queries["dispatcher_fast_prepare"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                sealed.key_version,
                sealed.nonce,
                sealed.ciphertext,
                command_key,
                deadline_seconds,
            )
        )
        if row is None:
            return None
        log.info("run %s step %s: prepared", claimed.run_id, claimed.step_id)
        return Prepared.from_row(row)

    async def unprepare(self, claimed: Claimed, delay: float = 0.0) -> None:
        """Give the step back, ready again: this dispatcher knows it sent nothing."""
        async with statement(self.store) as conn:
            await conn.fetchrow(
                self.store.queries["dispatcher_step_unprepare"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                delay,
            )
        log.info("run %s step %s: nothing sent; ready again", claimed.run_id, claimed.step_id)

    async def token_refused(self, claimed: Claimed, *, delay: float, deadline_seconds: int) -> None:
        """The issuer refused the step's access token, so nothing was sent: the step is
        ready again in ``delay`` seconds (no later than its deadline) with cause
        ``token-refused``, and the run gets attention (§8.4). The first refusal starts the
        ``deadline_seconds`` clock a first attempt would have started. Nothing is written
        when the lease is no longer ours."""
        async with statement(self.store) as conn:
            await conn.fetchrow(
                self.store.queries["dispatcher_step_token_refused"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                delay,
                deadline_seconds,
            )
        log.info(
            "run %s step %s: the access token was refused; ready again in %.0f s",
            claimed.run_id,
            claimed.step_id,
            delay,
        )

    async def record_token_refusal(self, connection: str, error: str) -> None:
        """Remember for doctor that the issuer refused ``connection``'s token with the OAuth
        error code ``error`` (e.g. ``invalid_client``; never the issuer's description)."""
        async with statement(self.store) as conn:
            await conn.execute(
                self.store.queries["dispatcher_token_refusal_record"], connection, error
            )

    async def clear_token_refusal(self, connection: str) -> None:
        """Forget ``connection``'s recorded refusal: the issuer granted it a token."""
        async with statement(self.store) as conn:
            await conn.execute(self.store.queries["dispatcher_token_refusal_clear"], connection)

    async def release(self, claimed: Claimed, delay: float = 0.0) -> str | None:
        """Give the lease up without an outcome; a prepared step becomes uncertain.

        Answers the step's state afterwards, or ``None`` if the lease was not ours anymore.
        """
        async with statement(self.store) as conn:
            state = await conn.fetchval(
                self.store.queries["dispatcher_step_release"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                delay,
            )
        if state is None:
            return None
        log.info("run %s step %s: released, now %s", claimed.run_id, claimed.step_id, state)
        return str(state)

    async def renew(self, claimed: Claimed, seconds: float) -> bool:
        """Extend the lease; False when it is no longer ours."""
        async with statement(self.store) as conn:
            renewed = await conn.fetchval(
                self.store.queries["dispatcher_lease_renew"],
                claimed.run_id,
                claimed.step_id,
                self.owner,
                seconds,
            )
        return renewed is not None


def _log_onward(claimed: Claimed, state: str, way: Onward) -> None:
    passed = "".join(f"; {step_id} ({kind}) completed" for step_id, kind in way.passed)
    if way.next_step is not None:
        then = f"next step {way.next_step} is due"
    else:
        then = f"the run ended at its finish (outcome {way.outcome})"
    log.info("run %s step %s: %s%s; %s", claimed.run_id, claimed.step_id, state, passed, then)
