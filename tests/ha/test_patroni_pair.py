"""The PostgreSQL pair under Patroni that the failover drills stand on (issue 40).

Writes go through the coordinator's own connection code (core/db/connect.py) with a URL
that names both servers, as a runtime URL does (CONTRACT §6.5): it must always find the
one that accepts writes, before a failover and after it. A writer keeps inserting while
the primary's Patroni and postmaster are killed with SIGKILL; every insert the server
acknowledged must be on the new primary. The insert in flight at the kill is in doubt
(committed or not), and is only counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import asyncpg
import pytest

from core.db.connect import connect, serving_host
from tests.helpers.ha_cluster import HaCluster, ha_cluster

WRITE_SECONDS_AFTER = 2.0
"""How long the writer goes on once a new primary took its first write."""


@pytest.fixture
def cluster() -> Iterator[HaCluster]:
    with ha_cluster(synchronous=True) as made:
        yield made


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

    url: str
    root: bytes
    acknowledged: list[int] = field(default_factory=list)
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
                    conn = await connect(self.url, self.root)
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
        if conn is not None:
            await conn.close()


async def test_a_killed_primary_is_replaced_and_keeps_every_acknowledged_write(
    cluster: HaCluster,
) -> None:
    old = cluster.leader()
    assert old is not None
    conn = await connect(cluster.url(), cluster.ca.pem)
    try:
        assert str(serving_host(conn)) == f"{old.host.address}:5432"
        await conn.execute("CREATE TABLE drill (id integer PRIMARY KEY)")
    finally:
        await conn.close()

    writer = Writer(cluster.url(), cluster.ca.pem)
    writing = asyncio.create_task(writer.run())
    await asyncio.sleep(1.0)  # load before the kill (how much does not matter)
    acknowledged_before = len(writer.acknowledged)
    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.kill_node, old)
    promoted = await asyncio.to_thread(
        cluster.wait_for,
        "the standby promoted",
        lambda: (leader := cluster.leader()) is not None and leader is not old,
    )
    first_write = len(writer.acknowledged)
    await asyncio.to_thread(
        cluster.wait_for,
        "a write on the new primary",
        lambda: len(writer.acknowledged) > first_write,
    )
    back_after = time.monotonic() - killed_at
    await asyncio.sleep(WRITE_SECONDS_AFTER)
    writer.stop.set()
    await writing

    new = cluster.leader()
    assert new is not None and new is not old
    conn = await connect(cluster.url(), cluster.ca.pem)
    try:
        assert str(serving_host(conn)) == f"{new.host.address}:5432"
        stored = {row["id"] for row in await conn.fetch("SELECT id FROM drill")}
    finally:
        await conn.close()
    lost = [number for number in writer.acknowledged if number not in stored]
    print(
        f"\nfailover drill: {len(writer.acknowledged)} writes acknowledged "
        f"({acknowledged_before} before the kill), {len(lost)} lost, "
        f"{len(writer.in_doubt)} in doubt ({sum(n in stored for n in writer.in_doubt)} "
        f"of them committed); standby promoted {promoted:.1f} s after the kill, "
        f"writes back after {back_after:.1f} s; hosts served: {writer.hosts}"
    )
    assert acknowledged_before > 0
    assert lost == []
    assert writer.hosts[0] == f"{old.host.address}:5432"
    assert writer.hosts[-1] == f"{new.host.address}:5432"
