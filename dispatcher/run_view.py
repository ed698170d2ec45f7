"""A run as its current step sees it, read outside the step's lock: the definition, the
values its expressions may read, its bindings, and the stored command a call needs.

These rows do not change under a leased step (a cancel is the exception, and each
transition function decides that under the step's lock: ``step_leased``), so the claim
statement that leases the step reads them too (``dispatcher_claim``), and a claimed step
costs no read of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.bindings import Binding
from core.codes import Code
from core.crypto import Keyring
from core.errors import CoordinatorError
from core.payloads import ScopeValue, build_scope, open_json
from core.runtime import Store
from core.workflow.expr import Scope
from core.workflow.model import Workflow
from core.workflow.stored import WorkflowCache
from dispatcher.claim import Claimed


@dataclass(frozen=True)
class RunView:
    """A run as its current step sees it."""

    id: str
    workflow: Workflow
    created_at: datetime
    scope: Scope
    """What expressions can read: input, kept step values, run id and start instant."""
    bindings: Mapping[str, Binding]
    """The run's recorded binding of each connection, by connection name."""


@dataclass(frozen=True, slots=True)
class StoredCommand:
    """The sealed payload a claim named as its step's stored command, with the run and
    purpose it was stored under (a :class:`core.payloads.SealedPayload`)."""

    run_id: str
    purpose: str
    key_version: int
    nonce: bytes
    ciphertext: bytes


@dataclass(frozen=True)
class Loaded:
    """A claimed step's run with the step's stored command (read by the
    ``dispatcher_claim`` statement that leased the step)."""

    run: RunView
    stored_command: StoredCommand | None
    """The sealed payload the claim named as the stored command (``None``: none named, or
    no such payload)."""

    def command(self, keyring: Keyring, namespace: str) -> Any:
        """The stored command, opened; refused when the payload is missing or not this
        run's command."""
        stored = self.stored_command
        if stored is None or stored.run_id != self.run.id or stored.purpose != "command":
            raise CoordinatorError(
                Code.STATE_PAYLOAD_UNAUTHENTIC, "the step's command payload is missing"
            )
        return open_json(keyring, namespace, self.run.id, "command", stored)


async def load_claimed(
    claimed: Claimed,
    store: Store,
    keyring: Keyring,
    workflows: WorkflowCache,
) -> Loaded | None:
    """The run of ``claimed`` with its definition, decrypted scope, bindings and the stored
    command, from the claim row; ``None`` when the run ended. The definition is read
    from the database only the first time its package is seen."""
    row = claimed.context
    if row is None:
        raise CoordinatorError(Code.INTERNAL, "a claimed step came without its claim row")
    if row.ended:
        return None
    digest = row.package_digest
    workflow = workflows.cached(digest)
    if workflow is None:
        async with store.connection() as conn:
            workflow = await workflows.get(conn, store.queries, digest)
    run_id = claimed.run_id
    namespace = store.runtime.config.namespace
    created_at = row.created_at
    payloads = [
        ScopeValue(step_id, purpose, version, nonce, ciphertext)
        for step_id, purpose, version, nonce, ciphertext in zip(
            row.scope_step_ids or (),
            row.scope_purposes or (),
            row.scope_key_versions or (),
            row.scope_nonces or (),
            row.scope_ciphertexts or (),
            strict=True,
        )
    ]
    run = RunView(
        id=run_id,
        workflow=workflow,
        created_at=created_at,
        scope=build_scope(keyring, namespace, run_id, created_at, payloads),
        bindings={
            binding.connection: binding
            for binding in map(Binding.from_json, json.loads(row.bindings or "[]"))
        },
    )
    stored_command = None
    # The payload columns are null together: the claim's left join found no payload.
    if (
        row.command_run_id is not None
        and row.command_purpose is not None
        and row.command_key_version is not None
        and row.command_nonce is not None
        and row.command_ciphertext is not None
    ):
        stored_command = StoredCommand(
            run_id=row.command_run_id,
            purpose=row.command_purpose,
            key_version=row.command_key_version,
            nonce=row.command_nonce,
            ciphertext=row.command_ciphertext,
        )
    return Loaded(run, stored_command)
