"""The run documents of the HTTP API: status (CONTRACT §8.3) and inspection (§8.4).

Admission answers a start with the status document and recovery answers status, list and
inspection; both build them here from the same rows, so the two can never disagree about
a run's shape (:mod:`core.documents` carries each across gRPC). The rows these records
come from (``run_read`` and ``run_steps`` in
``core/db/queries/runs.sql``) carry no payload column: a document built here cannot leak an
input, a prepared command or a product response, because none ever reaches this module.

List cursors are opaque to clients; inside they are the ``(created_at, id)`` position of
the last run shown, which is the order lists walk.

The values about runs that more than one component checks live here too, once: the run
states, the list and retain limits, the start's idempotency key and its refusal in a
recovery-only instance, the operator's investigation reference and what a start answers.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg

from core.clock import timestamp
from core.codes import Code
from core.db.statements import (
    RecoveryOperatorActionsRow,
    RecoveryRunListRow,
    RunReadRow,
    RunStepsRow,
    Statements,
)
from core.errors import CoordinatorError
from core.states import RunState

RUN_STATES: Final = tuple(RunState)
"""Every state a run can be in (the status document's ``state``)."""

NEWEST: Final = "newest"
OLDEST: Final = "oldest"
LIST_ORDERS: Final = (NEWEST, OLDEST)
"""``GET /v1/runs?order=``: newest by creation (the default), or oldest first, by the time
attention began on a list of runs that need attention and by creation otherwise."""
STEP_NAME: Final = re.compile(r"[a-z][a-z0-9-]{0,62}")
"""What a step id looks like (core/workflow/parse.py ``NAME``), for the list's ``step``."""
ATTENTION_CAUSES: Final = (
    "answer-too-large",
    "connection-lost",
    "framing-violation",
    "lease-expired",
    "restore-snapshot",
    "retrying",
    "status-5xx",
    "timeout-after-send",
    "tls-refused",
    "token-refused",
    "unreadable-answer",
)
"""The causes a step that needs attention may show (``step.cause`` in schema.sql), for the
list's ``cause``."""
DEFAULT_LIST_LIMIT: Final = 20
"""Runs on one list page when the request names no ``limit``."""
MAX_LIST_LIMIT: Final = 100
"""The most runs one list page shows."""
MAX_RETAIN_LIMIT: Final = 100
"""The most runs one ``retain`` call erases."""
DEFAULT_BULK_LIMIT: Final = 100
"""Runs one bulk action acts on when the request names no ``limit``."""
MAX_BULK_LIMIT: Final = 1000
"""The most runs one bulk action acts on."""
VERDICT_WAIT_SECONDS: Final = 10.0
"""How long retry-same waits, at most, for the dispatcher's verdict on the resent command
before it answers ``pending`` (recovery waits; the gateway's deadline allows for it)."""

IDEMPOTENCY_KEY: Final = re.compile(r"[\x21-\x7e]{1,255}")
"""A start's ``Idempotency-Key``: 1–255 visible ASCII characters."""
REFERENCE: Final = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
"""An operator's investigation reference (``reason``, ``recoveryReference``)."""

WAIT_TYPES: Final = ("wait-until", "wait-for")

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_RUN_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A cursor's inner form: microseconds since the epoch, a dot, the run id.
_CURSOR: Final = re.compile(r"(-?[0-9]{1,20})\.([A-Za-z0-9_-]{1,64})")


def check_idempotency_key(key: str) -> None:
    """Refuse an idempotency key outside 1–255 visible ASCII characters."""
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise CoordinatorError(
            Code.REQUEST_INVALID, "Idempotency-Key: must be 1 to 255 visible ASCII characters"
        )


def refuse_recovery_only(recovery_only: bool) -> None:
    """Refuse a start, from the API or a signed event, in a recovery-only instance (CONTRACT
    §2.1): 409 ``admission.recovery-only``.

    Judged first, once per start in each process that takes starts: the gateway (a
    recovery-only instance runs no admission component for it to call) and admission (which
    may be run on its own with ``--recovery-only``).
    """
    if recovery_only:
        raise CoordinatorError(Code.ADMISSION_RECOVERY_ONLY, "this instance admits no runs")


# --------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class StartResult:
    """What a start answers (admission to the gateway, the gateway to the client)."""

    created: bool
    """True when this start created the run (HTTP 201); false when it found it again."""
    run_id: str
    """The run's id."""
    status: dict[str, Any]
    """The run's status document (§8.3)."""


@dataclass(frozen=True)
class RunRecord:
    """One run as the status document needs it."""

    id: str
    workflow_id: str
    workflow_version: str
    package_digest: str
    principal_iss: str
    principal_sub: str
    state: str
    outcome: str | None
    attention: bool
    cancelling: bool
    failure_kind: str | None
    failure_path: str | None
    failure_step: str | None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None

    @classmethod
    def from_row(cls, row: RunReadRow | RecoveryRunListRow) -> RunRecord:
        """A record from a ``run_read`` or ``recovery_run_list`` row (the same columns)."""
        return cls(
            id=row.id,
            workflow_id=row.workflow_id,
            workflow_version=row.workflow_version,
            package_digest=row.package_digest,
            principal_iss=row.principal_iss,
            principal_sub=row.principal_sub,
            state=row.state,
            outcome=row.outcome,
            attention=row.attention,
            cancelling=row.cancelling,
            failure_kind=row.failure_kind,
            failure_path=row.failure_path,
            failure_step=row.failure_step,
            created_at=row.created_at,
            updated_at=row.updated_at,
            ended_at=row.ended_at,
        )

    def status(self) -> dict[str, Any]:
        """The status document (§8.3); optional members appear only when they apply."""
        doc: dict[str, Any] = {
            "runId": self.id,
            "workflow": {
                "id": self.workflow_id,
                "version": self.workflow_version,
                "digest": self.package_digest,
            },
            "state": self.state,
        }
        if self.outcome is not None:
            doc["outcome"] = self.outcome
        doc["attention"] = self.attention
        # A cancel that follows an onCancel path leaves the state running/waiting until the
        # path ends; the flag is what tells a reader the run is on its way out.
        if self.cancelling and self.ended_at is None:
            doc["cancelling"] = True
        if self.failure_kind is not None:
            failure: dict[str, Any] = {"kind": self.failure_kind}
            if self.failure_path is not None:
                failure["failurePath"] = self.failure_path
            failure["step"] = self.failure_step
            doc["failure"] = failure
        doc["createdAt"] = timestamp(self.created_at)
        doc["updatedAt"] = timestamp(self.updated_at)
        if self.ended_at is not None:
            doc["endedAt"] = timestamp(self.ended_at)
        return doc


@dataclass(frozen=True)
class StepRecord:
    """One step a run reached, as inspection shows it."""

    step_id: str
    seq: int
    step_type: str
    state: str
    attempts: int
    effect: str | None
    due_at: datetime | None
    next_check_at: datetime | None
    timeout_at: datetime | None
    checks: int
    started_at: datetime
    ended_at: datetime | None

    @classmethod
    def from_row(cls, row: RunStepsRow) -> StepRecord:
        """A record from a ``run_steps`` row."""
        return cls(
            step_id=row.step_id,
            seq=row.seq,
            step_type=row.step_type,
            state=row.state,
            attempts=row.attempts,
            effect=row.effect,
            due_at=row.due_at,
            next_check_at=row.next_check_at,
            timeout_at=row.timeout_at,
            checks=row.checks,
            started_at=row.started_at,
            ended_at=row.ended_at,
        )

    def wait(self) -> dict[str, Any] | None:
        """The ``wait`` member of a timer or result wait; ``None`` for other steps."""
        if self.step_type not in WAIT_TYPES:
            return None
        wait: dict[str, Any] = {}
        if self.step_type == "wait-until":
            if self.due_at is not None:
                wait["dueAt"] = timestamp(self.due_at)
        else:
            next_check = self.next_check_at or self.due_at
            if next_check is not None:
                wait["nextCheckAt"] = timestamp(next_check)
        if self.timeout_at is not None:
            wait["timeoutAt"] = timestamp(self.timeout_at)
        wait["checks"] = self.checks
        return wait

    def document(self) -> dict[str, Any]:
        """One element of the inspection's ``steps``."""
        doc: dict[str, Any] = {
            "step": self.step_id,
            "type": self.step_type,
            "state": self.state,
            "attempts": self.attempts,
        }
        if self.effect is not None:
            doc["effect"] = self.effect
        wait = self.wait()
        if wait is not None:
            doc["wait"] = wait
        doc["startedAt"] = timestamp(self.started_at)
        if self.ended_at is not None:
            doc["endedAt"] = timestamp(self.ended_at)
        return doc


@dataclass(frozen=True)
class Holds:
    """The deployment's restore holds."""

    execution: bool
    admission: bool

    def document(self) -> dict[str, bool]:
        """``{"execution": …, "admission": …}``."""
        return {"execution": self.execution, "admission": self.admission}


@dataclass(frozen=True)
class OperatorActionRecord:
    """One operator action recorded against a run."""

    kind: str
    reason: str | None
    at: datetime

    @classmethod
    def from_row(cls, row: RecoveryOperatorActionsRow) -> OperatorActionRecord:
        """A record from a ``recovery_operator_actions`` row."""
        return cls(kind=row.kind, reason=row.reason, at=row.at)

    def document(self) -> dict[str, Any]:
        """``{"kind", "reason", "at"}``."""
        return {"kind": self.kind, "reason": self.reason, "at": timestamp(self.at)}


def inspection_of(
    run: RunRecord,
    steps: Sequence[StepRecord],
    holds: Holds,
    actions: Sequence[OperatorActionRecord],
) -> dict[str, Any]:
    """The inspection document (§8.4): the run's status, then its steps in the order the run
    reached them, the deployment's holds and the latest operator actions (newest first)."""
    doc = run.status()
    doc["steps"] = [step.document() for step in sorted(steps, key=lambda step: step.seq)]
    doc["holds"] = holds.document()
    doc["lastOperatorActions"] = [action.document() for action in actions]
    return doc


# ----------------------------------------------------------------------------------- reads


async def read_run(conn: asyncpg.Connection, queries: Statements, run_id: str) -> RunRecord | None:
    """The run ``run_id``, or ``None`` when there is none (or the id cannot be one)."""
    if not _RUN_ID.fullmatch(run_id):
        return None
    row = await queries.run_read(conn, run_id=run_id)
    return None if row is None else RunRecord.from_row(row)


async def read_steps(
    conn: asyncpg.Connection, queries: Statements, run_id: str
) -> list[StepRecord]:
    """The steps of ``run_id`` in the order the run reached them."""
    return [StepRecord.from_row(row) for row in await queries.run_steps(conn, run_id=run_id)]


# --------------------------------------------------------------------------------- cursors


@dataclass(frozen=True)
class Cursor:
    """A position in a list: strictly after ``(at, run_id)`` in the list's ``order``.

    ``at`` is the instant the order sorts by (the creation, or for the oldest-first
    attention list the time attention began). A newest-first cursor is written as it always
    was; an oldest-first one carries a mark, so a cursor is never read in the other order.
    """

    at: datetime
    run_id: str
    order: str = NEWEST

    def encode(self) -> str:
        """The opaque text handed to clients (URL-safe base64, no padding)."""
        micros = (self.at - _EPOCH) // timedelta(microseconds=1)
        mark = "" if self.order == NEWEST else "o"
        inner = f"{mark}{micros}.{self.run_id}".encode("ascii")
        return base64.urlsafe_b64encode(inner).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, text: str, order: str = NEWEST) -> Cursor:
        """Read a cursor this module issued for a list in ``order``; anything else is
        ``request.invalid``."""
        refused = CoordinatorError(Code.REQUEST_INVALID, "cursor: not a cursor this service issued")
        if not text or len(text) > 200 or not text.isascii():
            raise refused
        try:
            inner = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
        except (binascii.Error, ValueError):
            raise refused from None
        found = NEWEST
        if inner.startswith("o"):
            found, inner = OLDEST, inner[1:]
        match = _CURSOR.fullmatch(inner)
        if match is None:
            raise refused
        if found != order:
            raise CoordinatorError(
                Code.REQUEST_INVALID, f"cursor: belongs to a list in {found} order, not {order}"
            )
        try:
            at = _EPOCH + timedelta(microseconds=int(match.group(1)))
        except OverflowError:
            raise refused from None
        return cls(at=at, run_id=match.group(2), order=order)


__all__ = [
    "ATTENTION_CAUSES",
    "DEFAULT_BULK_LIMIT",
    "DEFAULT_LIST_LIMIT",
    "IDEMPOTENCY_KEY",
    "LIST_ORDERS",
    "MAX_BULK_LIMIT",
    "MAX_LIST_LIMIT",
    "MAX_RETAIN_LIMIT",
    "NEWEST",
    "OLDEST",
    "REFERENCE",
    "RUN_STATES",
    "STEP_NAME",
    "VERDICT_WAIT_SECONDS",
    "Cursor",
    "Holds",
    "OperatorActionRecord",
    "RunRecord",
    "StartResult",
    "StepRecord",
    "check_idempotency_key",
    "inspection_of",
    "read_run",
    "read_steps",
]
