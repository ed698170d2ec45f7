"""What a step executor works with: settings, the claimed step, the run's definition and
the values its expressions may read — decrypted here, at the edge of the store.

Payloads are JSON, sealed with :mod:`core.crypto` under the active state key; the
associated data binds the namespace, the run and the payload's purpose, so a value copied
to another run or purpose no longer opens. Workflow definitions come from the ``package``
table (a run keeps the digest it was admitted under) and are parsed once per digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from core import clock
from core.crypto import Keyring, Sealed, open_, seal
from core.db.queries import Queries
from core.errors import CoordinatorError
from core.runtime import Store
from core.workflow.check import check_source
from core.workflow.expr import Scope
from core.workflow.model import Workflow


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
        )


@dataclass(frozen=True)
class RunView:
    """A run as its current step sees it."""

    id: str
    workflow: Workflow
    created_at: datetime
    cancelling: bool
    scope: Scope
    """What expressions can read: input, kept step values, run id and start instant."""


def started_at_text(created_at: datetime) -> str:
    """``${run.startedAt}``: RFC 3339 UTC with milliseconds (``2027-01-15T08:00:00.000Z``)."""
    return created_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_json(value: Any) -> bytes:
    """Canonical JSON bytes of a payload value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()


def seal_json(keyring: Keyring, namespace: str, run_id: str, purpose: str, value: Any) -> Sealed:
    """Seal a JSON value for ``run_id`` under the active state key."""
    return seal(keyring, namespace, run_id, purpose, encode_json(value))


def open_json(
    keyring: Keyring, namespace: str, run_id: str, purpose: str, row: Mapping[str, Any]
) -> Any:
    """Open a sealed payload row (``key_version``, ``nonce``, ``ciphertext``) as JSON."""
    sealed = Sealed(int(row["key_version"]), bytes(row["nonce"]), bytes(row["ciphertext"]))
    plaintext = open_(keyring, namespace, run_id, purpose, sealed)
    try:
        return json.loads(plaintext)
    except ValueError:
        raise CoordinatorError(
            "state.payload-unauthentic", f"the sealed {purpose} payload is not JSON"
        ) from None


class WorkflowCache:
    """Workflow definitions by package digest, each parsed once from the stored source."""

    def __init__(self) -> None:
        self._parsed: dict[str, Workflow] = {}
        self._lock = asyncio.Lock()

    async def get(self, conn: asyncpg.Connection, queries: Queries, digest: str) -> Workflow:
        """The definition of ``digest``, read from the ``package`` table the first time."""
        found = self._parsed.get(digest)
        if found is not None:
            return found
        async with self._lock:
            found = self._parsed.get(digest)
            if found is None:
                row = await conn.fetchrow(queries["package_read"], digest)
                if row is None:
                    raise CoordinatorError(
                        "deployment.refused", f"package {digest} is not stored in the database"
                    )
                # The source was checked when the package was built and when it was
                # applied; checking again here costs little once per digest and keeps a
                # tampered row from running half-understood.
                found = check_source(bytes(row["source"]))
                self._parsed[digest] = found
        return found


@contextlib.asynccontextmanager
async def transaction(store: Store) -> AsyncIterator[asyncpg.Connection]:
    """One pooled connection inside one transaction, on the (test) clock."""
    async with store.connection() as conn, conn.transaction():
        await clock.apply_to(conn)
        yield conn


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
    run_input: Any = None
    kept: dict[str, dict[str, Any]] = {}
    for payload in await conn.fetch(queries["dispatcher_scope_payloads"], run_id):
        value = open_json(keyring, namespace, run_id, str(payload["purpose"]), payload)
        if payload["step_id"] is None:
            run_input = value
        elif isinstance(value, dict):
            kept[str(payload["step_id"])] = value
    created_at: datetime = row["created_at"]
    scope = Scope(
        input=run_input,
        steps=kept,
        run_id=run_id,
        run_started_at=started_at_text(created_at),
    )
    return RunView(
        id=run_id,
        workflow=workflow,
        created_at=created_at,
        cancelling=bool(row["cancelling"]),
        scope=scope,
    )
