"""Run payloads as JSON, sealed at the edge of the store, and the scope expressions read.

Every stored payload (start input, prepared command, product response, kept output, wait
result) is JSON sealed with :mod:`core.crypto` under the active state key; the associated
data binds the namespace, the run and the payload's purpose, so a value copied to another
run or purpose no longer opens. The dispatcher (executing steps) and recovery (reconcile,
which maps a receipt as a live answer would be mapped) both read and write them through
here, so there is one encoding of sealed JSON.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime
from typing import Any, Final

import asyncpg

from core import clock
from core.canonical import canonical_json
from core.clock import timestamp
from core.codes import Code
from core.crypto import Keyring, Sealed, open_, seal
from core.errors import CoordinatorError
from core.runtime import Store
from core.workflow.expr import Scope

SCOPE_PURPOSES: Final = frozenset({"input", "output", "wait-result"})
"""The payload purposes expressions can read: the input and the values steps kept."""


def encode_json(value: Any) -> bytes:
    """The bytes a payload value is sealed as: RFC 8785 canonical JSON."""
    return canonical_json(value)


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
            Code.STATE_PAYLOAD_UNAUTHENTIC, f"the sealed {purpose} payload is not JSON"
        ) from None


def build_scope(
    keyring: Keyring,
    namespace: str,
    run_id: str,
    created_at: datetime,
    payloads: Iterable[Mapping[str, Any]],
) -> Scope:
    """What expressions of run ``run_id`` can read, from its sealed scope payload rows
    (``step_id``, ``purpose``, ``key_version``, ``nonce``, ``ciphertext``, in id order)."""
    run_input: Any = None
    kept: dict[str, dict[str, Any]] = {}
    for payload in payloads:
        value = open_json(keyring, namespace, run_id, str(payload["purpose"]), payload)
        if payload["step_id"] is None:
            run_input = value
        elif isinstance(value, dict):
            kept[str(payload["step_id"])] = value
    return Scope(
        input=run_input,
        steps=kept,
        run_id=run_id,
        run_started_at=timestamp(created_at),
    )


@contextlib.asynccontextmanager
async def transaction(store: Store) -> AsyncIterator[asyncpg.Connection]:
    """One pooled connection inside one transaction, on the (test) clock."""
    async with store.connection() as conn, conn.transaction():
        await clock.apply_to(conn)
        yield conn


@contextlib.asynccontextmanager
async def statement(store: Store) -> AsyncIterator[asyncpg.Connection]:
    """One pooled connection for exactly one statement.

    PostgreSQL runs a lone statement as its own transaction, so this saves the ``BEGIN`` and
    ``COMMIT`` round trips of :func:`transaction`. Under the test clock it still opens one:
    the fake ``now()`` is set for the current transaction only.
    """
    if clock.enabled():
        async with transaction(store) as conn:
            yield conn
    else:
        async with store.connection() as conn:
            yield conn
