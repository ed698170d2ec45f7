"""A run as its current step sees it, read outside the step's lock: the definition, the
values its expressions may read, and the binding and stored command a call or wait needs.

These rows do not change under a leased step (a cancel is the exception, and the step's
locked transaction decides that: ``Tx.abandoned``), so reading them in a short transaction of
their own before the step's work is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from core.bindings import Binding
from core.codes import Code
from core.crypto import Keyring
from core.errors import CoordinatorError
from core.payloads import build_scope, open_json
from core.runtime import Store
from core.workflow.expr import Scope
from core.workflow.model import Workflow
from core.workflow.stored import WorkflowCache


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


async def read_binding(
    conn: asyncpg.Connection, store: Store, run_id: str, connection: str
) -> Binding | None:
    """The binding run ``run_id`` recorded for ``connection``; ``None`` when it has none."""
    row = await conn.fetchrow(store.queries["dispatcher_binding_read"], run_id, connection)
    return None if row is None else Binding.from_row(row)


async def read_command(
    conn: asyncpg.Connection, store: Store, keyring: Keyring, run_id: str, payload_id: int
) -> Any:
    """The command an earlier attempt stored as payload ``payload_id``, opened."""
    row = await conn.fetchrow(store.queries["dispatcher_payload_read"], payload_id)
    if row is None or row["run_id"] != run_id or row["purpose"] != "command":
        raise CoordinatorError(
            Code.STATE_PAYLOAD_UNAUTHENTIC, "the step's command payload is missing"
        )
    return open_json(keyring, store.runtime.config.namespace, run_id, "command", row)
