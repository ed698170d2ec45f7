"""Writing what happened to a step: each transition one call, its outcome one word.

Every write the dispatcher makes to a step it holds is one call of a function of
``core/db/transitions.sql`` in one statement: :meth:`Settler.conclude` (``step_settle``) for an
executor that knows how its step ends, :meth:`Settler.prepare` before a call sends its
command, :meth:`Settler.retry`, :meth:`Settler.uncertain` and :meth:`Settler.wait` for a call's
and a timer's other ends, and :meth:`Settler.plan_check` and :meth:`Settler.record_read` around
a wait-for's read. Each function locks the run row and then the step's (the order a cancel
takes them in), writes only while the lease is still this dispatcher's in the current hold
epoch, decides against the database's clock what a deadline or a timeout calls for and what a
cancel, the execution hold or an ended run calls for, and answers which of those it met.

A lost lease (another dispatcher found it expired, or a restore-hold raised the epoch) writes
nothing: the step is no longer ours to move, and one line in the log says which of the two it
was (``restore.lease-incompatible`` for the epoch). Every transition but the prepare is tried
again while the database is away, so an answer already known is not lost to an outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

import asyncpg

from core.codes import Code
from core.crypto import Keyring, Sealed
from core.db.statements import (
    DispatcherStepPrepareRow,
    DispatcherStepRetryRow,
    DispatcherStepSettleChainRow,
    DispatcherStepSettleRow,
    DispatcherStepUncertainRow,
    DispatcherStepWaitRow,
    WaitsPlanCheckRow,
    WaitsRecordReadRow,
)
from core.errors import CoordinatorError
from core.execution.settlement import UNCERTAIN_CAUSES, Settlement
from core.payloads import seal_json, statement
from core.runtime import Store
from core.states import RetryCause, SentNothing, StepState, Transition
from dispatcher.claim import Claimed

log = logging.getLogger("coordinator.dispatcher")

T = TypeVar("T")


class _Answered(Protocol):
    """A transition function's row: every one answers an outcome."""

    @property
    def outcome(self) -> str: ...


R = TypeVar("R", bound=_Answered)

# Delays between attempts to record an outcome while the database is unreachable. Their
# sum stays well inside a lease, so the lease is still ours when the database returns.
STORE_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_TRANSIENT = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)


@dataclass(frozen=True)
class Prepared:
    """A command committed as prepared, about to be sent."""

    attempts: int
    first_of_run: bool
    since_admission: float
    deadline_in: float | None = None
    """Seconds left until the step's deadline: no exchange may run past it."""

    @classmethod
    def from_row(cls, row: DispatcherStepPrepareRow) -> Prepared:
        """The prepared command of a ``dispatcher_step_prepare`` answer (written)."""
        assert row.attempts is not None and row.first_of_run is not None  # when written
        return cls(
            attempts=row.attempts,
            first_of_run=row.first_of_run,
            since_admission=row.since_admission or 0.0,
            deadline_in=row.deadline_in,
        )


@dataclass(frozen=True)
class NextCall:
    """The run's next call, its command made (and sealed for the step) while the answer of
    the call before it is being settled (:meth:`Settler.conclude_chained`)."""

    step_id: str
    command: Sealed
    command_key: str
    deadline_seconds: int


