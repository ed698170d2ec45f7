"""The scale phase: many waiting runs must cost a dispatcher neither memory, nor claim or
settle work, nor throughput or latency.

After the measured repeats the bench puts the database in the **quiet-VACUUM state**: with
no run live, it turns autovacuum off for the three tables it seeds (``run``, ``binding``,
``step``) and runs ``VACUUM ANALYZE`` on every table of the namespace. The statistics then
say that no run is live, which is what a quiet night's VACUUM leaves in production, and
nothing analyses the tables again while the phase runs, so each size meets the same stale
statistics: the planner believes the live-run partial index is empty.

Then, for each size of ``--waiting-runs`` in turn (cumulatively: 100,000 then 900,000 more
to reach 1,000,000), waiting runs are seeded straight into the coordinator's namespace, as
the migration role (which owns the schema), with one ``INSERT … SELECT generate_series``
per table and batch, never analysed. Each looks like a run waiting for a product result:
run state ``waiting``, the bindings of a real bench run, and one ``wait-for`` step in state
``waiting`` that has been checked once and is due at its next check, a day or more from now
(spread one second apart), with a timeout two weeks out. That is the shape
``waits_record_read`` leaves behind after a read that ended nothing, and it keeps every
seeded step in the ``step_due`` partial index the claim walks, which is the case that would
grow if anything did. No payload rows: no constraint asks for them and nothing reads them
before the step is due.

Three statements of the store are costed at each size, each with its own text from
``core/db/queries/`` through :class:`core.db.queries.Queries`, prepared and executed with
``plan_cache_mode = force_generic_plan`` (the plan a pooled connection's prepared statement
may settle on after its first executions) under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)``,
inside a transaction that is rolled back, so nothing changes:

- one claim (``dispatcher_claim``): nothing is due, so this is the look an idle or freshly
  woken dispatcher makes; it should stop at the first future entry of ``step_due``;
- one settle (``dispatcher_step_settle``) of a real waiting run's step, leased to the bench
  first in the same transaction: the step completes, keeps a result, and a call step
  becomes the run's next, due now;
- one lease sweep (``dispatcher_expire_leases``), which every dispatcher runs every second.

After the largest size, :meth:`Scale.seed_held` seeds runs held for an operator among the
waiting ones, for the run list at scale (:mod:`bench.listing`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from core.db.queries import Queries
from core.db.query_names import QueryName

WAIT_STEP = "await-result"
EXPLAIN_OWNER = "bench-explain"
CLAIM_LIMIT = 16  # the dispatcher's default concurrency, the most it claims at once
SWEEP_LIMIT = 100  # the dispatcher's default sweep_limit
LEASE_SECONDS = 30.0
SETTLE_NEXT_STEP = "bench-next"
SHAPE = "run waiting, its bindings, one wait-for step due at its next check a day out"
SEEDED_TABLES = ("run", "binding", "step")
# The held runs' steps, named as in bench/workflow/bench-notice.
FIRST_CALL = "first-notice"
CHOICE = "pick"
SECOND_CALL = "second-notice"
HELD_PREFIX = "held-"  # (the HELD_* statements spell it out)
# The held runs' attention began in this many batches, a minute apart (run n in batch n mod
# this), so that the order of attention differs from the order of creation.
HELD_BATCHES = 100
HELD_SHAPE = (
    "run held with attention, its bindings, one uncertain call (status-5xx 503, every fifth "
    "lease-expired; every fourth run's second call, after its first call and choice ended)"
)
# Runs per seeding transaction: each keeps one after-trigger event per row and table (the
# foreign-key checks and the due notification) until it commits.
SEED_BATCH = 100_000
# Batches seeded at once, each on its own connection: the machine has two cores and the
# stack is idle while it seeds. 1,000,000 runs took 54 s on one connection, 35 s on two.
SEED_CONNECTIONS = 2

# Each statement names the namespace as the quoted identifier that core.db.queries made
# after matching it against ^coordinator_[a-z0-9_]+$; nothing else goes into SQL text.
# Runs scale-($3 + 1) … scale-($3 + $2) are seeded; $1 is the run they copy.
SEED_RUNS = """
INSERT INTO {ns}.run (id, workflow_id, package_digest, principal_iss, principal_sub,
                      client_id, state)
