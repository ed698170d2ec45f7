"""Live bindings: runs in flight keep the connection settings they were admitted under
(CONTRACT §9.7).

Admission records, per run and connection, the endpoint (``baseUrl``), the identity
(``authorization.clientId`` and the deployment's issuer), the ``scopes`` and the task
authority (``profile``, and Casework's ``producer``). A run that has not ended must go on
talking to the same product, as the same client, with the same authority: a runtime file
that changes any of those for a connection such a run uses is a *live binding conflict*.

- At startup, admission, the dispatcher and recovery compare every distinct binding of the
  runs that have not ended with the runtime file (:func:`verify_live_bindings`); a
  difference refuses startup with ``command.live-binding-conflict`` (printed as the raw
  code ``live-binding-conflict``), naming the connection and the settings, never a run.
  A ``--recovery-only`` instance starts anyway — it dispatches and admits nothing — and
  reports the conflicting connections in its log; inspection marks the affected runs
  (:func:`run_conflicts`).
- An action that would act on one run under changed settings is refused with 409
  ``binding.live-conflict`` (:func:`refuse_run_conflict`).

Scopes are compared as a set (their order means nothing). Not part of a binding, and so
free to change while runs wait: ``completion`` (and its token), ``resultCheckSeconds`` and
the token ``audience``, which the contract does not list among a binding's settings.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import asyncpg

from core.codes import Code
from core.config.model import RuntimeConfig
from core.db.statements import Statements
from core.errors import CoordinatorError
from core.runtime import Store

log = logging.getLogger("coordinator.bindings")


class BindingRow(Protocol):
    """A row that reads a ``binding`` row's settings: ``bindings_live``, ``bindings_of_run``
    and ``recovery_binding_read`` rows (core/db/statements.py)."""

    @property
    def connection(self) -> str: ...
    @property
    def connection_type(self) -> str: ...
    @property
    def base_url(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def issuer(self) -> str: ...
    @property
    def scopes(self) -> Sequence[str]: ...
    @property
    def profile(self) -> str: ...
    @property
    def producer(self) -> str | None: ...


@dataclass(frozen=True)
class Binding:
    """The settings of one connection that a run depends on, in runtime-file words: one
    ``binding`` row, or what the runtime file gives the connection now (:func:`configured`).

    The dispatcher builds a run's requests from it and recovery reads receipts with it; the
    startup check compares it with the runtime file.
    """

    connection: str
    type: str
    base_url: str
    client_id: str
    issuer: str
    scopes: frozenset[str]
    profile: str
    producer: str | None

    @classmethod
    def from_row(cls, row: BindingRow) -> Binding:
        """A binding from a row that reads a ``binding`` row (``connection`` too)."""
        return cls(
            connection=row.connection,
            type=row.connection_type,
            base_url=row.base_url,
            client_id=row.client_id,
            issuer=row.issuer,
            scopes=frozenset(row.scopes),
            profile=row.profile,
            producer=row.producer,
        )

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> Binding:
        """A binding from a JSON object of a ``binding`` row's columns (the ``bindings``
        array ``dispatcher_claim`` answers)."""
        producer = entry["producer"]
        return cls(
            connection=str(entry["connection"]),
            type=str(entry["connection_type"]),
            base_url=str(entry["base_url"]),
            client_id=str(entry["client_id"]),
            issuer=str(entry["issuer"]),
            scopes=frozenset(entry["scopes"]),
            profile=str(entry["profile"]),
            producer=None if producer is None else str(producer),
        )

    def setting(self, name: str) -> str | None:
        """A setting a request takes from the connection, by its runtime-file key
        (``producer``, ``profile``, ``baseUrl``)."""
        return {"producer": self.producer, "profile": self.profile, "baseUrl": self.base_url}.get(
            name
        )


# The runtime-file words of each compared setting, in the order a refusal lists them.
_SETTINGS: Final = (
    ("type", "type"),
    ("base_url", "baseUrl"),
    ("client_id", "authorization.clientId"),
    ("issuer", "deployment.authentication.issuer"),
    ("scopes", "authorization.scopes"),
    ("profile", "profile"),
    ("producer", "producer"),
)


def configured(config: RuntimeConfig, connection: str) -> Binding | None:
    """The binding the runtime file gives ``connection`` now; ``None`` when it lacks it."""
    settings = config.connections.get(connection)
    if settings is None:
        return None
    return Binding(
        connection=connection,
        type=settings.type,
        base_url=settings.base_url,
        client_id=settings.authorization.client_id,
        issuer=config.deployment.authentication.issuer,
        scopes=frozenset(settings.authorization.scopes),
        profile=settings.profile,
        producer=settings.producer,
    )


def differences(config: RuntimeConfig, recorded: Binding) -> tuple[str, ...]:
    """The settings of the recorded connection that the runtime file now gives otherwise
    (empty when none differ)."""
    current = configured(config, recorded.connection)
    if current is None:
        return ("the connection itself (it is no longer in the runtime file)",)
    return tuple(
        words
        for attribute, words in _SETTINGS
        if getattr(current, attribute) != getattr(recorded, attribute)
    )


@dataclass(frozen=True)
class Conflict:
    """One connection whose runtime-file settings differ from what live runs recorded."""

    connection: str
    settings: tuple[str, ...]
    """The differing settings, in runtime-file words."""

    def describe(self) -> str:
        """``connection 'review': baseUrl, producer`` — no run data."""
        return f"connection '{self.connection}': {', '.join(self.settings)}"


def conflicts_in(config: RuntimeConfig, rows: Iterable[BindingRow]) -> list[Conflict]:
    """The conflicts among recorded binding rows."""
    found: dict[str, list[str]] = {}
    for row in rows:
        recorded = Binding.from_row(row)
        for words in differences(config, recorded):
            listed = found.setdefault(recorded.connection, [])
            if words not in listed:
                listed.append(words)
    return [Conflict(name, tuple(found[name])) for name in sorted(found)]


async def live_conflicts(
    conn: asyncpg.Connection, queries: Statements, config: RuntimeConfig
) -> list[Conflict]:
    """Every connection whose settings differ for at least one run that has not ended."""
    return conflicts_in(config, await queries.bindings_live(conn))


async def verify_live_bindings(store: Store, *, refuse: bool = True) -> list[Conflict]:
    """The startup check: refuse (``command.live-binding-conflict``) when a live run's
    binding differs from the runtime file; with ``refuse=False`` (a recovery-only
    instance) log the conflicts and answer them instead."""
    async with store.connection() as conn:
        found = await live_conflicts(conn, store.queries, store.runtime.config)
    if found and refuse:
        listed = "; ".join(conflict.describe() for conflict in found)
        raise CoordinatorError(
            Code.LIVE_BINDING_CONFLICT,
            f"{listed} changed while runs that have not ended depend on them; restore the "
            "earlier settings, or investigate with --recovery-only",
        )
    for conflict in found:
        log.warning(
            "live binding conflict on %s: affected runs show it in their inspection",
            conflict.describe(),
        )
    return found


async def run_conflicts(
    conn: asyncpg.Connection, queries: Statements, config: RuntimeConfig, run_id: str
) -> list[str]:
    """The connections of a run that has not ended whose settings changed (sorted)."""
    rows = await queries.bindings_of_run(conn, run_id=run_id)
    if not rows or rows[0].ended:
        return []
    return [conflict.connection for conflict in conflicts_in(config, rows)]


async def refuse_run_conflict(
    conn: asyncpg.Connection, queries: Statements, config: RuntimeConfig, run_id: str
) -> None:
    """Refuse (409 ``binding.live-conflict``) to act on a run whose binding changed."""
    changed = await run_conflicts(conn, queries, config, run_id)
    if changed:
        names = ", ".join(f"'{name}'" for name in changed)
        raise CoordinatorError(
            Code.BINDING_LIVE_CONFLICT,
            f"the run depends on settings of connection {names} that the runtime file changed",
        )


__all__ = [
    "Binding",
    "BindingRow",
    "Conflict",
    "configured",
    "conflicts_in",
    "differences",
    "live_conflicts",
    "refuse_run_conflict",
    "run_conflicts",
    "verify_live_bindings",
]
