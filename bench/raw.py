"""The raw rate: what the same PostgreSQL does with the same driver when nothing but the
database stands between one due row and the next.

Each transaction is the smallest honest step transition: claim one due row of a scratch
table shaped like ``step`` (same columns, same partial indexes, same fill factor, the same
``due`` notification trigger) with ``FOR UPDATE SKIP LOCKED``, end it with an ``UPDATE``,
and ``INSERT`` its successor due now. Every worker keeps its own chain of runs alive, so the
queue never runs dry and workers compete for the same index the way dispatchers do.

The bench runs it in a database of its own on the coordinator's server, over the same TLS
path. Sharing the server keeps the comparison fair (same build, settings, disk and CPU);
a separate database keeps its commits out of ``pg_stat_database.xact_commit`` of the
coordinator's database, from which the throughput phase counts transactions per transition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.db.connect import create_pool

SCHEMA = "bench_raw"
SEED_ROWS_PER_WORKER = 64


def _scoped(sql: str) -> str:
    # Only this module's constant schema name goes into SQL text, never input.
    return sql.replace("{schema}", SCHEMA)


# The scratch schema name is a constant of this module, never input.
CREATE = f"""
DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
CREATE SCHEMA {SCHEMA};
CREATE TABLE {SCHEMA}.step (
    run_id             text NOT NULL,
    step_id            text NOT NULL,
    seq                integer NOT NULL CHECK (seq > 0),
    step_type          text NOT NULL,
    state              text NOT NULL DEFAULT 'ready',
    attempts           integer NOT NULL DEFAULT 0,
    effect             text,
    cause              text,
    cause_status       integer,
    command_payload_id bigint,
    command_key        text,
    prepared_at        timestamptz,
    first_attempt_at   timestamptz,
    deadline_at        timestamptz,
    due_at             timestamptz,
    lease_owner        text,
    lease_expires_at   timestamptz,
    lease_epoch        bigint,
    wait_match         bytea,
    next_check_at      timestamptz,
    timeout_at         timestamptz,
    checks             integer NOT NULL DEFAULT 0,
    started_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at           timestamptz,
    PRIMARY KEY (run_id, step_id),
    UNIQUE (run_id, seq)
) WITH (fillfactor = 70);
CREATE INDEX step_due ON {SCHEMA}.step (due_at) WHERE due_at IS NOT NULL AND lease_owner IS NULL;
CREATE INDEX step_leased ON {SCHEMA}.step (lease_expires_at) WHERE lease_owner IS NOT NULL;
CREATE UNIQUE INDEX step_command_key ON {SCHEMA}.step (command_key)
    WHERE command_key IS NOT NULL;
CREATE FUNCTION {SCHEMA}.notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN PERFORM pg_notify('{SCHEMA}_due', ''); RETURN NULL; END $$;
CREATE TRIGGER step_due_notify
    AFTER INSERT OR UPDATE OF due_at, lease_owner ON {SCHEMA}.step
    FOR EACH ROW WHEN (NEW.due_at IS NOT NULL AND NEW.lease_owner IS NULL)
    EXECUTE FUNCTION {SCHEMA}.notify_due();
"""

SEED = _scoped("""
INSERT INTO {schema}.step (run_id, step_id, seq, step_type, due_at)
SELECT gen_random_uuid()::text, 's1', 1, 'call', clock_timestamp()
  FROM generate_series(1, $1)
""")

CLAIM = _scoped("""
SELECT run_id, step_id, seq
  FROM {schema}.step
 WHERE due_at IS NOT NULL AND lease_owner IS NULL AND due_at <= clock_timestamp()
 ORDER BY due_at
 LIMIT 1
   FOR UPDATE SKIP LOCKED
""")

END = _scoped("""
UPDATE {schema}.step
   SET state = 'completed', effect = 'accepted', due_at = NULL,
       ended_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE run_id = $1 AND step_id = $2
""")

NEXT = _scoped("""
INSERT INTO {schema}.step (run_id, step_id, seq, step_type, state, due_at)
VALUES ($1, $2, $3, 'call', 'ready', clock_timestamp())
""")


@dataclass(frozen=True)
class RawResult:
    """Transactions committed by ``connections`` workers in ``seconds``."""

    transactions: int
    seconds: float
    connections: int
    empty_claims: int

    @property
    def per_second(self) -> float:
        return self.transactions / self.seconds if self.seconds else 0.0


async def measure(
    url: str,
    trusted_root: bytes | None,
    *,
    seconds: float,
    connections: int,
    started: Callable[[], None] = lambda: None,
    finished: Callable[[], None] = lambda: None,
) -> RawResult:
    """Run claim + update + insert transactions on ``connections`` connections for
    ``seconds``; the scratch schema is made first and dropped afterwards. ``started`` and
    ``finished`` are called around the timed part, while its backends still exist (a CPU
    meter reads them then)."""
    pool = await create_pool(
        url, trusted_root, min_size=connections, max_size=connections, label="bench database"
    )
    try:
        async with pool.acquire() as conn:
            await conn.execute(CREATE)
            await conn.execute(SEED, SEED_ROWS_PER_WORKER * connections)
            await conn.execute(f"ANALYZE {SCHEMA}.step")
        counts = [0] * connections
        empty = [0] * connections

        deadline = 0.0

        async def worker(index: int) -> None:
            async with pool.acquire() as conn:
                while time.monotonic() < deadline:
                    async with conn.transaction():
                        row = await conn.fetchrow(CLAIM)
                        if row is None:
                            empty[index] += 1
                            continue
                        await conn.execute(END, row["run_id"], row["step_id"])
                        await conn.execute(
                            NEXT, row["run_id"], f"s{row['seq'] + 1}", row["seq"] + 1
                        )
                    counts[index] += 1

        started()
        began = time.monotonic()
        deadline = began + seconds
        await asyncio.gather(*(worker(i) for i in range(connections)))
        elapsed = time.monotonic() - began
        finished()
        async with pool.acquire() as conn:
            await conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
        return RawResult(sum(counts), elapsed, connections, sum(empty))
    finally:
        await pool.close()


def scratch_owner_note() -> str:
    """How the scratch table differs from the real one (printed beside the figure)."""
    return (
        "scratch step-shaped table (same columns, partial indexes, fillfactor 70 and due "
        "trigger), no foreign keys, no run join"
    )
