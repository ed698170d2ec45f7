"""The step-locked transaction of one claimed step: every write a step executor makes.

:meth:`dispatcher.settle.Settler.locked` opens it once the step row (and its run's) is
locked under this dispatcher's lease. :class:`Tx` records the outcome — kept payloads, the
step's end, the run's new state and the next step made due — so that a crash leaves either
all of it or none of it (CONTRACT §9.3: an outcome is committed before the next step is
due). Executors write only through its methods, never with statements of their own.

A step abandoned by a cancel (``Tx.abandoned``: the run is cancelling and the step comes
before its onCancel path, or there is no such path) still gets its own outcome — an
accepted effect is kept, a refusal or an uncertain answer recorded — but :class:`Tx` never
makes another step due after it and never schedules it again: a retry or a wait ends it
``cancelled``. When the cancel has no onCancel path and the run is left with no live step,
the same transaction ends the run ``cancelled``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import asyncpg

from core.crypto import Keyring
from core.payloads import seal_json
from core.runtime import Store
from core.states import RunState, StepState
from core.workflow.model import Workflow, step_kind
from dispatcher.claim import Claimed

UNCERTAIN_CAUSES: Final = frozenset(
    {
        "timeout-after-send",
        "connection-lost",
        "status-5xx",
        "unreadable-answer",
        "framing-violation",
        "answer-too-large",
        "lease-expired",
    }
)
"""Why a call the dispatcher settles as uncertain has an unknown effect (CONTRACT §8.4;
``step.cause`` in schema.sql). ``restore-snapshot`` is recovery's and ``token-refused``
belongs to a step that sent nothing, so neither is one."""


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
    deadline_in: float | None = None
    """Seconds left until the step's deadline: no exchange may run past it."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Prepared:
        """The prepared command of a ``dispatcher_command_prepare``-shaped answer."""
        return cls(
            attempts=int(row["attempts"]),
            first_of_run=bool(row["first_of_run"]),
            since_admission=float(row["since_admission"] or 0.0),
            deadline_in=None if row["deadline_in"] is None else float(row["deadline_in"]),
        )


def sealed_columns(
    keyring: Keyring, namespace: str, run_id: str, values: Mapping[str, Any]
) -> tuple[list[str], list[int], list[bytes], list[bytes]]:
    """``values`` (purpose -> value) sealed, as the parallel arrays
    ``dispatcher_payloads_insert`` and ``dispatcher_fast_advance`` take."""
    sealed = [seal_json(keyring, namespace, run_id, p, v) for p, v in values.items()]
    return (
        list(values),
        [x.key_version for x in sealed],
        [x.nonce for x in sealed],
        [x.ciphertext for x in sealed],
    )


