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
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

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


class SealedPayload(Protocol):
    """A stored sealed payload, what :func:`open_json` opens: a ``payload`` row's
    ``key_version``, ``nonce`` and ``ciphertext``. A query's row class that reads them
    (core/db/statements.py), :class:`core.crypto.Sealed` and :class:`ScopeValue` are ones."""

    @property
    def key_version(self) -> int: ...
    @property
    def nonce(self) -> bytes: ...
    @property
    def ciphertext(self) -> bytes: ...


class ScopePayload(SealedPayload, Protocol):
    """A sealed payload expressions can read, what :func:`build_scope` takes: with the
    ``step_id`` it belongs to (``None`` for the run's input) and its ``purpose``. A
    ``recovery_scope_payloads`` row is one; so is :class:`ScopeValue`."""

    @property
    def step_id(self) -> str | None: ...
    @property
    def purpose(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ScopeValue:
    """A scope payload taken from a row that carries several (the parallel arrays of
    ``dispatcher_claim``)."""

    step_id: str | None
    purpose: str
    key_version: int
    nonce: bytes
    ciphertext: bytes


def encode_json(value: Any) -> bytes:
    """The bytes a payload value is sealed as: RFC 8785 canonical JSON."""
    return canonical_json(value)


def seal_json(keyring: Keyring, namespace: str, run_id: str, purpose: str, value: Any) -> Sealed:
    """Seal a JSON value for ``run_id`` under the active state key."""
    return seal(keyring, namespace, run_id, purpose, encode_json(value))


def open_json(
    keyring: Keyring, namespace: str, run_id: str, purpose: str, payload: SealedPayload
) -> Any:
    """Open a sealed payload (``key_version``, ``nonce``, ``ciphertext``) as JSON."""
    sealed = Sealed(payload.key_version, payload.nonce, payload.ciphertext)
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
    payloads: Iterable[ScopePayload],
) -> Scope:
    """What expressions of run ``run_id`` can read, from its sealed scope payloads (in id
    order)."""
    run_input: Any = None
    kept: dict[str, dict[str, Any]] = {}
    for payload in payloads:
        value = open_json(keyring, namespace, run_id, payload.purpose, payload)
        if payload.step_id is None:
            run_input = value
        elif isinstance(value, dict):
            kept[payload.step_id] = value
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
