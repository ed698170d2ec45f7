"""Claiming due work, finding abandoned leases, and waking up when there is work (§9.2).

Dispatchers claim due steps with ``FOR UPDATE SKIP LOCKED`` under a lease, so any number
of replicas share one database and each step is worked on by one of them at a time. An idle
dispatcher does not poll on a fixed interval: it ``LISTEN``s on ``<namespace>_due`` (the
step table's trigger notifies whenever a step becomes due and unclaimed) and on
``<namespace>_hold``, on one dedicated connection, and otherwise sleeps until the next due
instant or lease expiry it read from the database — capped, so that a missed notification
(a dropped listening connection) costs seconds, not a stuck run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core import clock
from core.db.statements import DispatcherClaimRow
from core.errors import CoordinatorError
from core.payloads import statement
from core.runtime import Store
from dispatcher.settings import DispatchSettings

log = logging.getLogger("coordinator.dispatcher")

LISTEN_RETRY_SECONDS = 1.0
# Something is due but another dispatcher is still committing its claim of it: look again
# soon, but not in a tight loop.
BUSY_FLOOR_SECONDS = 0.05


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
    now: datetime | None = None
    """The namespace's clock when the step was claimed (``None`` only when made by hand)."""
    abandoned: bool = False
    """Whether a cancel had abandoned the step when it was claimed (``step_abandoned``): a
    hint for skipping work early, which each transition function confirms under the
    step's lock, since a cancel may commit after the claim."""
    context: DispatcherClaimRow | None = field(default=None, compare=False, repr=False)
    """The claim row itself, with what executing the step reads (see ``dispatcher_claim``):
    the run, its sealed scope, its bindings and the stored command."""

    @classmethod
    def from_row(cls, row: DispatcherClaimRow) -> Claimed:
        """The claimed step of a ``dispatcher_claim`` row."""
        return cls(
            run_id=row.run_id,
            step_id=row.step_id,
            seq=row.seq,
            step_type=row.step_type,
            state=row.state,
            attempts=row.attempts,
            command_payload_id=row.command_payload_id,
            command_key=row.command_key,
            past_deadline=row.past_deadline,
            lease_epoch=row.lease_epoch,
            now=row.now,
            abandoned=row.abandoned,
            context=row,
        )


@dataclass(frozen=True)
class Sweep:
    """What one look for expired leases, and for calls retrying long enough to ask for
    attention, found."""

    released: int
    uncertain: int
    flagged: int = 0
    """Calls whose series of retryable answers had lasted
    ``deployment.attention.retryingAfterSeconds``: now ``retrying``, their runs asking for
    attention."""


@dataclass(frozen=True)
class Wake:
    """When to look for work again."""

    due_in: float | None
    lease_in: float | None
    execution_hold: bool

    def delay(self, cap: float, sweep_in: float = 0.0) -> float:
        """Seconds to sleep (unless notified): until the next due step or lease expiry.

        Only a sweep acts on an expired lease, so an expiry wakes the loop no sooner than
        ``sweep_in``, when the next sweep is allowed.
        """
        if self.execution_hold:
            return cap
        lease_in = None if self.lease_in is None else max(self.lease_in, sweep_in)
        candidates = [s for s in (self.due_in, lease_in) if s is not None]
        if not candidates:
            return cap
        return min(cap, max(BUSY_FLOOR_SECONDS, min(candidates)))


class Claimer:
    """The claim queries of one dispatcher (identified by ``owner``)."""

    def __init__(self, store: Store, owner: str, settings: DispatchSettings) -> None:
        self.store = store
        self.owner = owner
        self.settings = settings

    async def claim(self, limit: int) -> list[Claimed]:
        """Lease up to ``limit`` due steps to this dispatcher, each with what executing it
        reads (one statement for the whole batch)."""
        if limit <= 0:
            return []
        async with statement(self.store) as conn:
            rows = await self.store.queries.dispatcher_claim(
                conn,
                owner=self.owner,
                limit=limit,
                lease_seconds=self.settings.lease_seconds,
            )
        return [Claimed.from_row(row) for row in rows]

    async def sweep(self) -> Sweep:
        """Release expired leases (a prepared step among them becomes uncertain), and give
        the calls that have kept getting retryable answers for too long the cause
        ``retrying`` and their runs attention. Two statements, each reading one small
        partial index when it finds nothing."""
        async with statement(self.store) as conn:
            row = await self.store.queries.dispatcher_expire_leases(
                conn, limit=self.settings.sweep_limit
            )
        async with statement(self.store) as conn:
            flagged = await self.store.queries.dispatcher_flag_retrying(
                conn, limit=self.settings.sweep_limit
            )
        assert row is not None  # counts: always one row
        found = Sweep(row.released, row.uncertain, flagged)
        if found.uncertain:
            log.warning(
                "%d step(s) with an expired lease had a prepared command; now uncertain",
                found.uncertain,
            )
        if found.flagged:
            log.warning(
                "%d call(s) retried for longer than %d s; their runs now ask for attention",
                found.flagged,
                self.store.runtime.config.deployment.attention.retrying_after_seconds,
            )
        return found

    async def next_wake(self) -> Wake:
        """The next due instant and lease expiry, relative to the database's clock."""
        async with statement(self.store) as conn:
            row = await self.store.queries.dispatcher_next_wake(conn)
        assert row is not None  # scalar subqueries: always one row
        return Wake(row.due_in, row.lease_in, bool(row.execution_hold))

    def idle_cap(self) -> float:
        """The longest idle wait: short under the test clock, whose moves notify nobody."""
        if clock.enabled():
            return self.settings.test_clock_idle_cap_seconds
        return self.settings.idle_cap_seconds


class Listener:
    """``LISTEN`` on the namespace's due and hold channels on one dedicated connection."""

    def __init__(self, store: Store, on_notify: Callable[[], None]) -> None:
        self.store = store
        self.on_notify = on_notify
        namespace = store.runtime.config.namespace
        self.channels = (f"{namespace}_due", f"{namespace}_hold")
        self.listening = asyncio.Event()

    def _callback(self, *_args: Any) -> None:
        self.on_notify()

    async def run(self) -> None:
        """Listen until cancelled; reconnect after the connection is lost."""
        # Said once per loss, not once per retry: a database outage is reported by the
        # store's rate-limited store-unavailable line.
        warned = False
        while True:
            lost = asyncio.Event()

            def on_lost(_conn: Any, lost: asyncio.Event = lost) -> None:
                lost.set()

            try:
                async with self.store.connection() as conn:
                    conn.add_termination_listener(on_lost)
                    for channel in self.channels:
                        await conn.add_listener(channel, self._callback)
                    self.listening.set()
                    warned = False
                    # Work may have become due while nobody listened.
                    self.on_notify()
                    try:
                        await lost.wait()
                    finally:
                        self.listening.clear()
                        conn.remove_termination_listener(on_lost)
                        if not conn.is_closed():
                            for channel in self.channels:
                                with contextlib.suppress(Exception):
                                    await conn.remove_listener(channel, self._callback)
            except Exception as exc:
                # Whatever broke the listening connection, the capped idle wait keeps work
                # moving meanwhile; listen again shortly.
                if not warned:
                    warned = True
                    detail = exc.code if isinstance(exc, CoordinatorError) else type(exc).__name__
                    log.warning("not listening for due work (%s); trying again", detail)
            await asyncio.sleep(LISTEN_RETRY_SECONDS)