@dataclass(frozen=True)
class Chained:
    """The run's next call, leased to this dispatcher and prepared by the statement that
    settled the call before it: to be sent as after any prepare."""

    claimed: Claimed
    prepared: Prepared


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
        self.calls_chained = 0
        """Calls prepared by the statement that settled the call before them, instead of
        being claimed."""

    async def _report_lost(self, conn: asyncpg.Connection, claimed: Claimed) -> None:
        """Say in one line why a lease could not be used; nothing is written either way."""
        epoch = await self.store.queries.dispatcher_hold_epoch(conn)
        if claimed.lease_epoch is not None and epoch != claimed.lease_epoch:
            self._report(claimed, Transition.RESTORE_HELD)
        else:
            self._report(claimed, Transition.LEASE_LOST)

    @staticmethod
    def _report(claimed: Claimed, outcome: Transition) -> None:
        if outcome is Transition.RESTORE_HELD:
            # A restore-hold raised the epoch: whatever this execution learnt belongs to
            # before the hold, and the operator's review of the snapshot decides the step.
            log.warning(
                "restore.lease-incompatible: step %s of run %s was leased before the current "
                "restore hold; nothing is recorded for it",
                claimed.step_id,
                claimed.run_id,
            )
        elif outcome is Transition.LEASE_LOST:
            log.warning(
                "step %s of run %s: the lease was lost; nothing is recorded for it",
                claimed.step_id,
                claimed.run_id,
            )
        else:
            log.warning(
                "step %s of run %s: it has ended already; nothing is recorded for it",
                claimed.step_id,
                claimed.run_id,
            )

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, tried again while the database is away or the attempt lost a
        deadlock (rolled back as a whole: an operator action locked the run first, say)."""
        for delay in (*STORE_RETRY_DELAYS, None):
            try:
                return await attempt()
            except CoordinatorError as exc:
                if exc.code != Code.SERVICE_UNAVAILABLE or delay is None:
                    raise
            except _TRANSIENT:
                if delay is None:
                    raise
            await self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _transition(
        self,
        claimed: Claimed,
        write: Callable[[asyncpg.Connection], Awaitable[R | None]],
    ) -> tuple[Transition, R]:
        """One transition function's call (``write``), in a statement of its own, retried
        while the database is away; answers its outcome and row. An outcome that moved
        nothing is logged here, in one line that says why."""

        async def attempt() -> tuple[Transition, R]:
            async with statement(self.store) as conn:
                row = await write(conn)
                assert row is not None  # a transition function answers one row
                outcome = Transition(row.outcome)
                if outcome is Transition.LEASE_LOST:
                    await self._report_lost(conn, claimed)
            return outcome, row

        outcome, row = await self._retrying(attempt)
        if not outcome.moved and outcome is not Transition.LEASE_LOST:
            self._report(claimed, outcome)
        return outcome, row

    async def conclude(self, claimed: Claimed, settlement: Settlement) -> Transition:
        """End the step as ``settlement`` says, with all that follows (``step_settle``),
        in one statement; retried while the database is away. Answers what it did."""
        settle = settlement.arguments(
            self.keyring, self.store.runtime.config.namespace, claimed.run_id
        )

        async def write(conn: asyncpg.Connection) -> DispatcherStepSettleRow | None:
            return await self.store.queries.dispatcher_step_settle(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                settle=settle,
            )

        outcome, _ = await self._transition(claimed, write)
        self._concluded(claimed, settlement, outcome)
        return outcome

    def _concluded(self, claimed: Claimed, settlement: Settlement, outcome: Transition) -> None:
        if not outcome.moved:
            return
        if outcome is Transition.WRITTEN and settlement.way is not None:
            self.steps_done_inline += len(settlement.way.passed)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "run %s step %s: %s",
                claimed.run_id,
                claimed.step_id,
                settlement.describe(outcome),
            )

    async def conclude_chained(
        self, claimed: Claimed, settlement: Settlement, following: NextCall, lease_seconds: float
    ) -> Chained | None:
        """:meth:`conclude`, and when the run goes on to ``following`` (its next step, a
        call), lease that call for ``lease_seconds`` and prepare it with its command, in the
        same statement (``step_settle`` given the call's arguments); retried while the
        database is away. Answers the prepared call, to be sent next, or ``None`` when the
        settle did not go on to it (a cancel, the execution hold, a lost lease ...): the call
        is then as :meth:`conclude` would have left it, due for a claim.

        A retry that finds the step settled already means an earlier attempt committed
        without its answer arriving. Whatever that attempt prepared was never sent: it is
        given back, ready again with its command and key, for a claim. (The call's lease can
        only be this one's: the step before it was leased to this dispatcher until it was
        settled, and a lease outlasts the retries.)
        """
        settle = settlement.arguments(
            self.keyring, self.store.runtime.config.namespace, claimed.run_id
        )
        sealed = following.command
        attempts = 0

        async def write(conn: asyncpg.Connection) -> DispatcherStepSettleChainRow | None:
            nonlocal attempts
            attempts += 1
            return await self.store.queries.dispatcher_step_settle_chain(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                settle=settle,
                lease_seconds=lease_seconds,
                key_version=sealed.key_version,
                nonce=sealed.nonce,
                ciphertext=sealed.ciphertext,
                command_key=following.command_key,
                deadline_seconds=following.deadline_seconds,
            )

        outcome, row = await self._transition(claimed, write)
        self._concluded(claimed, settlement, outcome)
        way = settlement.way
        assert way is not None and way.next_step == following.step_id
        chained = Claimed(
            run_id=claimed.run_id,
            step_id=following.step_id,
            seq=claimed.seq + len(way.passed) + 1,
            step_type="call",
            state=StepState.PREPARED,
            attempts=1,
            command_payload_id=None,
            command_key=following.command_key,
            past_deadline=False,
            lease_epoch=row.lease_epoch,
            now=row.now,
        )
        if not row.chained:
            if outcome is Transition.ALREADY_SETTLED and attempts > 1:
                await self.unprepare(chained)
            return None
        self.calls_chained += 1
        log.info(
            "run %s step %s: prepared as %s settled",
            claimed.run_id,
            chained.step_id,
            claimed.step_id,
        )
        prepared = Prepared(
            attempts=1, first_of_run=False, since_admission=0.0, deadline_in=row.deadline_in
        )
        return Chained(chained, prepared)

    @property
    def retrying_after_seconds(self) -> int:
        """``deployment.attention.retryingAfterSeconds``: how long a call's series of
        retryable answers may last before its run asks for attention."""
        return self.store.runtime.config.deployment.attention.retrying_after_seconds

    async def retry(
        self,
        claimed: Claimed,
        delay: float,
        cause: SentNothing | None = None,
        *,
        met: RetryCause,
        status: int | None = None,
    ) -> Transition:
        """The step was definitely not processed: ready again in ``delay`` seconds with the
        same command and key (``step_retry``), in one statement; retried while the database
        is away. Answers what it did.

        ``cause`` is why nothing left when an operator must see it (``tls-refused``): the
        step shows it and the run asks for attention until the step prepares again or ends.
        ``met`` is what the attempt met, with the product's ``status`` when it answered: the
        step shows both until it prepares again, and the run's ``updatedAt`` moves. Once the
        step's series of retryable answers has lasted :attr:`retrying_after_seconds`, a step
        without a ``cause`` takes the cause ``retrying`` and its run asks for attention.
        An abandoned step ends cancelled instead, and one whose deadline the retry would
        miss fails the run ``deadline-exceeded``.
        """

        async def write(conn: asyncpg.Connection) -> DispatcherStepRetryRow | None:
            return await self.store.queries.dispatcher_step_retry(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                delay=delay,
                cause=cause,
                retry_cause=RetryCause(met),
                retry_status=status,
                attention_after=float(self.retrying_after_seconds),
            )

        outcome, row = await self._transition(claimed, write)
        if not outcome.moved:
            return outcome
        run_state, due_at = row.run_state, row.due_at
        if due_at is None:
            what = (
                "the retry would miss its deadline: failed, the run failed deadline-exceeded"
                if run_state == "failed"
                else f"cancelled ({outcome}): nothing follows"
            )
        elif cause is None:
            what = f"not processed ({met}); ready again in {delay:.0f} s"
        else:
            what = f"sent nothing ({cause}); ready again in {delay:.0f} s"
        log.info("run %s step %s: %s", claimed.run_id, claimed.step_id, what)
        return outcome

    async def wait(
        self, claimed: Claimed, due_at: datetime | None, timeout_at: datetime | None = None
    ) -> Transition:
        """The step waits until ``due_at`` (or an outside event), timing out at
        ``timeout_at``; the run is waiting (``step_wait``), in one statement. An abandoned
        step waits for nothing: it ends cancelled. Answers what it did."""

        async def write(conn: asyncpg.Connection) -> DispatcherStepWaitRow | None:
            return await self.store.queries.dispatcher_step_wait(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                due_at=due_at,
                timeout_at=timeout_at,
            )

        outcome, _ = await self._transition(claimed, write)
        if outcome.moved:
            what = "waiting" if outcome is Transition.WRITTEN else f"cancelled ({outcome})"
            log.info("run %s step %s: %s", claimed.run_id, claimed.step_id, what)
        return outcome

    async def plan_check(
        self,
        claimed: Claimed,
        *,
        match: bytes,
        timeout_seconds: float | None,
        delay: float,
        entering: bool,
    ) -> Transition:
        """Before a read of a wait-for step's result (``step_plan_check``), in one
        statement: the step waits, found by the digest ``match``, times out
        ``timeout_seconds`` from now (kept when one is set already), is checked again
        ``delay`` seconds from now, and keeps its lease for the read; with ``entering`` the
        run is waiting. An abandoned step ends cancelled instead. Answers what it did: the
        read goes ahead only on ``written``."""

        async def write(conn: asyncpg.Connection) -> WaitsPlanCheckRow | None:
            return await self.store.queries.waits_plan_check(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                match=match,
                timeout_seconds=timeout_seconds,
                delay=delay,
                entering=entering,
            )

        outcome, _ = await self._transition(claimed, write)
        if outcome is Transition.WRITTEN and entering:
            log.info("run %s step %s: waiting for a result", claimed.run_id, claimed.step_id)
        elif outcome.moved and outcome is not Transition.WRITTEN:
            log.info("run %s step %s: cancelled (%s)", claimed.run_id, claimed.step_id, outcome)
        return outcome

    async def record_read(
        self,
        claimed: Claimed,
        *,
        ends: Settlement | None,
        on_timeout: Settlement | None,
        attention: bool | None,
    ) -> Transition:
        """Record a read of a wait-for step's result (``step_record_read``), in one
        statement: ``ends`` is how the step completes when the read brought a decision;
        ``on_timeout`` how it completes when its timeout has come by the database's clock
        (``None``: the step has no onTimeout path). Otherwise the check is counted, the
        step is due at its next check and gives up its lease, and the run's attention is set
        to ``attention`` (``None`` leaves it). An abandoned step ends cancelled instead.
        Answers what it did."""
        completing = ends or on_timeout
        if completing is not None and (
            completing.state != StepState.COMPLETED
            or completing.effect is not None
            or completing.failure is not None
        ):
            raise ValueError("a read ends its wait by completing the step, nothing else")
        # Without a way to end, the function's settle value is empty and unused.
        settle = (completing or Settlement(StepState.COMPLETED)).arguments(
            self.keyring, self.store.runtime.config.namespace, claimed.run_id
        )

        async def write(conn: asyncpg.Connection) -> WaitsRecordReadRow | None:
            return await self.store.queries.waits_record_read(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                ends=ends is not None,
                may_time_out=ends is None and on_timeout is not None,
                attention=attention,
                settle=settle,
            )

        outcome, row = await self._transition(claimed, write)
        if not outcome.moved:
            return outcome
        if row.ended and completing is not None:
            if outcome is Transition.WRITTEN and completing.way is not None:
                self.steps_done_inline += len(completing.way.passed)
            what = completing.describe(outcome)
        elif outcome is Transition.WRITTEN:
            what = "checked: no decision yet, waiting for the next check"
        else:
            what = f"cancelled ({outcome}): nothing follows"
        log.info("run %s step %s: %s", claimed.run_id, claimed.step_id, what)
        return outcome

    async def uncertain(
        self, claimed: Claimed, cause: str, cause_status: int | None = None
    ) -> Transition:
        """The step's command may have been processed: it waits for an operator and its run
        is held (``step_make_uncertain``), in one statement; retried while the database is
        away. Answers what it did.

        ``cause`` says how the answer went missing (one of :data:`UNCERTAIN_CAUSES`);
        ``cause_status`` is the product's status, given with ``status-5xx`` only.
        """
        if cause not in UNCERTAIN_CAUSES:
            raise ValueError(f"not a cause of an uncertain step: {cause!r}")
        if cause_status is not None and cause != "status-5xx":
            raise ValueError("a cause status goes with status-5xx only")

        async def write(conn: asyncpg.Connection) -> DispatcherStepUncertainRow | None:
            return await self.store.queries.dispatcher_step_uncertain(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                cause=cause,
                cause_status=cause_status,
            )

        outcome, row = await self._transition(claimed, write)
        if not outcome.moved:
            return outcome
        run_state = row.run_state
        if outcome is Transition.RUN_ENDED:
            what = "the run had ended"
        elif run_state == "cancelled":
            what = "the cancelled run ended: nothing of it is live"
        else:
            what = "the run is held for an operator"
        log.info("run %s step %s: uncertain (%s); %s", claimed.run_id, claimed.step_id, cause, what)
        return outcome

    async def prepare(
        self,
        claimed: Claimed,
        *,
        command: Any,
        command_payload_id: int | None,
        command_key: str,
        deadline_seconds: int,
    ) -> Prepared | None:
        """Commit the command (sealed) and its key as prepared, before it is sent
        (``step_prepare``): the stored command ``command_payload_id`` of an earlier attempt,
        or else ``command``, sealed and stored by the same call.

        ``None`` when nothing may be sent, with what that calls for already written: the
        lease was lost (nothing written), the execution hold is set (the step is given
        back, ready), or a cancel abandoned the step (it ends cancelled — so a cancel
        committed first stops the command, and one committed later finds the step prepared
        and leased, and leaves it to be settled).
        """
        sealed = None
        if command_payload_id is None:
            namespace = self.store.runtime.config.namespace
            sealed = seal_json(self.keyring, namespace, claimed.run_id, "command", command)
        async with statement(self.store) as conn:
            row = await self.store.queries.dispatcher_step_prepare(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                payload_id=command_payload_id,
                key_version=None if sealed is None else sealed.key_version,
                nonce=None if sealed is None else sealed.nonce,
                ciphertext=None if sealed is None else sealed.ciphertext,
                command_key=command_key,
                deadline_seconds=deadline_seconds,
            )
            assert row is not None  # step_prepare answers one row
            outcome = Transition(row.outcome)
            if outcome is Transition.LEASE_LOST:
                await self._report_lost(conn, claimed)
        if outcome is Transition.WRITTEN:
            log.info("run %s step %s: prepared", claimed.run_id, claimed.step_id)
            return Prepared.from_row(row)
        if outcome.moved:
            log.info("run %s step %s: nothing sent (%s)", claimed.run_id, claimed.step_id, outcome)
        elif outcome is not Transition.LEASE_LOST:
            self._report(claimed, outcome)
        return None

    async def unprepare(self, claimed: Claimed, delay: float = 0.0) -> None:
        """Give the step back, ready again: this dispatcher knows it sent nothing."""
        async with statement(self.store) as conn:
            await self.store.queries.dispatcher_step_unprepare(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                delay=delay,
            )
        log.info("run %s step %s: nothing sent; ready again", claimed.run_id, claimed.step_id)

    async def sent_nothing(
        self, claimed: Claimed, cause: SentNothing, *, delay: float, deadline_seconds: int
    ) -> None:
        """Nothing was sent for the step, for ``cause``, which only an operator can mend: the
        issuer refused its access token (``token-refused``) or failed TLS verification
        (``tls-refused``). The step is ready again in ``delay`` seconds (no later than its
        deadline) showing the cause, and the run asks for attention (§8.4) until the step
        prepares or ends. Like a retry, it records the cause as what this attempt met (the
        step's ``retry`` in inspection), counts it in the step's series of retryable answers
        and moves the run's ``updatedAt``. The first such attempt starts the
        ``deadline_seconds`` clock a first attempt would have started. Nothing is written
        when the lease is no longer ours."""
        async with statement(self.store) as conn:
            await self.store.queries.dispatcher_step_sent_nothing(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                cause=SentNothing(cause),
                delay=delay,
                deadline_seconds=deadline_seconds,
            )
        log.info(
            "run %s step %s: nothing sent (%s); ready again in %.0f s",
            claimed.run_id,
            claimed.step_id,
            cause,
            delay,
        )

    async def record_token_refusal(self, connection: str, error: str) -> None:
        """Remember for doctor that the issuer refused ``connection``'s token with the OAuth
        error code ``error`` (e.g. ``invalid_client``; never the issuer's description)."""
        async with statement(self.store) as conn:
            await self.store.queries.dispatcher_token_refusal_record(
                conn, connection=connection, error=error
            )

    async def clear_token_refusal(self, connection: str) -> None:
        """Forget ``connection``'s recorded refusal: the issuer granted it a token."""
        async with statement(self.store) as conn:
            await self.store.queries.dispatcher_token_refusal_clear(conn, connection=connection)

    async def release(self, claimed: Claimed, delay: float = 0.0) -> str | None:
        """Give the lease up without an outcome; a prepared step becomes uncertain.

        Answers the step's state afterwards, or ``None`` if the lease was not ours anymore.
        """
        async with statement(self.store) as conn:
            state = await self.store.queries.dispatcher_step_release(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                delay=delay,
            )
        if state is None:
            return None
        log.info("run %s step %s: released, now %s", claimed.run_id, claimed.step_id, state)
        return str(state)

    async def renew(self, claimed: Claimed, seconds: float) -> bool:
        """Extend the lease; False when it is no longer ours."""
        async with statement(self.store) as conn:
            renewed = await self.store.queries.dispatcher_lease_renew(
                conn,
                run_id=claimed.run_id,
                step_id=claimed.step_id,
                owner=self.owner,
                seconds=seconds,
            )
        return renewed is not None