SELECT 'scale-' || i, t.workflow_id, t.package_digest, t.principal_iss, t.principal_sub,
       t.client_id, 'waiting'
  FROM {ns}.run t, generate_series($3::integer + 1, $3::integer + $2::integer) AS i
 WHERE t.id = $1
"""

# The bindings of runs $4 || ($3 + 1) … $4 || ($3 + $2), copied from run $1's.
SEED_BINDINGS = """
INSERT INTO {ns}.binding (run_id, connection, connection_type, base_url, client_id, issuer,
                          scopes, audience, profile, producer)
SELECT $4::text || i, b.connection, b.connection_type, b.base_url, b.client_id, b.issuer,
       b.scopes, b.audience, b.profile, b.producer
  FROM {ns}.binding b, generate_series($3::integer + 1, $3::integer + $2::integer) AS i
 WHERE b.run_id = $1
"""

SEED_STEPS = """
INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at, next_check_at,
                       timeout_at, wait_match, checks)
SELECT 'scale-' || i, $1, 1, 'wait-for', 'waiting',
       {ns}.now() + make_interval(secs => 86400 + i),
       {ns}.now() + make_interval(secs => 86400 + i),
       {ns}.now() + interval '14 days',
       sha256(convert_to('scale-' || i, 'UTF8')), 1
  FROM generate_series($3::integer + 1, $3::integer + $2::integer) AS i
"""

TEMPLATE_RUN = """
SELECT id FROM {ns}.run WHERE state = 'succeeded' ORDER BY created_at DESC LIMIT 1
"""

# Held runs (see Scale.seed_held): held-1 … held-$2, those whose number is $5 modulo $4, each
# created $3 + its number in seconds. attention_since is not written here: the trigger
# run_attention_since sets it to {ns}.now(), which answers the coordinator.fake_now setting
# the caller made for this batch, as updated_at does.
HELD_RUNS = """
INSERT INTO {ns}.run (id, workflow_id, package_digest, principal_iss, principal_sub,
                      client_id, state, attention, created_at, updated_at)
SELECT 'held-' || i, t.workflow_id, t.package_digest, t.principal_iss, t.principal_sub,
       t.client_id, 'held', true, $3::timestamptz + make_interval(secs => i), {ns}.now()
  FROM {ns}.run t, generate_series(1, $2::integer) AS i
 WHERE t.id = $1 AND i % $4::integer = $5::integer
"""

# Every fourth held run (of held-1 … held-$3) got past its first call ($1, accepted) and its
# choice ($2) before its second call became uncertain.
HELD_ENDED_STEPS = """
INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, attempts, effect, command_key,
                       prepared_at, first_attempt_at, started_at, updated_at, ended_at)
SELECT r.id, s.step_id, s.seq, s.step_type, 'completed', s.attempts, s.effect,
       CASE WHEN s.step_type = 'call' THEN r.id || '-' || s.seq END,
       CASE WHEN s.step_type = 'call' THEN r.created_at END,
       CASE WHEN s.step_type = 'call' THEN r.created_at END,
       r.created_at, r.created_at + interval '1 second', r.created_at + interval '1 second'
  FROM generate_series(4, $3::integer, 4) AS i
  JOIN {ns}.run r ON r.id = 'held-' || i
 CROSS JOIN (VALUES ($1::text, 1, 'call', 1, 'accepted'),
                    ($2::text, 2, 'choose', 0, NULL)) AS s (step_id, seq, step_type, attempts,
                                                           effect)
"""

# The uncertain call of each held run (held-1 … held-$3): the second call ($2) for every
# fourth run, the first ($1) otherwise; every fifth lost its dispatcher (lease-expired), the
# others had a 503 answer (status-5xx). Uncertain steps are never due.
HELD_UNCERTAIN_STEPS = """
INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, attempts, effect, cause,
                       cause_status, command_key, prepared_at, first_attempt_at, started_at,
                       updated_at)
