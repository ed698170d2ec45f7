"""The PostgreSQL pair under Patroni that the failover drills stand on (issue 40).

Writes go through the coordinator's own connection code (core/db/connect.py) with a URL
that names both servers, as a runtime URL does (CONTRACT §6.5): it must always find the
one that accepts writes, before a failover and after it. A writer keeps inserting while
the primary's Patroni and postmaster are killed with SIGKILL, or while ``patronictl``
switches the primary over; every insert the server acknowledged must be on the new
primary. The insert in flight at a fault is in doubt (committed or not), and only counted.
After the kill the old primary comes back, is rewound where it went further than the new
one, and follows it; the writer never reaches it again. Each drill prints its figures.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Final

import asyncpg

from core.db.connect import client_ssl_context, connect, serving_host
from tests.helpers.ha_cluster import (
    GUARD_SECONDS,
    SUPERUSER_PASSWORD,
    HaCluster,
    HaError,
    Node,
)

LOAD: Final = 300
"""Writes acknowledged before a fault, and again after it, before a drill goes on."""


_BROKEN = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # a server that takes no writes (yet), or a protocol cut short mid-operation
    asyncpg.InternalClientError,
)


@dataclass
class Writer:
    """Inserts numbered rows one at a time, reconnecting whenever the database goes."""

    cluster: HaCluster
    acknowledged: list[int] = field(default_factory=list)
    acknowledged_at: list[float] = field(default_factory=list)
    in_doubt: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        number = 0
        conn: asyncpg.Connection | None = None
        while not self.stop.is_set():
            if conn is None or conn.is_closed():
                try:
                    conn = await connect(self.cluster.url(), self.cluster.ca.pem)
                except _BROKEN as exc:
                    self.refusals.append(type(exc).__name__)
                    await asyncio.sleep(0.2)
                    continue
                self.hosts.append(str(serving_host(conn)))
            number += 1
            try:
                await conn.execute("INSERT INTO drill (id) VALUES ($1)", number)
            except _BROKEN:
                # The connection broke under the insert: whether it committed is unknown.
                self.in_doubt.append(number)
                conn.terminate()
                conn = None
                continue
            self.acknowledged.append(number)
            self.acknowledged_at.append(time.monotonic())
        if conn is not None:
            await conn.close()

    async def until(self, count: int) -> None:
        """Wait until ``count`` writes were acknowledged in all (HaError past the bound)."""
        await asyncio.to_thread(
            self.cluster.wait_for,
            f"{count} writes acknowledged",
            lambda: len(self.acknowledged) >= count,
        )

    def largest_gap(self) -> float:
        """The longest time between two acknowledged writes, in seconds."""
        times = self.acknowledged_at
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def _create_table(cluster: HaCluster) -> Node:
    leader = cluster.leader()
    assert leader is not None
    conn = await connect(cluster.url(), cluster.ca.pem)
    try:
        assert str(serving_host(conn)) == f"{leader.host.address}:5432"
        await conn.execute("CREATE TABLE drill (id integer PRIMARY KEY)")
    finally:
        await conn.close()
    return leader


async def _stored(cluster: HaCluster, node: Node) -> set[int]:
    """The rows ``node`` holds (a standby's too: reading is enough to count)."""
    conn = await asyncpg.connect(
        host=node.host.address,
        port=5432,
        user="postgres",
        password=SUPERUSER_PASSWORD,
        database="postgres",
        ssl=client_ssl_context(cluster.ca.pem),
    )
    try:
        return {row["id"] for row in await conn.fetch("SELECT id FROM drill")}
    finally:
        await conn.close()


async def _caught_up(cluster: HaCluster, node: Node, wanted: set[int]) -> None:
    """Wait until ``node`` holds every row of ``wanted`` (HaError past the bound)."""
    began = time.monotonic()
    while not (await _stored(cluster, node)) >= wanted:
        if time.monotonic() - began > GUARD_SECONDS:
            raise HaError(f"{node.name} did not catch up\n{cluster.logs()}")
        await asyncio.sleep(0.2)


def _report(name: str, writer: Writer, stored: set[int], **figures: str) -> list[int]:
    lost = [number for number in writer.acknowledged if number not in stored]
    committed = sum(number in stored for number in writer.in_doubt)
    shown = ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in figures.items())
    print(
        f"\n{name}: {len(writer.acknowledged)} writes acknowledged, {len(lost)} lost, "
        f"{len(writer.in_doubt)} in doubt ({committed} of them committed), "
        f"{len(writer.refusals)} connection attempts refused, longest gap between "
        f"acknowledged writes {writer.largest_gap():.1f} s; {shown}; hosts served: "
        f"{writer.hosts}"
    )
    return lost


