"""Thousands of waiting runs cost a dispatcher nothing (CONTRACT §9.5): 5,000 runs waiting
for review decisions, inserted in one statement per table, leave a real dispatcher
process's memory where it was, and one polling tick's database work does not grow with
them — the claim walks the partial index of due work and touches only what is due.

Figures are printed (run with ``-s`` to see them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from core.clock import ENV_VAR, format_instant, write_test_clock
from core.db.queries import Queries
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import call, channel, unix_endpoints
from devstack.postgres import DatabaseHandle
from tests.helpers.review_kit import (
    ReviewKit,
    review_kit,
)
from tests.helpers.scale import insert_waiting_runs

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

T0 = datetime(2027, 3, 1, 8, 0, tzinfo=UTC)
WAITING = 5_000
RSS_GROWTH_LIMIT_KIB = 4 * 1024


@pytest.fixture
def sockets() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rcs-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[ReviewKit]:
    async with review_kit(tmp_path, database) as made:
        yield made


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS line")


async def hold_scans(db: asyncpg.Connection, namespace: str) -> int:
    """How often the one-row hold table was read: twice per idle dispatcher look."""
    value = await db.fetchval(
        "SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'hold'",
        namespace,
    )
    return int(value or 0)


async def step_rows_read(db: asyncpg.Connection, namespace: str) -> int:
    """Rows of the step table read by scans of any kind, since the statistics began."""
    row = await db.fetchrow(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) AS n "
        "FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'step'",
        namespace,
    )
    assert row is not None
    return int(row["n"])


async def looks(db: asyncpg.Connection, namespace: str, count: int) -> tuple[int, int]:
    """Wait until the dispatcher looked for work ``count`` more times; answer (looks, step
    rows read meanwhile). Statistics reach the view within about a second."""
    scans, rows = await hold_scans(db, namespace), await step_rows_read(db, namespace)
    deadline = time.monotonic() + 30
    while (await hold_scans(db, namespace)) - scans < 2 * count:
        assert time.monotonic() < deadline, "the dispatcher stopped looking for work"
        await asyncio.sleep(0.1)
    return (
        ((await hold_scans(db, namespace)) - scans) // 2,
        (await step_rows_read(db, namespace)) - rows,
    )


@contextlib.asynccontextmanager
async def dispatcher_process(
    kit: ReviewKit, sockets: Path, clock_file: Path
) -> AsyncIterator[subprocess.Popen[bytes]]:
    kit.deployment.doc["deployment"]["internal"] = {"socketDir": str(sockets)}
    runtime_file = kit.deployment.write()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "core.launcher",
            "--runtime-config",
            str(runtime_file),
            "--component",
            "dispatcher",
        ],
        env={**os.environ, ENV_VAR: str(clock_file)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        async with channel(unix_endpoints(sockets), "dispatcher") as ch:
            stub = pb_grpc.DispatcherStub(ch)
            deadline = time.monotonic() + 30
            while True:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                with contextlib.suppress(Exception):
                    health = await call("dispatcher", stub.Check, pb.Empty(), timeout=1.0)
                    if health.store_ready and health.activation_ready:
                        break
                assert time.monotonic() < deadline, "the dispatcher did not start"
                await asyncio.sleep(0.1)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=20)
        if process.stderr is not None:
            process.stderr.close()


async def explain(db: asyncpg.Connection, sql: str, now: datetime, *args: Any) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one dispatcher query at ``now``; nothing is kept."""
    tx = db.transaction()
    await tx.start()
    try:
        await db.execute("SELECT set_config('coordinator.fake_now', $1, true)", format_instant(now))
        text = await db.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
    finally:
        await tx.rollback()
    plan: dict[str, Any] = json.loads(text)[0]
    return plan