SELECT r.id, x.step_id, x.seq, 'call', 'uncertain', 1, 'unknown',
       CASE WHEN i % 5 = 0 THEN 'lease-expired' ELSE 'status-5xx' END,
       CASE WHEN i % 5 = 0 THEN NULL ELSE 503 END,
       r.id || '-' || x.seq, x.started, x.started, x.started, r.attention_since
  FROM generate_series(1, $3::integer) AS i
  JOIN {ns}.run r ON r.id = 'held-' || i
 CROSS JOIN LATERAL (
       SELECT CASE WHEN i % 4 = 0 THEN $2::text ELSE $1::text END AS step_id,
              CASE WHEN i % 4 = 0 THEN 3 ELSE 1 END AS seq,
              r.created_at + CASE WHEN i % 4 = 0 THEN interval '1 second'
                                  ELSE interval '0' END AS started) x
"""

# The settle's step must be leased to the bench in the current hold epoch, as a claim
# leaves it, or the statement finds nothing to settle.
LEASE_FOR_SETTLE = """
UPDATE {ns}.step
   SET lease_owner = $3, lease_expires_at = {ns}.now() + interval '30 seconds',
       lease_epoch = (SELECT epoch FROM {ns}.hold)
 WHERE run_id = $1 AND step_id = $2
"""

FAKE_NOW = "SELECT set_config('coordinator.fake_now', $1, true)"

ANALYSED = """
SELECT coalesce(sum(analyze_count + autoanalyze_count), 0)::bigint
  FROM pg_catalog.pg_stat_user_tables
 WHERE schemaname = $1 AND relname = ANY($2::text[])
"""


# ------------------------------------------------------------------------------ pure parts


def parse_sizes(text: str) -> list[int]:
    """``--waiting-runs``: a comma-separated list of increasing sizes (``100000,1000000``;
    underscores allowed), or ``0`` for no scale phase (the empty list). Raises
    ``ValueError`` with a sentence for anything else."""
    parts = [part.strip() for part in text.split(",")]
    try:
        sizes = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"not a comma-separated list of whole numbers: {text!r}") from None
    if sizes == [0]:
        return []
    if any(size <= 0 for size in sizes):
        raise ValueError("each size must be positive (0 alone skips the phase)")
    if any(later <= earlier for earlier, later in itertools.pairwise(sizes)):
        raise ValueError("the sizes are seeded cumulatively, so each must exceed the one before")
    return sizes


def seed_batches(seeded: int, target: int, batch: int = SEED_BATCH) -> list[tuple[int, int]]:
    """The batches that take the seeded runs from ``seeded`` to ``target``, each as (runs
    seeded before it, runs in it)."""
    if batch <= 0:
        raise ValueError("a batch holds at least one run")
    return [(start, min(batch, target - start)) for start in range(seeded, target, batch)]


@dataclass(frozen=True)
class PlanCost:
    """What one statement's execution touched, from ``EXPLAIN (ANALYZE, BUFFERS)``."""

    shared_hit: int
    shared_read: int
    execution_ms: float
    rows: int
    plan: str
    """The scans of ``step`` and ``run`` the plan used, with the rows each returned."""

    @property
    def buffers(self) -> int:
        return self.shared_hit + self.shared_read

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "buffers": self.buffers}


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _indexes(scan: dict[str, Any]) -> str:
    """The index a scan node reads: its own, or for a bitmap heap scan those of the bitmap
    index scans under it."""
    if scan.get("Index Name"):
        return str(scan["Index Name"])
    if scan.get("Node Type") != "Bitmap Heap Scan":
        return ""
    return "+".join(
        str(node["Index Name"])
        for node in _nodes(scan)
        if node.get("Node Type") == "Bitmap Index Scan" and node.get("Index Name")
    )


