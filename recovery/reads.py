"""What recovery reads for operators and clients: run owners, status, inspection, lists,
the doctor report (CONTRACT §8.3, §8.4, §8.6) and the store-wide metrics (§13).

Each function takes the recovery component's :class:`Store` and answers plain data; the
servicer turns it into protobuf. Authorization happened in the gateway: a list request
arrives with the workflows the caller's policy covers and, for a non-operator, the
principal whose runs it may see, and the SQL never shows anything outside that scope.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import asyncpg

from core import clock, derive
from core.bindings import run_conflicts
from core.clock import parse_offset_instant, timestamp
from core.codes import Code
from core.db import statements
from core.db.connect import serving_host
from core.db.statements import RecoveryRunEstimatesRow, RunStepsRow, Statements
from core.errors import CoordinatorError
from core.metrics import gauge, render
from core.runs import (
    ATTENTION_CAUSES,
    DEFAULT_LIST_LIMIT,
    LIST_ORDERS,
    MAX_LIST_LIMIT,
    NEWEST,
    OLDEST,
    RUN_STATES,
    STEP_NAME,
    Cursor,
    Holds,
    OperatorActionRecord,
    RunRecord,
    StepRecord,
    inspection_of,
    read_run,
)
from core.runtime import Store
from core.states import RunState, StepState

OPERATOR_ACTIONS_SHOWN: Final = 10


def _not_found() -> CoordinatorError:
    return CoordinatorError(Code.RUN_NOT_FOUND, "no such run")


@dataclass(frozen=True)
class Owner:
    """Who started a run, for the gateway's authorization."""

    workflow_id: str
    iss: str
    sub: str


async def run_owner(store: Store, run_id: str) -> Owner | None:
    """The owner of ``run_id``, or ``None`` when there is no such run."""
    async with store.connection() as conn:
        row = await store.queries.recovery_run_owner(conn, run_id=run_id)
    if row is None:
        return None
    return Owner(row.workflow_id, row.principal_iss, row.principal_sub)


async def status(store: Store, run_id: str) -> dict[str, Any]:
    """The status document of ``run_id`` (``run.not-found`` when absent)."""
    async with store.connection() as conn:
        run = await read_run(conn, store.queries, run_id)
    if run is None:
        raise _not_found()
    return run.status()


async def inspection(store: Store, run_id: str) -> dict[str, Any]:
    """The inspection document of ``run_id`` (``run.not-found`` when absent)."""
    q = store.queries
    async with (
        store.connection() as conn,
        conn.transaction(readonly=True, isolation="repeatable_read"),
    ):
        # One snapshot, so the steps shown belong to the run state shown.
        run = await read_run(conn, q, run_id)
        if run is None:
            raise _not_found()
        step_rows = await q.run_steps(conn, run_id=run_id)
        hold = await q.recovery_holds(conn)
        actions = await q.recovery_operator_actions(
            conn, run_id=run_id, limit=OPERATOR_ACTIONS_SHOWN
        )
        conflicts = await run_conflicts(conn, q, store.runtime.config, run_id)
    holds = (
        Holds(hold.execution_hold, hold.admission_hold) if hold is not None else Holds(False, False)
    )
    document = inspection_of(
        run,
        [StepRecord.from_row(row) for row in step_rows],
        holds,
        [OperatorActionRecord.from_row(row) for row in actions],
    )
    rows = {row.step_id: row for row in step_rows}
    document["steps"] = [_with_cause(step, rows.get(step["step"])) for step in document["steps"]]
    if conflicts:
        # Only a recovery-only instance serves while a live binding changed (§9.7).
        document["bindingConflict"] = True
        document["conflictingConnections"] = conflicts
    return document


def _with_cause(step: dict[str, Any], row: RunStepsRow | None) -> dict[str, Any]:
    """An inspection step with ``cause`` (and ``causeStatus``) after its effect, when the
    step records why its effect is unknown, why it sent nothing or that it has been retrying
    too long, and with ``retry`` before ``startedAt`` while it waits for its next automatic
    attempt (§8.4). Only codes, statuses and instants: never a URL, header, body or value."""
    if row is None:
        return step
    retry = retry_of(row)
    if row.cause is None and retry is None:
        return step
    shown: dict[str, Any] = {}
    for name, value in step.items():
        if name in ("wait", "startedAt") and row.cause is not None and "cause" not in shown:
            shown["cause"] = row.cause
            if row.cause_status is not None:
                shown["causeStatus"] = row.cause_status
        if name == "startedAt" and retry is not None:
            shown["retry"] = retry
        shown[name] = value
    return shown