class Tx:
    """The open, step-locked transaction of one claimed step held by ``owner``."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        store: Store,
        keyring: Keyring,
        owner: str,
        claimed: Claimed,
        row: Mapping[str, Any],
    ) -> None:
        self._conn = conn
        self._queries = store.queries
        self._namespace = store.runtime.config.namespace
        self._keyring = keyring
        self._owner = owner
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
        self._changes: list[tuple[str, tuple[object, ...]]] = []

    def _changed(self, what: str, *args: object) -> None:
        """Note a transition for the info log, written once the transaction commits."""
        self._changes.append((what, args))

    def log_changes(self, log: logging.Logger) -> None:
        """Log each transition this (committed) transaction wrote, at INFO."""
        if self._changes and log.isEnabledFor(logging.INFO):
            for what, args in self._changes:
                log.info("run %s step %s: " + what, self._run_id, self._step_id, *args)

    @property
    def _run_id(self) -> str:
        return self.claimed.run_id

    @property
    def _step_id(self) -> str:
        return self.claimed.step_id

    async def keep(self, purpose: str, value: Any) -> int:
        """Seal and store a payload of this step; answers its id."""
        sealed = seal_json(self._keyring, self._namespace, self._run_id, purpose, value)
        payload_id = await self._conn.fetchval(
            self._queries["dispatcher_payload_insert"],
            self._run_id,
            self._step_id,
            purpose,
            sealed.key_version,
            sealed.nonce,
            sealed.ciphertext,
        )
        return int(payload_id)

    async def keep_all(self, values: Mapping[str, Any]) -> None:
        """Seal and store several payloads of this step (purpose -> value) in one statement."""
        columns = sealed_columns(self._keyring, self._namespace, self._run_id, values)
        await self._conn.execute(
            self._queries["dispatcher_payloads_insert"], self._run_id, self._step_id, *columns
        )

    # ------------------------------------------------------------------ every step

    async def end_step(self, state: str, effect: str | None = None) -> None:
        """End this step in ``state`` (completed, refused, failed, cancelled)."""
        await self._conn.execute(
            self._queries["dispatcher_step_end"], self._run_id, self._step_id, state, effect
        )
        self._changed("ended %s", state)
        await self._after_abandoned()

    async def cancel(self) -> None:
        """End this abandoned step ``cancelled``: whatever it was about to do is not done."""
        await self.end_step(StepState.CANCELLED)

    async def _after_abandoned(self) -> None:
        """End a run cancelled without an onCancel path once no step of it is live."""
        if not self.abandoned or self.cancel_seq is not None or self.run_ended:
            return
        live = await self._conn.fetchval(
            self._queries["dispatcher_run_live_steps"], self._run_id, self._step_id
        )
        if live:
            return
        await self._conn.fetchrow(
            self._queries["dispatcher_run_end"],
            self._run_id,
            RunState.CANCELLED,
            None,
            None,
            None,
            None,
        )
        self._changed("the cancelled run ended: nothing of it is live")
        self.run_ended = True

    async def next_step(self, workflow: Workflow, step_id: str) -> None:
        """Make ``step_id`` the run's next step, due now, and the run running."""
        if self.run_ended or self.abandoned:
            # An ended run goes nowhere; a cancelled one continues, if at all, on its
            # onCancel path, which recovery already made due.
            return
        kind = step_kind(workflow.step(step_id))
        await self._conn.fetchrow(
            self._queries["dispatcher_step_insert"], self._run_id, step_id, self.seq + 1, kind
        )
        self._changed("next step %s is due", step_id)
        await self._run_progress(RunState.RUNNING)

    async def advance(
        self,
        workflow: Workflow,
        next_step: str,
        *,
        state: str = StepState.COMPLETED,
        effect: str | None = None,
    ) -> None:
        """End this step and continue at ``next_step``."""
        if self.run_ended or self.abandoned:
            await self.end_step(state, effect)
            return
        # The common case in one statement: not abandoned, so nothing else to end.
        await self._conn.execute(
            self._queries["dispatcher_step_advance"],
            self._run_id,
            self._step_id,
            state,
            effect,
            next_step,
            self.seq + 1,
            step_kind(workflow.step(next_step)),
        )
        self._changed("%s; next step %s is due", state, next_step)

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
        if self.abandoned or self.run_ended:
            await self.end_step(step_state, effect)
            return
        await self._conn.fetchrow(
            self._queries["dispatcher_step_end_run"],
            self._run_id,
            self._step_id,
            step_state,
            effect,
            run_state,
            outcome,
            None if failure is None else failure.kind,
            None if failure is None else failure.path,
        )
        self._changed("%s; the run %s (outcome %s)", step_state, run_state, outcome)

    async def retry(self, delay: float) -> bool:
        """Due again in ``delay`` seconds; False (nothing written) if that misses the deadline.

        An abandoned step is never tried again: it ends cancelled (True: nothing more to do).
        """
        if self.abandoned:
            await self.cancel()
            return True
        if self.deadline_at is not None and (self.deadline_at - self.now).total_seconds() <= delay:
            return False
        await self._conn.fetchrow(
            self._queries["dispatcher_step_retry"], self._run_id, self._step_id, delay
        )
        self._changed("ready again in %.0f s", delay)
        return True

    async def wait(self, due_at: datetime | None, timeout_at: datetime | None = None) -> None:
        """The step waits until ``due_at`` (or an outside event); the run is waiting.

        An abandoned step does not wait for anything: it ends cancelled.
        """
        if self.abandoned:
            await self.cancel()
            return
        await self._conn.execute(
            self._queries["dispatcher_step_wait"], self._run_id, self._step_id, due_at, timeout_at
        )
        self._changed(StepState.WAITING)
        await self._run_progress(RunState.WAITING)

    async def _run_progress(self, state: str) -> None:
        await self._conn.execute(self._queries["dispatcher_run_progress"], self._run_id, state)

    # ------------------------------------------------------------------------ call

    async def prepare_command(
        self, payload_id: int | None, command: Any, command_key: str, deadline_seconds: int
    ) -> Prepared | None:
        """Commit the command and its key as prepared, counting the attempt: the stored
        command ``payload_id`` of an earlier attempt, or else ``command``, sealed and stored
        by the same statement. ``None`` when the lease, the hold epoch, the execution hold
        or a cancel forbids it (the caller rolls back, a newly stored command with it)."""
        if payload_id is not None:
            row = await self._conn.fetchrow(
                self._queries["dispatcher_command_prepare"],
                self._run_id,
                self._step_id,
                self._owner,
                payload_id,
                command_key,
                deadline_seconds,
            )
        else:
            sealed = seal_json(self._keyring, self._namespace, self._run_id, "command", command)
            row = await self._conn.fetchrow(
                self._queries["dispatcher_command_seal_prepare"],
                self._run_id,
                self._step_id,
                self._owner,
                sealed.key_version,
                sealed.nonce,
                sealed.ciphertext,
                command_key,
                deadline_seconds,
            )
        if row is None:
            return None
        self._changed(StepState.PREPARED)
        return Prepared.from_row(row)

    async def uncertain(self, cause: str, cause_status: int | None = None) -> None:
        """The command may have been processed: the step waits for an operator, run held.

        ``cause`` says how the answer went missing (one of :data:`UNCERTAIN_CAUSES`);
        ``cause_status`` is the product's status, given with ``status-5xx`` only.
        """
        if cause not in UNCERTAIN_CAUSES:
            raise ValueError(f"not a cause of an uncertain step: {cause!r}")
        if cause_status is not None and cause != "status-5xx":
            raise ValueError("a cause status goes with status-5xx only")
        await self._conn.execute(
            self._queries["dispatcher_step_uncertain"],
            self._run_id,
            self._step_id,
            cause,
            cause_status,
        )
        self._changed("uncertain (%s); the run is held for an operator", cause)
        await self._conn.execute(self._queries["dispatcher_run_hold"], self._run_id)
        # The run keeps its attention (the step stays unknown), even once it is cancelled.
        await self._after_abandoned()

    # -------------------------------------------------------------------- wait-for

    async def plan_check(self, match: bytes, timeout_at: datetime | None, delay: float) -> None:
        """Before a read: the step waits, found by the digest ``match``, times out at
        ``timeout_at`` (kept when one is set already) and is checked again ``delay``
        seconds from now (``waits_plan_check``)."""
        await self._conn.fetchrow(
            self._queries["waits_plan_check"],
            self._run_id,
            self._step_id,
            match,
            timeout_at,
            delay,
        )

    async def mark_run_waiting(self) -> None:
        """The run is waiting (a step has just started waiting for a result)."""
        self._changed("waiting for a result")
        await self._run_progress(RunState.WAITING)

    async def count_last_check(self) -> None:
        """Count the read that ends the wait; no further check is planned."""
        await self._conn.execute(self._queries["waits_last_check"], self._run_id, self._step_id)

    async def schedule_check(self) -> None:
        """Count a read that ended nothing; due at the planned check or the timeout, unleased."""
        await self._conn.fetchrow(self._queries["waits_schedule"], self._run_id, self._step_id)

    async def set_attention(self, attention: bool) -> None:
        """Set the waiting run's attention (``waits_run_attention`` says when it sticks)."""
        await self._conn.fetchrow(self._queries["waits_run_attention"], self._run_id, attention)