def plan_cost_of(explained: dict[str, Any], tables: tuple[str, ...] = ("step",)) -> PlanCost:
    """The figures of one ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` document.

    A node's buffers include everything run while it ran, so the top node covers the
    statement, except for a data-modifying ``WITH`` that nothing reads: PostgreSQL runs it
    to completion after the main query, so its own buffers are added. (The foreign-key
    checks that triggers make at the statement's end show in no node: those are left out.)
    """
    top = explained["Plan"]
    read = {node["CTE Name"] for node in _nodes(top) if node.get("Node Type") == "CTE Scan"}
    apart = [
        child
        for child in top.get("Plans", [])
        if str(child.get("Subplan Name", "")).startswith("CTE ")
        and str(child["Subplan Name"])[4:] not in read
    ]
    scans = [
        f"{node['Relation Name']}: {node['Node Type']} {_indexes(node)}".rstrip()
        + f" ({int(node.get('Actual Rows', 0))} rows)"
        for node in _nodes(top)
        if node.get("Relation Name") in tables and "Scan" in str(node.get("Node Type"))
    ]
    return PlanCost(
        shared_hit=sum(int(node.get("Shared Hit Blocks", 0)) for node in [top, *apart]),
        shared_read=sum(int(node.get("Shared Read Blocks", 0)) for node in [top, *apart]),
        execution_ms=float(explained.get("Execution Time", 0.0)),
        rows=int(top.get("Actual Rows", 0)),
        plan=", ".join(scans) if scans else "no scan of " + " or ".join(tables),
    )


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class QuietVacuum:
    """The quiet-VACUUM state the phase starts from."""

    seconds: float
    live_runs: int
    """Runs not ended when VACUUM ANALYZE ran (0 is the point)."""
    tables: int
    autovacuum_off: tuple[str, ...]
    analysed: int
    """How many of the seeded tables the VACUUM analysed (all of them, unless the
    migration role does not own one)."""


@dataclass(frozen=True)
class SizeResult:
    """One size of the scale phase (0 for the burst before seeding): the seeding, a burst
    and its readings."""

    size: int
    """The size asked for: the seeded runs so far (0 before seeding)."""
    waiting_runs: int
    """The waiting runs counted after seeding."""
    seeded: int
    """Runs seeded for this size (the difference to the size before)."""
    seed_seconds: float
    burst: dict[str, Any] | None
    """Runs, seconds, runs/s, start → first command under the burst, the completion
    poll's cost; None when the burst did not end within its time limit."""
    paced: dict[str, Any] | None
    """Start → first command of runs paced at ``--rate``; None when not measured."""
    rss_mib: float
    claim: PlanCost
    settle: PlanCost | None
    """None before seeding: there is no waiting run to settle."""
    sweep: PlanCost
    doctor_ms: list[float]
    doctor_waiting: int | None
    statistics_untouched: bool
    """No ANALYZE (auto or not) of the seeded tables since the quiet VACUUM."""
    seconds: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        found["claim"] = self.claim.to_json()
        found["settle"] = None if self.settle is None else self.settle.to_json()
        found["sweep"] = self.sweep.to_json()
        return found


@dataclass(frozen=True)
class HeldRuns:
    """The held runs seeded for the run list at scale (:meth:`Scale.seed_held`).

    Held run n was created at ``created_from`` + n seconds, and its attention began (and it
    was last updated) at ``attention_from`` + (n mod :data:`HELD_BATCHES`) minutes: a day
    after the first was created, and two days before the seeding. Every held run is older
    than every waiting run.
    """

    runs: int
    seconds: float
    created_from: datetime
    attention_from: datetime
    batches: int
    split: datetime
    """An instant between the held runs' updates: half the batches were updated before it."""

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        for name in ("created_from", "attention_from", "split"):
            found[name] = getattr(self, name).isoformat()
        return found


# ------------------------------------------------------------------------------ database


Connect = Callable[[], Awaitable[asyncpg.Connection]]