async def generic_plan(db: asyncpg.Connection, sql: str, arguments: str = "") -> dict[str, Any]:
    """The generic plan of ``sql``, executed with the literal ``arguments``: the plan a
    pooled connection's prepared statement may settle on after its first executions."""
    tx = db.transaction()
    await tx.start()
    try:
        await db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await db.execute(f"PREPARE generic_probe AS {sql}")
        suffix = f"({arguments})" if arguments else ""
        text = await db.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE generic_probe{suffix}")
        await db.execute("DEALLOCATE generic_probe")
    finally:
        await tx.rollback()
    plan: dict[str, Any] = json.loads(text)[0]
    return plan


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def touched(plan: dict[str, Any]) -> int:
    """Shared buffers the statement hit or read (the whole plan)."""
    top = plan["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def step_scans(plan: dict[str, Any]) -> list[tuple[str, str | None, int]]:
    """(node type, index, rows) of every scan of the step table."""
    return [
        (node["Node Type"], node.get("Index Name"), int(node.get("Actual Rows", 0)))
        for node in nodes(plan["Plan"])
        if node.get("Relation Name") == "step"
    ]


async def test_five_thousand_waiting_runs_cost_no_memory_and_no_work_per_tick(
    kit: ReviewKit, sockets: Path, tmp_path: Path
) -> None:
    namespace = kit.deployment.namespace
    clock_file = tmp_path / "clock"
    write_test_clock(clock_file, T0)
    queries = Queries(namespace)

    async with dispatcher_process(kit, sockets, clock_file) as process:
        await looks(kit.db, namespace, 4)  # settled: pools open, first looks done
        ticks_before, rows_before = await looks(kit.db, namespace, 10)
        rss_before = rss_kib(process.pid)

        began = time.monotonic()
        await insert_waiting_runs(kit, WAITING, T0)
        inserted_in = time.monotonic() - began

        ticks_after, rows_after = await looks(kit.db, namespace, 10)
        rss_after = rss_kib(process.pid)
        assert process.poll() is None

    waiting = await kit.db.fetchval(
        f"SELECT count(*) FROM {kit.ns}.step WHERE state = 'waiting' AND due_at IS NOT NULL"
    )
    claim_idle = await explain(kit.db, queries["dispatcher_claim"], T0, "explain-owner", 16, 30.0)
    wake_idle = await explain(kit.db, queries["dispatcher_next_wake"], T0)
    # When exactly 16 are due, and two days on when all 5,000 are: a claim of 16 does the
    # same work either way.
    claim_16_due = await explain(
        kit.db, queries["dispatcher_claim"], T0 + timedelta(seconds=3840), "explain-owner", 16, 30.0
    )
    claim_all_due = await explain(
        kit.db, queries["dispatcher_claim"], T0 + timedelta(days=2), "explain-owner", 16, 30.0
    )

    figures = {
        "waiting runs inserted": waiting,
        "insert seconds": round(inserted_in, 2),
        "dispatcher RSS KiB before/after": (rss_before, rss_after),
        "step rows read per look, before/after": (
            round(rows_before / ticks_before, 1),
            round(rows_after / ticks_after, 1),
        ),
        "claim (none due): step scans, buffers": (step_scans(claim_idle), touched(claim_idle)),
        "next-wake: step scans, buffers": (step_scans(wake_idle), touched(wake_idle)),
        "claim (16 due, limit 16): step scans, buffers": (
            step_scans(claim_16_due),
            touched(claim_16_due),
        ),
        "claim (all due, limit 16): step scans, buffers": (
            step_scans(claim_all_due),
            touched(claim_all_due),
        ),
    }
    print("\nwait scale figures:", json.dumps(figures, indent=2, default=str))

    assert waiting == WAITING
    assert rss_after - rss_before < RSS_GROWTH_LIMIT_KIB
    # A look reads the same handful of step rows with 5,000 runs waiting as with none: the
    # wake-up read fetches the earliest waiting step (about 1.5-2 rows per look measured,
    # with the odd extra under load), never a walk over the 5,000.
    assert rows_after / ticks_after <= rows_before / ticks_before + 3
    claim_generic = await generic_plan(
        kit.db, queries["dispatcher_claim"], "'explain-owner', 16, 30.0"
    )
    wake_generic = await generic_plan(kit.db, queries["dispatcher_next_wake"])
    for plan in (claim_idle, wake_idle, claim_16_due, claim_all_due, claim_generic, wake_generic):
        scans = step_scans(plan)
        # Due work is found through the partial index, never by reading the table.
        assert ("Index Scan", "step_due") in [(kind, index) for kind, index, _n in scans], scans
        assert all(kind != "Seq Scan" for kind, _index, _n in scans), scans
    assert sum(rows for _k, _i, rows in step_scans(claim_idle)) == 0
    assert [n for _k, index, n in step_scans(wake_idle) if index == "step_due"] == [1]
    assert [n for _k, index, n in step_scans(claim_all_due) if index == "step_due"] == [16]
    assert touched(claim_idle) < 20 and touched(wake_idle) < 20
    assert [n for _k, index, n in step_scans(claim_16_due) if index == "step_due"] == [16]
    # Claiming is index maintenance of the rows claimed, not a walk over those not taken.
    assert touched(claim_all_due) <= touched(claim_16_due) * 1.25 + 10