async def _failed_over(cluster: HaCluster, writer: Writer, old: Node, since: float) -> str:
    """Wait until another node leads and the writer wrote on it, then :data:`LOAD` more;
    answers the figures: the promotion's and the first write's time after ``since``."""
    promoted = await asyncio.to_thread(
        cluster.wait_for,
        "the standby promoted",
        lambda: (leader := cluster.leader()) is not None and leader is not old,
    )
    before = len(writer.acknowledged)
    await writer.until(before + 1)
    back_after = time.monotonic() - since
    await writer.until(before + LOAD)
    return f"promoted after {promoted:.1f} s, writes back after {back_after:.1f} s"


def _never_back_to(writer: Writer, old: Node, new: Node) -> None:
    """Once the writer reached ``new``, it never wrote on ``old`` again."""
    old_address, new_address = f"{old.host.address}:5432", f"{new.host.address}:5432"
    assert old_address not in writer.hosts[writer.hosts.index(new_address) :]


async def _finish(
    cluster: HaCluster,
    writer: Writer,
    writing: asyncio.Task[None],
    old: Node,
    name: str,
    **figures: str,
) -> None:
    """Stop the writer, then: every acknowledged write is on the new primary, the writer
    never went back to ``old`` once it reached the new one, and ``old``, following now,
    holds them all too."""
    writer.stop.set()
    await writing
    new = cluster.leader()
    assert new is not None and new is not old
    stored = await _stored(cluster, new)
    assert _report(name, writer, stored, **figures) == []
    _never_back_to(writer, old, new)
    await _caught_up(cluster, old, set(writer.acknowledged))


async def test_a_killed_primary_is_replaced_keeps_every_acknowledged_write_and_rejoins(
    cluster: HaCluster,
) -> None:
    old = await _create_table(cluster)
    writer = Writer(cluster)
    writing = asyncio.create_task(writer.run())
    await writer.until(LOAD)
    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.kill_node, old)
    failover = await _failed_over(cluster, writer, old, killed_at)

    # The old primary comes back (Patroni rewinds it where it went further than the new
    # one) and follows the new primary; the writer, still writing, never reaches it.
    restarted_at = time.monotonic()
    await asyncio.to_thread(cluster.start_node, old)
    await asyncio.to_thread(
        cluster.wait_for, "the old primary following", lambda: cluster.healthy_pair()
    )
    rejoined = time.monotonic() - restarted_at
    assert writer.hosts[0] == f"{old.host.address}:5432"
    await _finish(
        cluster,
        writer,
        writing,
        old,
        "kill -9 of the primary",
        failover=failover,
        old_primary_rejoined_after=f"{rejoined:.1f} s",
        rewound="yes" if "pg_rewind" in old.log.read_text(errors="replace") else "no",
    )


async def test_a_planned_switchover_loses_nothing(cluster: HaCluster) -> None:
    old = await _create_table(cluster)
    candidate = next(node for node in cluster.nodes if node is not old)
    writer = Writer(cluster)
    writing = asyncio.create_task(writer.run())
    await writer.until(LOAD)
    began = time.monotonic()
    await asyncio.to_thread(cluster.switchover, old, candidate)
    await asyncio.to_thread(
        cluster.wait_for, "the candidate leading", lambda: cluster.leader() is candidate
    )
    before = len(writer.acknowledged)
    await writer.until(before + LOAD)
    took = time.monotonic() - began
    await asyncio.to_thread(cluster.wait_for, "the old primary following", cluster.healthy_pair)
    assert writer.hosts[-1] == f"{candidate.host.address}:5432"
    await _finish(
        cluster,
        writer,
        writing,
        old,
        "planned switchover",
        switchover_and_load_after=f"{took:.1f} s",
    )


async def test_a_primary_cut_off_is_left_behind_and_rejoins(cluster: HaCluster) -> None:
    """The primary's machine drops off the network: no reset reaches the writer, whose
    insert in flight would hang for the kernel's retransmissions were it not for the
    connections' silence limit (core.db.connect.PEER_SILENCE_SECONDS). Patroni on the cut
    machine demotes it once it cannot renew its leader key; the standby is promoted."""
    old = await _create_table(cluster)
    writer = Writer(cluster)
    writing = asyncio.create_task(writer.run())
    await writer.until(LOAD)
    cut_at = time.monotonic()
    old.host.cut()
    try:
        failover = await _failed_over(cluster, writer, old, cut_at)
    finally:
        old.host.mend()
    mended_at = time.monotonic()
    await asyncio.to_thread(cluster.wait_for, "the cut primary following", cluster.healthy_pair)
    rejoined = time.monotonic() - mended_at
    await _finish(
        cluster,
        writer,
        writing,
        old,
        "primary cut off",
        failover=failover,
        rejoined_after_the_link_returned=f"{rejoined:.1f} s",
    )