class Scale:
    """The scale phase's database work, on the bench's migration-role connection (and, to
    seed, on more connections from ``connect``)."""

    def __init__(self, db: asyncpg.Connection, namespace: str, connect: Connect) -> None:
        self.db = db
        self.namespace = namespace
        self.queries = Queries(namespace)
        self.connect = connect
        self.seeded = 0
        self.analysed_at_vacuum = 0

    def sql(self, text: str) -> str:
        return text.replace("{ns}", self.queries.identifier)

    async def quiet_vacuum(self) -> QuietVacuum:
        """Autovacuum off for the seeded tables, then ``VACUUM ANALYZE`` of every table of
        the namespace while no run is live (the caller waited for every run to end)."""
        began = time.monotonic()
        analysed_before = await self.analysed()
        for table in SEEDED_TABLES:
            # Only a storage parameter: no lock that waits for the dispatcher's statements.
            await self.db.execute(
                self.sql(f"ALTER TABLE {{ns}}.{table} SET (autovacuum_enabled = false)")
            )
        live = int(await self.db.fetchval(self.sql("SELECT count(*) FROM {ns}.run "
                                                   "WHERE ended_at IS NULL")))  # fmt: skip
        tables = [
            str(name)
            for name in await self.db.fetchval(
                "SELECT array_agg(tablename::text ORDER BY tablename) FROM pg_catalog.pg_tables "
                "WHERE schemaname = $1",
                self.namespace,
            )
        ]
        # The names come from the catalogue; each is quoted as an identifier.
        listed = ", ".join(
            self.queries.identifier + '."' + name.replace('"', '""') + '"' for name in tables
        )
        await self.db.execute(f"VACUUM (ANALYZE) {listed}")
        self.analysed_at_vacuum = await self.analysed()
        return QuietVacuum(
            seconds=round(time.monotonic() - began, 2),
            live_runs=live,
            tables=len(tables),
            autovacuum_off=SEEDED_TABLES,
            analysed=self.analysed_at_vacuum - analysed_before,
        )

    async def analysed(self) -> int:
        """How many times the seeded tables have been analysed, by anyone, so far."""
        # The statistics collector publishes an analyse at its end; give it a moment.
        await asyncio.sleep(0.5)
        return int(await self.db.fetchval(ANALYSED, self.namespace, list(SEEDED_TABLES)))

    async def seed(self, target: int) -> float:
        """Seed waiting runs until ``target`` exist, in batches of :data:`SEED_BATCH` runs
        over :data:`SEED_CONNECTIONS` connections, each batch one transaction; never
        analysed. Answers the seconds it took."""
        template = await self.template()
        batches = seed_batches(self.seeded, target)
        began = time.monotonic()
        extra = [await self.connect() for _ in range(SEED_CONNECTIONS - 1)]
        try:

            async def worker(conn: asyncpg.Connection) -> None:
                while batches:
                    before, count = batches.pop(0)
                    async with conn.transaction():
                        await conn.execute(self.sql(SEED_RUNS), template, count, before)
                        await conn.execute(
                            self.sql(SEED_BINDINGS), template, count, before, "scale-"
                        )
                        await conn.execute(self.sql(SEED_STEPS), WAIT_STEP, count, before)

            await asyncio.gather(*(worker(conn) for conn in [self.db, *extra]))
        finally:
            for conn in extra:
                await conn.close()
        self.seeded = target
        return time.monotonic() - began

    async def template(self) -> str:
        """The run a seeded run copies its workflow, package and principal from."""
        template = await self.db.fetchval(self.sql(TEMPLATE_RUN))
        if template is None:
            raise RuntimeError("no succeeded bench run to copy a seeded run's principal from")
        return str(template)

    async def seed_held(self, count: int) -> HeldRuns:
        """Seed ``count`` runs held with attention (``held-1`` …), each with the bindings of
        a bench run and an uncertain call (see :data:`HELD_SHAPE` and :class:`HeldRuns`), in
        one transaction; never analysed.

        A run's ``attention_since`` is the trigger's to write, from ``{ns}.now()``: each
        batch is inserted under its own ``coordinator.fake_now`` (local to the transaction),
        so the held runs' attention began at :data:`HELD_BATCHES` instants a minute apart,
        and the runs of one batch share theirs (the list breaks the tie by run id)."""
        template = await self.template()
        began = time.monotonic()
        now = await self.db.fetchval(self.sql("SELECT {ns}.now()"))
        base = now.replace(microsecond=0)
        created_from = base - timedelta(days=2)
        attention_from = base - timedelta(days=1)
        async with self.db.transaction():
            for batch in range(HELD_BATCHES):
                at = attention_from + timedelta(minutes=batch)
                await self.db.execute(FAKE_NOW, at.isoformat())
                await self.db.execute(
                    self.sql(HELD_RUNS), template, count, created_from, HELD_BATCHES, batch
                )
            await self.db.execute(FAKE_NOW, "")
            await self.db.execute(self.sql(SEED_BINDINGS), template, count, 0, HELD_PREFIX)
            await self.db.execute(self.sql(HELD_ENDED_STEPS), FIRST_CALL, CHOICE, count)
            await self.db.execute(self.sql(HELD_UNCERTAIN_STEPS), FIRST_CALL, SECOND_CALL, count)
        return HeldRuns(
            runs=count,
            seconds=round(time.monotonic() - began, 2),
            created_from=created_from,
            attention_from=attention_from,
            batches=HELD_BATCHES,
            split=attention_from + timedelta(minutes=HELD_BATCHES // 2),
        )

    async def analyse(self, tables: tuple[str, ...]) -> float:
        """``ANALYZE`` of ``tables`` (of :data:`SEEDED_TABLES`); answers the seconds it
        took."""
        began = time.monotonic()
        listed = ", ".join(f"{{ns}}.{table}" for table in tables if table in SEEDED_TABLES)
        await self.db.execute(self.sql(f"ANALYZE {listed}"))
        return time.monotonic() - began

    async def waiting(self) -> int:
        value = await self.db.fetchval(
            self.sql("SELECT count(*) FROM {ns}.step WHERE step_id = $1 AND state = 'waiting'"),
            WAIT_STEP,
        )
        return int(value)

    async def explain(
        self,
        name: QueryName,
        arguments: str,
        tables: tuple[str, ...],
        before: Callable[[], Awaitable[object]] | None = None,
    ) -> PlanCost:
        """The store's query ``name`` executed once with the generic plan and ``arguments``
        (SQL literals of this module's own making), explained and rolled back; ``before``
        runs first in the same transaction."""
        text = self.queries[name].rstrip().rstrip(";")
        tx = self.db.transaction()
        await tx.start()
        try:
            await self.db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            if before is not None:
                await before()
            await self.db.execute("PREPARE bench_explained AS\n" + text)
            document = await self.db.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_explained({arguments})"
            )
        finally:
            await tx.rollback()
            # A prepared statement belongs to the session, not the transaction.
            await self.db.execute("DEALLOCATE bench_explained")
        return plan_cost_of(json.loads(document)[0], tables)

    async def claim_cost(self) -> PlanCost:
        """One claim of up to :data:`CLAIM_LIMIT` steps."""
        return await self.explain(
            "dispatcher_claim",
            f"'{EXPLAIN_OWNER}', {CLAIM_LIMIT}, {LEASE_SECONDS}",
            ("step",),
        )

    async def settle_cost(self, run_number: int) -> PlanCost:
        """One settle of seeded run ``scale-<run_number>``'s waiting step: it completes with
        a (dummy) wait result kept, and a call step becomes the run's next, due now."""
        run_id = f"scale-{int(run_number)}"

        async def lease() -> None:
            await self.db.execute(self.sql(LEASE_FOR_SETTLE), run_id, WAIT_STEP, EXPLAIN_OWNER)

        nonce = "\\x" + "00" * 12
        settle = ", ".join(
            [
                "'completed'",
                "NULL",
                "ARRAY['wait-result']",
                "ARRAY[1]",
                f"ARRAY['{nonce}'::bytea]",
                "ARRAY['\\x00'::bytea]",
                "ARRAY[]::text[]",
                "ARRAY[]::text[]",
                f"'{SETTLE_NEXT_STEP}'",
                "'call'",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
            ]
        )
        # (the settle_args value as a row: EXECUTE casts it to the prepared statement's type)
        arguments = f"'{run_id}', '{WAIT_STEP}', '{EXPLAIN_OWNER}', ROW({settle})"
        return await self.explain(
            "dispatcher_step_settle", arguments, ("step", "run"), before=lease
        )

    async def sweep_cost(self) -> PlanCost:
        """One lease sweep of up to :data:`SWEEP_LIMIT` expired leases."""
        return await self.explain("dispatcher_expire_leases", str(SWEEP_LIMIT), ("step", "run"))