def retry_of(row: RunStepsRow) -> dict[str, Any] | None:
    """The ``retry`` member of a ready call waiting for its next automatic attempt after a
    retryable answer: what the last attempt met (``lastCause``, with the product's
    ``lastStatus`` when it answered) and when, when the next one is due and the step's
    deadline. ``None`` for every other step."""
    if row.state != StepState.READY or row.retry_cause is None or row.retry_last_at is None:
        return None
    retry: dict[str, Any] = {"lastCause": row.retry_cause}
    if row.retry_status is not None:
        retry["lastStatus"] = row.retry_status
    retry["lastAttemptAt"] = timestamp(row.retry_last_at)
    if row.due_at is not None:
        retry["nextAttemptAt"] = timestamp(row.due_at)
    if row.deadline_at is not None:
        retry["deadlineAt"] = timestamp(row.deadline_at)
    return retry


# ----------------------------------------------------------------------------------- lists


@dataclass(frozen=True)
class ListFilter:
    """A checked list request."""

    workflows: tuple[str, ...]
    """The workflows shown: the caller's scope, narrowed to one when a workflow was asked."""
    attention: bool | None
    state: str | None
    principal: tuple[str, str] | None
    """Only runs of this ``(iss, sub)``; ``None`` for every principal."""
    limit: int
    cursor: Cursor | None
    order: str = NEWEST
    step: str | None = None
    """Only runs whose step of this name needs attention."""
    cause: str | None = None
    """Only runs with a step that needs attention for this cause."""
    updated_before: datetime | None = None
    id_prefix: str | None = None
    """A search: only runs whose id starts with this, by id, in one page; the filters
    above are then unset."""

    @property
    def needs_attention(self) -> bool:
        """Whether only runs that need attention can match (a step or cause filter is about
        the step that needs it)."""
        return self.attention is True or self.step is not None or self.cause is not None

    @classmethod
    def build(
        cls,
        *,
        workflows: Sequence[str],
        attention: str = "",
        state: str = "",
        workflow_id: str = "",
        limit: int = 0,
        cursor: str = "",
        principal: tuple[str, str] | None = None,
        order: str = "",
        step: str = "",
        cause: str = "",
        updated_before: str = "",
        run_id_prefix: str = "",
    ) -> ListFilter:
        """Check the query parameters; a bad one is ``request.invalid`` naming it."""
        if run_id_prefix:
            if not derive.is_run_id_prefix(run_id_prefix):
                raise CoordinatorError(
                    Code.REQUEST_INVALID,
                    "runIdPrefix: must be 4 to 36 characters of a run id, lowercase",
                )
            given = [
                name
                for name, value in (
                    ("attention", attention),
                    ("state", state),
                    ("cursor", cursor),
                    ("order", order if order == OLDEST else ""),
                    ("step", step),
                    ("cause", cause),
                    ("updatedBefore", updated_before),
                )
                if value
            ]
            if given:
                raise CoordinatorError(
                    Code.REQUEST_INVALID, f"{given[0]}: a search by run id takes no other filter"
                )
        if attention not in ("", "true", "false"):
            raise CoordinatorError(Code.REQUEST_INVALID, "attention: must be true or false")
        if state and state not in RUN_STATES:
            raise CoordinatorError(
                Code.REQUEST_INVALID, "state: must be one of " + ", ".join(RUN_STATES)
            )
        if limit == 0:
            limit = DEFAULT_LIST_LIMIT
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise CoordinatorError(Code.REQUEST_INVALID, f"limit: must be 1 to {MAX_LIST_LIMIT}")
        order = order or NEWEST
        if order not in LIST_ORDERS:
            raise CoordinatorError(Code.REQUEST_INVALID, "order: must be newest or oldest")
        if step and not STEP_NAME.fullmatch(step):
            raise CoordinatorError(Code.REQUEST_INVALID, "step: must be a step id")
        if cause and cause not in ATTENTION_CAUSES:
            raise CoordinatorError(
                Code.REQUEST_INVALID, "cause: must be one of " + ", ".join(ATTENTION_CAUSES)
            )
        before = None
        if updated_before:
            before = parse_offset_instant(updated_before)
            if before is None:
                raise CoordinatorError(
                    Code.REQUEST_INVALID, "updatedBefore: must be an RFC 3339 date-time"
                )
        scope = tuple(dict.fromkeys(workflows))
        if workflow_id:
            # Outside the caller's scope the answer is simply empty; the gateway already
            # refused a workflow the policy does not cover.
            scope = (workflow_id,) if workflow_id in scope else ()
        wants_attention = None if attention == "" else attention == "true"
        if wants_attention is False and (step or cause):
            # A step or a cause filter is about the step that needs attention.
            scope = ()
        return cls(
            workflows=scope,
            attention=wants_attention,
            state=state or None,
            principal=principal,
            limit=limit,
            cursor=Cursor.decode(cursor, order) if cursor else None,
            order=order,
            step=step or None,
            cause=cause or None,
            updated_before=before,
            id_prefix=run_id_prefix or None,
        )


def _by_id(wanted: ListFilter) -> dict[str, Any]:
    """The arguments a search by id and its count share: the scope and the prefix's range
    (recovery_run_list_by_id, recovery_run_count_by_id)."""
    assert wanted.id_prefix is not None
    iss, sub = wanted.principal if wanted.principal is not None else (None, None)
    id_from, id_below = derive.run_id_range(wanted.id_prefix)
    return {
        "workflow_ids": list(wanted.workflows),
        "principal_iss": iss,
        "principal_sub": sub,
        "id_from": id_from,
        "id_below": id_below,
        "id_prefix": wanted.id_prefix,
    }


async def _page(conn: asyncpg.Connection, q: Statements, wanted: ListFilter) -> list[Any]:
    """One more row than the page holds (it tells whether another page exists)."""
    iss, sub = wanted.principal if wanted.principal is not None else (None, None)
    after = wanted.cursor
    after_at = after.at if after else None
    after_run_id = after.run_id if after else None
    if wanted.id_prefix is not None:
        return list(await q.recovery_run_list_by_id(conn, **_by_id(wanted), limit=wanted.limit))
    if wanted.needs_attention:
        attention_list = (
            q.recovery_run_list_attention_oldest
            if wanted.order == OLDEST
            else q.recovery_run_list_attention
        )
        return list(
            await attention_list(
                conn,
                workflow_ids=list(wanted.workflows),
                state=wanted.state,
                principal_iss=iss,
                principal_sub=sub,
                updated_before=wanted.updated_before,
                step=wanted.step,
                cause=wanted.cause,
                after_at=after_at,
                after_run_id=after_run_id,
                limit=wanted.limit + 1,
            )
        )
    general = q.recovery_run_list_oldest if wanted.order == OLDEST else q.recovery_run_list
    return list(
        await general(
            conn,
            workflow_ids=list(wanted.workflows),
            attention=wanted.attention,
            state=wanted.state,
            principal_iss=iss,
            principal_sub=sub,
            updated_before=wanted.updated_before,
            after_at=after_at,
            after_run_id=after_run_id,
            limit=wanted.limit + 1,
        )
    )


async def _total(conn: asyncpg.Connection, q: Statements, wanted: ListFilter) -> tuple[int, bool]:
    """How many runs match over all pages: ``(count, False)`` up to
    :data:`COUNTED_EXACTLY`, ``(estimate, True)`` past it."""
    iss, sub = wanted.principal if wanted.principal is not None else (None, None)
    if wanted.id_prefix is not None:
        counted = await q.recovery_run_count_by_id(
            conn, **_by_id(wanted), counted_up_to=COUNTED_EXACTLY + 1
        )
    elif wanted.needs_attention:
        counted = await q.recovery_run_count_attention(
            conn,
            workflow_ids=list(wanted.workflows),
            state=wanted.state,
            principal_iss=iss,
            principal_sub=sub,
            updated_before=wanted.updated_before,
            step=wanted.step,
            cause=wanted.cause,
            counted_up_to=COUNTED_EXACTLY + 1,
        )
    else:
        counted = await q.recovery_run_count(
            conn,
            workflow_ids=list(wanted.workflows),
            attention=wanted.attention,
            state=wanted.state,
            principal_iss=iss,
            principal_sub=sub,
            updated_before=wanted.updated_before,
            counted_up_to=COUNTED_EXACTLY + 1,
        )
    count = int(counted or 0)
    if count <= COUNTED_EXACTLY:
        return count, False
    estimates = await q.recovery_run_estimates(conn)
    return max(count, _estimate(estimates, wanted)), True


def _estimate(estimates: RecoveryRunEstimatesRow | None, wanted: ListFilter) -> int:
    """The statistics' estimate of a list past the exact count: the runs that need
    attention, or of the asked state, or all runs. The other filters (workflow, principal,
    step, cause, updatedBefore) are not in the statistics: it can only be larger."""
    if estimates is None:
        return 0
    if wanted.id_prefix is not None:
        # Run ids are uniform: a prefix of n hex digits is shared by one run in 16**n.
        digits = sum(1 for char in wanted.id_prefix if char != "-")
        return round(float(estimates.rows) / math.pow(16.0, digits))
    if wanted.needs_attention:
        return round(estimates.attention_rows)
    if wanted.state is not None and estimates.states is not None:
        frequencies = estimates.frequencies or []
        frequency = dict(zip(estimates.states, frequencies, strict=True))
        return round(estimates.rows * frequency.get(wanted.state, 0.0))
    return round(estimates.rows)


def _entry(row: Any) -> dict[str, Any]:
    """A list entry: the run's status, and the step that needs attention while it does."""
    document = RunRecord.from_row(row).status()
    if row.attention and row.attention_step is not None and row.attention_since is not None:
        step: dict[str, Any] = {"step": row.attention_step}
        if row.attention_cause is not None:
            step["cause"] = row.attention_cause
            if row.attention_cause_status is not None:
                step["causeStatus"] = row.attention_cause_status
        step["since"] = timestamp(row.attention_since)
        document["attentionStep"] = step
    return document


async def list_runs(store: Store, wanted: ListFilter) -> dict[str, Any]:
    """``{"runs": [entry…], "nextCursor": text | None, "total": N, "totalIsEstimate": …}``
    in the order asked (CONTRACT §8.2)."""
    if not wanted.workflows:
        return {"runs": [], "nextCursor": None, "total": 0, "totalIsEstimate": False}
    async with store.connection() as conn, conn.transaction(readonly=True):
        # Which filters are given decides which index serves the page and the count: plan
        # them for their values, not once for any (a generic plan walks run_newest).
        await statements.session_plans_per_call(conn)
        rows = await _page(conn, store.queries, wanted)
        total, estimated = await _total(conn, store.queries, wanted)
    page = rows[: wanted.limit]
    next_cursor = None
    if len(rows) > wanted.limit:
        last = page[-1]
        by_attention = wanted.needs_attention and wanted.order == OLDEST
        at = last.attention_since if by_attention else last.created_at
        next_cursor = Cursor(at, last.id, wanted.order).encode()
    return {
        "runs": [_entry(row) for row in page],
        "nextCursor": next_cursor,
        "total": total,
        "totalIsEstimate": estimated,
    }


# ------------------------------------------------------------------------ doctor and metrics


COUNTED_EXACTLY: Final = 10_000
"""Runs per state are counted one by one up to this many; past it, the count is
PostgreSQL's estimate from the table's statistics (never less than this)."""


async def run_counts(conn: asyncpg.Connection, q: Statements) -> dict[str, int]:
    """Runs per state, exact up to :data:`COUNTED_EXACTLY` and estimated past it, so that
    doctor and the metrics cost the same at a million runs as at ten."""
    row = await q.recovery_run_state_counts(conn, counted_up_to=COUNTED_EXACTLY + 1)
    assert row is not None
    counts: dict[str, int] = {
        RunState.RUNNING: row.running,
        RunState.WAITING: row.waiting,
        RunState.HELD: row.held,
        RunState.SUCCEEDED: row.succeeded,
        RunState.FAILED: row.failed,
        RunState.CANCELLED: row.cancelled,
    }
    over = [state for state, count in counts.items() if count > COUNTED_EXACTLY]
    if over:
        estimates = await q.recovery_run_estimates(conn)
        frequency: dict[str, float] = {}
        # (Both arrays come from the same statistics slot: null together, or neither.)
        if (
            estimates is not None
            and estimates.states is not None
            and estimates.frequencies is not None
        ):
            frequency = dict(zip(estimates.states, estimates.frequencies, strict=True))
        rows = estimates.rows if estimates is not None else 0.0
        for state in over:
            counts[state] = max(counts[state], round(rows * frequency.get(state, 0.0)))
    return counts


async def doctor(store: Store, *, audit_ready: bool, recovery_only: bool) -> dict[str, Any]:
    """The doctor report (§8.6)."""
    q = store.queries
    async with store.connection() as conn, conn.transaction(readonly=True):
        await clock.apply_to(conn)  # dueJobs compares with SQL now()
        row = await q.recovery_doctor(conn)
        runs = await run_counts(conn, q)
        versions = [r.version for r in await q.state_key_versions_in_use(conn)]
        refusals = await q.recovery_token_refusals(conn)
        host = serving_host(conn)
    if row is None:
        raise CoordinatorError(Code.DEPLOYMENT_REFUSED, "the namespace records no deployment")
    # max() over schema_version: null only were no version recorded, which installing the
    # schema never leaves.
    schema_version = row.schema_version
    assert schema_version is not None
    activation = store.activation
    activation_ready = activation is not None and row.activation_serial == activation.serial
    served = activation.packages if activation is not None else {}
    return {
        "activationReady": activation_ready,
        "schemaVersion": schema_version,
        "databaseId": row.database_id,
        "workflows": [
            {"id": workflow_id, "digest": served[workflow_id].digest}
            for workflow_id in sorted(served)
        ],
        "holds": {"execution": row.execution_hold, "admission": row.admission_hold},
        "state": {
            "auditReady": audit_ready,
            "storeReady": store.available,
            # The host this report was read from (the URL may name several, §6.5).
            "storeHost": "" if host is None else str(host),
            "uncertain": row.uncertain,
            "held": runs[RunState.HELD],
            # Calls waiting for their next automatic attempt after a retryable answer.
            "retrying": row.retrying,
            "dueJobs": row.due_jobs,
            "waiting": runs[RunState.WAITING],
            "stateKeyVersionsInUse": versions,
        },
        # The connection's name and the issuer's error code only (§8.6).
        "tokenRefusals": [{"connection": r.connection, "error": r.error} for r in refusals],
        "mode": "recovery-only" if recovery_only else "ordinary",
    }


async def metrics_text(store: Store) -> str:
    """Prometheus text of the store-wide gauges; no workflow, run or principal label.

    While the database cannot be reached, ``coordinator_store_available`` is 0,
    ``coordinator_dispatch_jobs`` is NaN and the other counts are absent: a count we cannot
    read is never reported as a made-up zero.
    """
    q = store.queries
    try:
        async with store.connection() as conn, conn.transaction(readonly=True):
            await clock.apply_to(conn)
            row = await q.recovery_doctor(conn)
            counts = await run_counts(conn, q)
    except CoordinatorError:
        row = None
        counts = {}
    families = []
    if row is not None:
        families += [
            gauge(
                "coordinator_runs",
                "Runs by state.",
                [((state,), counts.get(state, 0)) for state in RUN_STATES],
                labels=("state",),
            ),
            gauge(
                "coordinator_uncertain_steps",
                "Call steps whose effect is unknown.",
                [((), row.uncertain)],
            ),
            gauge(
                "coordinator_retrying_steps",
                "Call steps waiting for their next automatic attempt after a retryable answer.",
                [((), row.retrying)],
            ),
            gauge(
                "coordinator_holds",
                "1 while the restore hold is set.",
                [
                    (("execution",), int(row.execution_hold)),
                    (("admission",), int(row.admission_hold)),
                ],
                labels=("hold",),
            ),
        ]
    # Always exposed: NaN (unknown) while the database cannot be read, never a made-up 0.
    families += [
        gauge(
            "coordinator_dispatch_jobs",
            "Due steps no dispatcher has claimed yet.",
            [((), row.due_jobs if row is not None else math.nan)],
        ),
        gauge(
            "coordinator_store_available",
            "1 while the database answers.",
            [((), 1 if row is not None else 0)],
        ),
    ]
    return render(families)
