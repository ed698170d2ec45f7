"""The scale phase: many waiting runs must cost a dispatcher neither memory nor claim work.

After the measured repeats, the bench seeds ``--waiting-runs`` runs straight into the
coordinator's namespace, as the migration role (which owns the schema), with one
``INSERT … SELECT generate_series`` per table. Each looks like a run waiting for a product
result: run state ``waiting``, the bindings of a real bench run, and one ``wait-for`` step
in state ``waiting`` that has been checked once and is due at its next check, a day or more
from now (spread one second apart), with a timeout two weeks out. That is the shape
``waits_schedule`` leaves behind, and it keeps every seeded step in the ``step_due`` partial
index the claim walks, which is the case that would grow if anything did. No payload rows:
no constraint asks for them and nothing reads them before the step is due.

Two figures are compared before and after seeding:

- the dispatcher's VmRSS, each time right after a short burst of bench runs, so the
  dispatcher has claimed and settled among the waiting runs;
- one claim's cost: ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of the store's own
  ``dispatcher_claim`` text, prepared and run with ``plan_cache_mode = force_generic_plan``
  (the plan a pooled connection's prepared statement may settle on), inside a transaction
  that is rolled back, so nothing is claimed. Nothing is due while it runs, so this is the
  claim an idle or waking dispatcher makes: it should stop at the first future entry of the
  index however many there are.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from core.db.queries import Queries

WAIT_STEP = "await-result"
CLAIM_OWNER = "bench-explain"
CLAIM_LIMIT = 16  # the dispatcher's default concurrency, the most it claims at once
LEASE_SECONDS = 30.0
SHAPE = "run waiting, its bindings, one wait-for step due at its next check a day out"

# Each statement names the namespace as the quoted identifier that core.db.queries made
# after matching it against ^coordinator_[a-z0-9_]+$; nothing else goes into SQL text.
SEED_RUNS = """
INSERT INTO {ns}.run (id, workflow_id, package_digest, principal_iss, principal_sub,
                      client_id, state)
SELECT 'scale-' || i, t.workflow_id, t.package_digest, t.principal_iss, t.principal_sub,
       t.client_id, 'waiting'
  FROM {ns}.run t, generate_series(1, $2::integer) AS i
 WHERE t.id = $1
"""

SEED_BINDINGS = """
INSERT INTO {ns}.binding (run_id, connection, connection_type, base_url, client_id, issuer,
                          scopes, audience, profile, producer)
SELECT 'scale-' || i, b.connection, b.connection_type, b.base_url, b.client_id, b.issuer,
       b.scopes, b.audience, b.profile, b.producer
  FROM {ns}.binding b, generate_series(1, $2::integer) AS i
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
  FROM generate_series(1, $2::integer) AS i
"""

TEMPLATE_RUN = """
SELECT id FROM {ns}.run WHERE state = 'succeeded' ORDER BY created_at DESC LIMIT 1
"""


@dataclass(frozen=True)
class ClaimCost:
    """What one ``dispatcher_claim`` execution touched (the plan's execution part)."""

    shared_hit: int
    shared_read: int
    execution_ms: float
    rows: int
    plan: str

    @property
    def buffers(self) -> int:
        return self.shared_hit + self.shared_read

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "buffers": self.buffers}


@dataclass(frozen=True)
class ScaleResult:
    waiting_runs: int
    seed_seconds: float
    burst_runs: int
    burst_before_rps: float
    burst_after_rps: float | None
    """None when the burst after seeding did not end within its time limit."""
    rss_before_mib: float
    rss_after_mib: float
    claim_before: ClaimCost
    claim_after: ClaimCost

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        found["claim_before"] = self.claim_before.to_json()
        found["claim_after"] = self.claim_after.to_json()
        found["shape"] = SHAPE
        return found


class Scale:
    """The scale phase's database work, on the bench's migration-role connection."""

    def __init__(self, db: asyncpg.Connection, namespace: str) -> None:
        self.db = db
        self.queries = Queries(namespace)

    def sql(self, text: str) -> str:
        return text.replace("{ns}", self.queries.identifier)

    async def seed(self, count: int) -> float:
        """Insert ``count`` waiting runs in one transaction; answers the seconds it took.

        The statistics are left to autovacuum, so the burst that follows meets 100,000 rows
        the planner does not know about yet: the sudden case, which the dispatcher's look
        statements must survive (they walk the due index and look each run up by key, so
        no plan can start from a run table that looks empty)."""
        template = await self.db.fetchval(self.sql(TEMPLATE_RUN))
        if template is None:
            raise RuntimeError("no succeeded bench run to copy a waiting run's principal from")
        began = time.monotonic()
        async with self.db.transaction():
            await self.db.execute(self.sql(SEED_RUNS), template, count)
            await self.db.execute(self.sql(SEED_BINDINGS), template, count)
            await self.db.execute(self.sql(SEED_STEPS), WAIT_STEP, count)
        return time.monotonic() - began

    async def waiting(self) -> int:
        value = await self.db.fetchval(
            self.sql("SELECT count(*) FROM {ns}.step WHERE step_id = $1 AND state = 'waiting'"),
            WAIT_STEP,
        )
        return int(value)

    async def claim_cost(self) -> ClaimCost:
        """One claim, executed with the generic plan and rolled back."""
        claim = self.queries["dispatcher_claim"].rstrip().rstrip(";")
        tx = self.db.transaction()
        await tx.start()
        try:
            await self.db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await self.db.execute("PREPARE bench_claim AS\n" + claim)
            # The arguments are this module's constants.
            text = await self.db.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                f"EXECUTE bench_claim('{CLAIM_OWNER}', {CLAIM_LIMIT}, {LEASE_SECONDS})"
            )
        finally:
            await tx.rollback()
            # A prepared statement belongs to the session, not the transaction.
            await self.db.execute("DEALLOCATE bench_claim")
        return claim_cost_of(json.loads(text)[0])


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def claim_cost_of(explained: dict[str, Any]) -> ClaimCost:
    """The figures of one ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` document."""
    top = explained["Plan"]
    scans = [
        f"{node['Node Type']}"
        + (f" {node['Index Name']}" if node.get("Index Name") else "")
        + f" ({int(node.get('Actual Rows', 0))} rows)"
        for node in _nodes(top)
        if node.get("Relation Name") == "step"
    ]
    return ClaimCost(
        shared_hit=int(top.get("Shared Hit Blocks", 0)),
        shared_read=int(top.get("Shared Read Blocks", 0)),
        execution_ms=float(explained.get("Execution Time", 0.0)),
        rows=int(top.get("Actual Rows", 0)),
        plan="step: " + ", ".join(scans) if scans else "no scan of step",
    )
