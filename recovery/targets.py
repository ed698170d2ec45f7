"""What a run action acts on — the run and its held call — and what every action writes.

Reconcile, retry-same and cancel share the order of their first checks: the run must exist
(``run.not-found``), still hold its payloads where the action needs them
(``run.payload-erased``) and depend on connection settings the runtime file has not changed
(``binding.live-conflict``); only then does each action look at its own conditions. They
also share their last writes: the ``operator_action`` row, the resolution of the step's
restore snapshot rows, and the answer — the run's status document with ``result``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeVar

import asyncpg

from core import clock
from core.bindings import refuse_run_conflict
from core.codes import Code
from core.db.statements import RecoveryActionRunRow, RecoveryHeldStepRow
from core.derive import command_key
from core.errors import CoordinatorError
from core.payloads import transaction
from core.runs import read_run
from core.states import StepState
from core.workflow.catalogue import Operation, operation
from core.workflow.model import CallStep, Workflow
from recovery.env import RecoveryEnv

T = TypeVar("T")

UNCERTAIN: Final = (StepState.UNCERTAIN,)
RESENDABLE: Final = (StepState.UNCERTAIN, StepState.NOT_SENT)

# A run action's transaction can lose a deadlock against a dispatcher settling a step of
# the same run (the dispatcher locks step then run; cancel locks run then steps). Nothing
# of the loser was written, so it is simply tried again.
_TRANSIENT: Final = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
_ATTEMPTS: Final = 3


@dataclass(frozen=True)
class ActionRun:
    """A run as a run action sees it before deciding (one ``recovery_action_run`` row)."""

    id: str
    package_digest: str
    state: str
    created_at: datetime
    ended: bool
    erased: bool
    now: datetime
    execution_hold: bool

    @classmethod
    def from_row(cls, row: RecoveryActionRunRow) -> ActionRun:
        """The run of a ``recovery_action_run`` row."""
        return cls(
            id=row.id,
            package_digest=row.package_digest,
            state=row.state,
            created_at=row.created_at,
            ended=row.ended,
            erased=row.erased,
            now=row.now,
            execution_hold=bool(row.execution_hold),
        )


@dataclass(frozen=True)
class HeldStep:
    """The call step an operator acts on (one ``recovery_held_step`` row)."""

    step_id: str
    seq: int
    state: str
    attempts: int
    command_key: str | None
    command_payload_id: int | None
    started_at: datetime
    first_attempt_at: datetime | None
    deadline_at: datetime | None
    updated_at: datetime
    row_version: str
    """The row's version (xmin): the action's write names it and is refused when the step
    changed since it was read."""
    abandoned: bool
    """Whether a cancel abandoned the step when it was read (``step_abandoned``)."""

    @classmethod
    def from_row(cls, row: RecoveryHeldStepRow) -> HeldStep:
        """The step of a ``recovery_held_step`` row."""
        return cls(
            step_id=row.step_id,
            seq=row.seq,
            state=row.state,
            attempts=row.attempts,
            command_key=row.command_key,
            command_payload_id=row.command_payload_id,
            started_at=row.started_at,
            first_attempt_at=row.first_attempt_at,
            deadline_at=row.deadline_at,
            updated_at=row.updated_at,
            row_version=row.row_version,
            abandoned=row.abandoned,
        )

    def key(self, env: RecoveryEnv, run_id: str) -> str:
        """The command key every attempt of this step carries: the stored one, or for a step
        a restore-hold found leased but not prepared, the one its holder would have used."""
        return self.command_key or command_key(env.admission_key, run_id, self.step_id)


@dataclass(frozen=True)
class HeldCall:
    """A held step with its definition and the product operation it calls."""

    step: HeldStep
    definition: CallStep
    connection_type: str
    operation: Operation
    workflow: Workflow


async def read_action_run(
    conn: asyncpg.Connection, env: RecoveryEnv, run_id: str, *, refuse_erased: bool
) -> ActionRun:
    """The run, after the checks every run action makes first (see the module docstring)."""
    row = await env.store.queries.recovery_action_run(conn, run_id=run_id)
    if row is None:
        raise CoordinatorError(Code.RUN_NOT_FOUND, "no such run")
    run = ActionRun.from_row(row)
    if refuse_erased and run.erased:
        raise CoordinatorError(
            Code.RUN_PAYLOAD_ERASED,
            "retention erased this run's payloads; its calls cannot be acted on",
        )
    await refuse_run_conflict(conn, env.store.queries, env.store.runtime.config, run_id)
    return run


async def read_held_step(
    conn: asyncpg.Connection, env: RecoveryEnv, run_id: str, states: tuple[str, ...]
) -> HeldStep | None:
    """The run's newest step in one of ``states``, if there is one."""
    row = await env.store.queries.recovery_held_step(conn, run_id=run_id, states=list(states))
    return None if row is None else HeldStep.from_row(row)


async def held_call(
    conn: asyncpg.Connection, env: RecoveryEnv, run: ActionRun, step: HeldStep, refusal: Code
) -> HeldCall:
    """The definition and operation of ``step`` from the package the run was admitted under;
    ``refusal`` (the action's own 409 code) when the stored rows disagree with it."""
    workflow = await env.workflows.get(conn, env.store.queries, run.package_digest)
    definition = workflow.steps.get(step.step_id)
    if isinstance(definition, CallStep):
        kind = workflow.connections.get(definition.connection)
        op = operation(kind, definition.operation) if kind is not None else None
        if kind is not None and op is not None:
            return HeldCall(step, definition, kind, op, workflow)
    # Only call steps hold a command; anything else means the stored rows disagree with
    # the stored definition, which no operator action can mend and no retry later will
    # either: a refusal of the action, not a 503.
    raise CoordinatorError(refusal, f"step {step.step_id} is not a call of the run's workflow")


async def resolve_snapshot(
    conn: asyncpg.Connection,
    env: RecoveryEnv,
    run_id: str,
    step_id: str | None,
    resolution: str,
    *,
    overwrite: bool,
) -> None:
    """Record how the operator settled the run's snapshotted steps of the current epoch
    (``step_id`` ``None``: every step of the run)."""
    await env.store.queries.recovery_snapshot_resolve(
        conn, run_id=run_id, step_id=step_id, resolution=resolution, overwrite=overwrite
    )


async def log_action(
    conn: asyncpg.Connection, env: RecoveryEnv, run_id: str, kind: str, reason: str
) -> None:
    """The ``operator_action`` row that inspection lists."""
    await env.store.queries.recovery_operator_action_insert(
        conn, run_id=run_id, kind=kind, reason=reason
    )


async def answer(
    conn: asyncpg.Connection, env: RecoveryEnv, run_id: str, result: str
) -> dict[str, Any]:
    """The run's status document with ``result``."""
    run = await read_run(conn, env.store.queries, run_id)
    if run is None:  # pragma: no cover - run rows are never deleted
        raise CoordinatorError(Code.RUN_NOT_FOUND, "no such run")
    document = run.status()
    document["result"] = result
    return document


@contextlib.asynccontextmanager
async def looking(env: RecoveryEnv) -> AsyncIterator[asyncpg.Connection]:
    """One read-only transaction on the (test) clock: an action's first look."""
    async with env.store.connection() as conn, conn.transaction(readonly=True):
        await clock.apply_to(conn)
        yield conn


async def in_transaction(env: RecoveryEnv, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Run ``work`` in one transaction on the (test) clock, again if it lost a deadlock."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            async with transaction(env.store) as conn:
                return await work(conn)
        except _TRANSIENT:
            if attempt == _ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover
