"""What a step executor works with: settings, the claimed step, and the run's definition
with the values its expressions may read.

Sealing and opening payloads lives in :mod:`core.payloads` and stored definitions in
:mod:`core.workflow.stored`, which recovery shares; the names are re-exported here for the
step executors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from core.crypto import Keyring
from core.payloads import build_scope
from core.payloads import encode_json as encode_json
from core.payloads import open_json as open_json
from core.payloads import seal_json as seal_json
from core.payloads import started_at_text as started_at_text
from core.payloads import transaction as transaction
from core.runtime import Store
from core.workflow.expr import Scope
from core.workflow.model import Workflow
from core.workflow.stored import WorkflowCache as WorkflowCache


@dataclass(frozen=True)
class DispatchSettings:
    """How one dispatcher behaves; the defaults are the production values."""

    concurrency: int = 16
    """Steps worked on at once by this dispatcher."""
    lease_seconds: float = 30.0
    """Lease length (the contract allows at most 30 s); renewed every third of it."""
    idle_cap_seconds: float = 5.0
    """Longest idle wait without a notification before the dispatcher looks again."""
    test_clock_idle_cap_seconds: float = 0.25
    """The same while the test clock is on: moving a clock file sends no notification."""
    shutdown_budget_seconds: float = 7.0
    """How long a stop waits for answers to commands already sent."""
    retry_first_seconds: float = 1.0
    """First delay after a definite retryable answer."""
    retry_cap_seconds: float = 300.0
    """Longest delay between automatic retries."""
    error_retry_seconds: float = 5.0
    """Delay before a step whose execution failed unexpectedly is tried again."""
    sweep_limit: int = 100
    """Expired leases handled per look."""


@dataclass(frozen=True)
class Claimed:
    """A step this dispatcher holds the lease of (one ``dispatcher_claim`` row)."""

    run_id: str
    step_id: str
    seq: int
    step_type: str
    state: str
    attempts: int
    command_payload_id: int | None
    command_key: str | None
    past_deadline: bool
    lease_epoch: int | None = None
    """The hold epoch the lease was taken in (a restore-hold raises the current one)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Claimed:
        """The claimed step of a ``dispatcher_claim`` row."""
        payload_id = row["command_payload_id"]
        return cls(
            run_id=str(row["run_id"]),
            step_id=str(row["step_id"]),
            seq=int(row["seq"]),
            step_type=str(row["step_type"]),
            state=str(row["state"]),
            attempts=int(row["attempts"]),
            command_payload_id=None if payload_id is None else int(payload_id),
            command_key=None if row["command_key"] is None else str(row["command_key"]),
            past_deadline=bool(row["past_deadline"]),
            lease_epoch=None if row["lease_epoch"] is None else int(row["lease_epoch"]),
        )


@dataclass(frozen=True)
class RunView:
    """A run as its current step sees it."""

    id: str
    workflow: Workflow
    created_at: datetime
    cancelling: bool
    cancel_seq: int | None
    """The seq the run's onCancel path starts at, while it is being cancelled with one."""
    scope: Scope
    """What expressions can read: input, kept step values, run id and start instant."""

    def abandons(self, seq: int) -> bool:
        """Whether a cancel abandoned the step numbered ``seq``, as read with the run.

        A hint for skipping work early; the step's locked transaction decides
        (``Tx.abandoned``), since a cancel may commit after this run was read.
        """
        return self.cancelling and (self.cancel_seq is None or seq < self.cancel_seq)


async def load_run(
    conn: asyncpg.Connection,
    store: Store,
    keyring: Keyring,
    workflows: WorkflowCache,
    run_id: str,
) -> RunView | None:
    """The run ``run_id`` with its definition and decrypted scope; ``None`` when it ended."""
    queries = store.queries
    namespace = store.runtime.config.namespace
    row = await conn.fetchrow(queries["dispatcher_run_read"], run_id)
    if row is None or row["ended"]:
        return None
    workflow = await workflows.get(conn, queries, str(row["package_digest"]))
    created_at: datetime = row["created_at"]
    scope = build_scope(
        keyring,
        namespace,
        run_id,
        created_at,
        await conn.fetch(queries["dispatcher_scope_payloads"], run_id),
    )
    return RunView(
        id=run_id,
        workflow=workflow,
        created_at=created_at,
        cancelling=bool(row["cancelling"]),
        cancel_seq=None if row["cancel_seq"] is None else int(row["cancel_seq"]),
        scope=scope,
    )
