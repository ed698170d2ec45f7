"""No statement a component runs per run or per tick may grow with how many runs exist.

The state set up here is the one that cut a burst of runs from about 270 to about 30 runs/s
in the bench: statistics gathered while no run was live (``VACUUM ANALYZE`` on a quiet
night: the partial index of live runs looks empty), then many live runs inserted in bulk
and never analysed. Every named query (``core/db/queries/*.sql``) is then planned as a
pooled connection's prepared statement would plan it (``plan_cache_mode =
force_generic_plan``), and its plan is read node by node. On the tables that grow with the
runs (``run``, ``step``, ``payload``, ``binding``, ``start_identity``, ``tombstone``), a
statement may not

- read a whole table (a sequential scan, a bitmap scan without an index condition);
- walk an index with no condition on it, unless a ``LIMIT`` stops the walk;
- walk ``run_live``, the partial index of every live run, without a ``LIMIT``: a look-up by
  run id that can be planned through it reads all of them;
- walk an index with a condition that leaves out its first column (checked against every
  entry, so the whole index is read). The partial indexes of an operator's backlog
  (:data:`BACKLOG`) may be walked whole once, but not again for each row of another node:
  the run list once looked up each listed run's step that way, through a backlog index that
  began with the step's name, and a page of 100 took over 50 ms among 10,000 held runs.

The step transition functions (``core/db/transitions.sql``) cache the plans of the
statements inside them as a prepared statement does. Each is run on one of the live runs with
``plan_cache_mode = force_generic_plan`` and ``auto_explain`` reporting every nested
statement's plan, and those plans are read the same way.

A few statements look at many runs on purpose (an operator's list, retention, the
activation's live-run checks): :data:`WHOLE_TABLE` names each with the reason it may.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from core.db import statements
from core.db.queries import Queries, identifier_words, load, parameter_count, without_comments
from core.db.query_names import QueryName
from core.db.statements import Statements
from core.runtime import Store
from devstack.postgres import DatabaseHandle, PostgresCluster, PostgresServer
from recovery import reads
from recovery.reads import COUNTED_EXACTLY, run_counts
from tests.helpers.review_kit import WAIT, WORKFLOW, ReviewKit, review_kit
from tests.helpers.scale import insert_ended_runs, insert_waiting_runs

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LIVE = 20_000
"""Live runs inserted after the quiet VACUUM: enough that reading them all is visible."""
ENDED = 2_000
"""Runs that ended before the quiet night: the statistics see a table, but no live run."""
T0 = datetime(2027, 3, 1, 8, 0, tzinfo=UTC)
GROWING = frozenset({"run", "step", "payload", "binding", "start_identity", "tombstone"})
LIVE_RUNS_INDEX = "run_live"
PLANNABLE = ("SELECT", "WITH", "INSERT", "UPDATE", "DELETE")

WHOLE_TABLE: dict[str, str] = {
    "bindings_live": "startup only: every live run's bindings against the runtime file",
    "live_run_count": "plan/apply --remove-workflow only: one workflow's live runs",
    "recovery_snapshot_take": "restore-hold, a one-off operator action: every call step "
    "that may have sent, whatever its run",
    "recovery_leases_drop": "restore-hold, a one-off operator action: every leased step",
    "recovery_retain": "retain, an operator action: ended runs before a cutoff, LIMIT 100",
}
BACKLOG = frozenset(
    {
        "step_uncertain",
        "step_attention",
        "run_attention",
        "run_attention_oldest",
        "run_held",
        "step_retrying",
    }
)
"""Partial indexes of what waits for an operator, or for a product to take its calls again
(``step_retrying``, which doctor counts whole): walking one whole is bounded by that backlog,
not by how many runs exist."""


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[ReviewKit]:
    async with review_kit(tmp_path, database) as made:
        yield made


async def quiet_then_bulk(kit: ReviewKit) -> None:
    """Statistics taken while :data:`ENDED` runs had ended and none was live, then
    :data:`LIVE` live runs nobody analysed."""
    await insert_ended_runs(kit, ENDED, T0)
    tables = await kit.db.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1", kit.deployment.namespace
    )
    for row in tables:
        await kit.db.execute(f'VACUUM ANALYZE {kit.ns}."{row["tablename"]}"')
    await insert_waiting_runs(kit, LIVE, T0, analyze=False)


async def generic_plan(kit: ReviewKit, sql: str) -> dict[str, Any]:
    """The generic plan of ``sql``: the one a pooled connection's prepared statement may
    settle on, made without looking at any parameter's value. (``EXPLAIN`` without
    ``ANALYZE`` plans the statement and runs nothing.)"""
    count = parameter_count(sql)
    async with kit.db.transaction():
        await kit.db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await kit.db.execute(f"PREPARE plan_probe AS {sql}")
        try:
            arguments = f"({', '.join(['NULL'] * count)})" if count else ""
            document = await kit.db.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE plan_probe{arguments}")
        finally:
            await kit.db.execute("DEALLOCATE plan_probe")
    plan: dict[str, Any] = json.loads(document)[0]["Plan"]
    return plan


def nodes(
    plan: dict[str, Any], limited: bool = False, repeated: bool = False
) -> Iterator[tuple[dict[str, Any], bool, bool]]:
    """Every node of ``plan`` with whether a Limit above it stops its walk, and whether it
    runs again for each row of another node (the inner side of a nested loop, a SubPlan
    that is not hashed: a hashed one is run once, into its hash table)."""
    limited = limited or plan.get("Node Type") == "Limit"
    yield plan, limited, repeated
    own = json.dumps({key: value for key, value in plan.items() if key != "Plans"})
    for child in plan.get("Plans", []):
        relationship = child.get("Parent Relationship")
        again = (
            relationship == "SubPlan" and f"hashed {child.get('Subplan Name')}" not in own
        ) or (plan.get("Node Type") == "Nested Loop" and relationship == "Inner")
        yield from nodes(child, limited, repeated or again)


async def first_columns(conn: asyncpg.Connection, namespace: str) -> dict[str, str]:
    """The first key column of every index of ``namespace``, by index name."""
    rows = await conn.fetch(
        "SELECT c.relname AS index, a.attname AS first"
        "  FROM pg_index i"
        "  JOIN pg_class c ON c.oid = i.indexrelid"
        "  JOIN pg_namespace n ON n.oid = c.relnamespace"
        "  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE n.nspname = $1",
        namespace,
    )
    return {str(row["index"]): str(row["first"]) for row in rows}


def faults(plan: dict[str, Any], firsts: Mapping[str, str]) -> list[str]:
    """What in ``plan`` reads more than the rows a statement is about. ``firsts`` is
    :func:`first_columns`: a condition that leaves out an index's first column is checked
    against every entry of the index, a walk of the whole of it. A backlog's index may be
    walked whole once, but not again for each row of another node."""
    found = []
    for node, limited, repeated in nodes(plan):
        relation = node.get("Relation Name")
        index = node.get("Index Name")
        kind = node["Node Type"]
        if index == LIVE_RUNS_INDEX and not limited:
            found.append(f"{kind} on {index}")
        if relation not in GROWING and not (index or "").startswith(tuple(GROWING)):
            continue
        condition = node.get("Index Cond")
        first = firsts.get(index or "")
        counts = repeated or index not in BACKLOG
        if condition and first and counts and not re.search(rf"\b{first}\b", condition):
            again = " for each row" if repeated else ""
            found.append(f"{kind} on {index} walks it whole{again}: {condition} leaves out {first}")
        if index in BACKLOG:
            continue
        if kind == "Seq Scan":
            found.append(f"Seq Scan on {relation}")
        elif kind in ("Index Scan", "Index Only Scan") and not limited:
            if "Index Cond" not in node:
                found.append(f"{kind} on {index} without a condition")
        elif kind == "Bitmap Index Scan" and "Index Cond" not in node:
            found.append(f"Bitmap Index Scan on {index} without a condition")
    return found


async def test_no_per_run_statement_reads_every_live_run(kit: ReviewKit) -> None:
    await quiet_then_bulk(kit)
    queries = Queries(kit.deployment.namespace)
    firsts = await first_columns(kit.db, kit.deployment.namespace)
    checked, offending = [], {}
    for name, text in sorted(load().items()):
        if identifier_words(text) or name in WHOLE_TABLE:
            continue  # (statements on roles and schemas, and the deliberate ones above)
        sql = queries[name]
        if not without_comments(sql).lstrip().upper().startswith(PLANNABLE):
            continue
        plan = await generic_plan(kit, sql)
        checked.append(name)
        if found := faults(plan, firsts):
            offending[name] = found
    assert len(checked) > 70, checked  # (the check itself must not go quiet)
    assert offending == {}, "\n".join(f"{n}: {f}" for n, f in sorted(offending.items()))


LEASE = (
    "UPDATE {ns}.step SET lease_owner = 'plan-probe', lease_epoch = (SELECT epoch FROM {ns}.hold),"
    " lease_expires_at = {ns}.now() + interval '1 minute'{more} WHERE run_id = $1 AND step_id = $2"
)
NONCE = bytes(12)
TRANSITIONS: dict[str, tuple[QueryName, str, tuple[object, ...]]] = {
    # (query, what the leased step is made first — after "cancel", its run is cancelling —,
    # arguments after run, step and owner)
    "a settle that passes a local step and makes the next due": (
        "dispatcher_step_settle",
        "",
        (("completed", None, ["wait-result"], [1], [NONCE], [b"x"], ["decide"],
          ["choose"], "notify", "call", None, None, None, None),),
    ),
    "a settle that prepares the next call": (
        "dispatcher_step_settle_chain",
        "",
        (("completed", None, ["wait-result"], [1], [NONCE], [b"x"], ["decide"],
          ["choose"], "notify", "call", None, None, None, None),
         30.0, 1, NONCE, b"x", "plan-probe-key", 3600),
    ),
    "a settle that fails the run": (
        "dispatcher_step_settle",
        "",
        (("failed", None, [], [], [], [], [], [], None, None, "failed", None, "refused",
          None),),
    ),
    "a settle of a step a cancel abandoned": (
        "dispatcher_step_settle",
        "cancel",
        (("cancelled", None, [], [], [], [], [], [], None, None, None, None, None, None),),
    ),
    "an unknown effect that holds the run": (
        "dispatcher_step_uncertain",
        ", step_type = 'call', state = 'prepared'",
        ("connection-lost", None),
    ),
    "an unknown effect on a step a cancel abandoned": (
        "dispatcher_step_uncertain",
        "cancel, step_type = 'call', state = 'prepared'",
        ("status-5xx", 502),
    ),
    "a retry that makes the step due again": (
        "dispatcher_step_retry",
        ", step_type = 'call', state = 'prepared', deadline_at = {ns}.now() + interval '1 day'",
        (5.0, "tls-refused", "tls-refused", None, 600.0),
    ),
    "a retry of a call retrying too long": (
        "dispatcher_step_retry",
        ", step_type = 'call', state = 'prepared', deadline_at = {ns}.now() + interval '1 day',"
        " retry_since = {ns}.now() - interval '1 hour'",
        (5.0, None, "status-503", 503, 600.0),
    ),
    "a retry that misses the deadline": (
        "dispatcher_step_retry",
        ", step_type = 'call', state = 'prepared', deadline_at = {ns}.now()",
        (5.0, None, "status-429", 429, 600.0),
    ),
    "a retry of a step a cancel abandoned": (
        "dispatcher_step_retry",
        "cancel, step_type = 'call', state = 'prepared'",
        (5.0, None, "never-connected", None, 600.0),
    ),
    "a wait until an instant": (
        "dispatcher_step_wait",
        "",
        (datetime(2030, 1, 1, tzinfo=UTC), None),
    ),
    "a wait of a step a cancel abandoned": (
        "dispatcher_step_wait",
        "cancel",
        (None, None),
    ),
    "a plan before a read of a result": (
        "waits_plan_check",
        "",
        (bytes(32), 3600.0, 60.0, True),
    ),
    "a read that schedules the next check": (
        "waits_record_read",
        ", next_check_at = {ns}.now() + interval '1 minute'",
        (False, False, True, ("completed", None, [], [], [], [], [], [], None, None, None,
                              None, None, None)),
    ),
    "a read that ends the wait": (
        "waits_record_read",
        "",
        (True, False, None, ("completed", None, ["wait-result"], [1], [NONCE], [b"x"],
                             ["decide"], ["choose"], "notify", "call", None, None, None, None)),
    ),
    "a prepare after a refused token": (
        "dispatcher_step_prepare",
        ", step_type = 'call', state = 'ready', cause = 'token-refused'",
        (None, 1, NONCE, b"x", "command-key", 60),
    ),
    "a prepare after retrying too long": (
        "dispatcher_step_prepare",
        ", step_type = 'call', state = 'ready', cause = 'retrying', retry_cause = 'status-503',"
        " retry_status = 503, retry_last_at = {ns}.now(), retry_since = {ns}.now()",
        (None, 1, NONCE, b"x", "command-key", 60),
    ),
    "a release of a prepared step": (
        "dispatcher_step_release",
        ", step_type = 'call', state = 'prepared'",
        (5.0,),
    ),
    "a release of a waiting step": (
        "dispatcher_step_release",
        "",
        (5.0,),
    ),
    "an expired lease on a prepared step of a cancelled run": (
        "dispatcher_expire_leases",
        "cancel, step_type = 'call', state = 'prepared'",
        (10,),
    ),
    "an operator's settle of an accepted call": (
        "recovery_step_settle",
        "operator state = 'uncertain', step_type = 'call', effect = 'unknown', due_at = NULL",
        (("completed", "accepted", ["response"], [1], [NONCE], [b"x"], [], [], "notify",
          "call", None, None, None, None),),
    ),
    "an operator's settle that fails the run": (
        "recovery_step_settle",
        "operator state = 'uncertain', step_type = 'call', effect = 'unknown', due_at = NULL",
        (("failed", "accepted", [], [], [], [], [], [], None, None, "failed", None,
          "mapping-invalid", "/x"),),
    ),
    "a receipt that proves the command never arrived": (
        "recovery_step_not_sent",
        "operator state = 'uncertain', step_type = 'call', effect = 'unknown', due_at = NULL",
        (),
    ),
    "a retry-same": (
        "recovery_step_retry_same",
        "operator state = 'not-sent', step_type = 'call', due_at = NULL",
        (),
    ),
    "a cancel with an onCancel step": (
        "recovery_run_cancel",
        "run",
        ("apology", "call"),
    ),
    "a cancel without one": (
        "recovery_run_cancel",
        "run",
        (None, None),
    ),
}  # fmt: skip
SWEEPS: frozenset[QueryName] = frozenset({"dispatcher_expire_leases"})
"""Transitions that find their steps themselves (every expired lease): called with their
arguments alone, after the step's lease is made to lapse."""
OPERATOR = "UPDATE {ns}.step SET {change} WHERE run_id = $1 AND step_id = $2"
"""A step made ready for an operator's action (a change starting "operator"), which names the
step's row version where a dispatcher names its lease; a change of "run" acts on the run
alone."""


@contextlib.asynccontextmanager
async def explained(conn: asyncpg.Connection, *settings: str) -> AsyncIterator[list[Any]]:
    """A transaction on ``conn`` in which auto_explain (which only a superuser may load:
    ``conn`` is one) reports the plan of every statement, nested ones included, as JSON; it
    yields the list the plans arrive in, and is rolled back, so nothing changes."""
    plans: list[dict[str, Any]] = []

    def heard(_conn: object, message: Any) -> None:
        text = str(message.message)
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])

    conn.add_log_listener(heard)
    transaction = conn.transaction()
    await transaction.start()
    try:
        for setting in (
            "LOAD 'auto_explain'",
            "SET LOCAL auto_explain.log_min_duration = 0",
            "SET LOCAL auto_explain.log_nested_statements = on",
            "SET LOCAL auto_explain.log_format = json",
            "SET LOCAL auto_explain.log_level = notice",
            "SET LOCAL client_min_messages = notice",
            *settings,
        ):
            await conn.execute(setting)
        yield plans
    finally:
        await transaction.rollback()
        conn.remove_log_listener(heard)


async def nested_plans(
    conn: asyncpg.Connection, sql: str, arguments: tuple[object, ...]
) -> tuple[list[dict[str, Any]], object]:
    """The plans of every statement a transition function runs for ``sql``, each planned as
    the function's cached plan would be on a pooled connection (generic), with the outcome
    the call answered (see :func:`explained`)."""
    async with explained(conn, "SET LOCAL plan_cache_mode = force_generic_plan") as plans:
        row = await conn.fetchrow(sql, *arguments)
    return plans, None if row is None else dict(row).get("outcome")


async def test_no_transition_function_reads_every_live_run(
    kit: ReviewKit, postgres_server: PostgresCluster, database: DatabaseHandle
) -> None:
    if not isinstance(postgres_server, PostgresServer):
        pytest.skip("auto_explain is loaded by a superuser, which an external server lends none")
    await quiet_then_bulk(kit)
    superuser = await postgres_server.superuser_connect(database.database)
    queries = Queries(kit.deployment.namespace)
    firsts = await first_columns(kit.db, kit.deployment.namespace)
    offending: dict[str, list[str]] = {}
    for number, (case, (name, change, arguments)) in enumerate(sorted(TRANSITIONS.items())):
        run_id = f"scale-{LIVE // 2 + number}"
        if change.startswith("cancel"):
            await kit.db.execute(f"UPDATE {kit.ns}.run SET cancelling = true WHERE id = $1", run_id)
            change = change.removeprefix("cancel")
        if change == "run":
            arguments = (run_id, *arguments)
        elif change.startswith("operator"):
            change = change.removeprefix("operator").format(ns=kit.ns)
            await kit.db.execute(OPERATOR.format(ns=kit.ns, change=change), run_id, WAIT)
            version = await kit.db.fetchval(
                f"SELECT xmin::text FROM {kit.ns}.step WHERE run_id = $1 AND step_id = $2",
                run_id,
                WAIT,
            )
            arguments = (run_id, WAIT, version, *arguments)
        else:
            await kit.db.execute(
                LEASE.format(ns=kit.ns, more=change.format(ns=kit.ns)), run_id, WAIT
            )
            if name in SWEEPS:
                await kit.db.execute(
                    f"UPDATE {kit.ns}.step SET lease_expires_at = {kit.ns}.now()"
                    " - interval '1 second' WHERE run_id = $1",
                    run_id,
                )
            else:
                arguments = (run_id, WAIT, "plan-probe", *arguments)
        plans, outcome = await nested_plans(superuser, queries[name], arguments)
        # (each case reaches the writes it is about, not a refusal)
        assert outcome not in ("lease-lost", "restore-held", "changed"), (case, outcome)
        # (the statement itself, and each statement inside the functions it calls: at least
        # a read and a write besides it)
        assert len(plans) >= 3, (case, len(plans))
        found = [fault for plan in plans for fault in faults(plan, firsts)]
        if found:
            offending[case] = found
    await superuser.close()
    assert offending == {}, offending


LIST_FILTERS: dict[str, dict[str, Any]] = {
    "every run": {},
    "every run, oldest first": {"order": "oldest"},
    "attention": {"attention": "true"},
    "attention, oldest first": {"attention": "true", "order": "oldest"},
    "no attention": {"attention": "false"},
    "held": {"state": "held"},
    "waiting, oldest first": {"state": "waiting", "order": "oldest"},
    "one workflow": {"workflow_id": WORKFLOW},
    "a step": {"step": WAIT},
    "a cause, oldest first": {"cause": "status-5xx", "order": "oldest"},
    # updatedBefore narrows what another filter's index finds: no index has updated_at,
    # which every write of a run changes (one would make each of them a non-HOT update).
    # Alone, or with a state most runs are in, it reads the runs (docs/api.md says so).
    "updated before, attention": {"attention": "true", "updated_before": "2027-03-01T07:00:00Z"},
    "updated before, held": {"state": "held", "updated_before": "2027-03-01T07:00:00Z"},
    "a principal's": {"principal": ("https://issuer.example.org", "scale")},
    "a principal's held, updated before": {
        "principal": ("https://issuer.example.org", "scale"),
        "state": "held",
        "updated_before": "2027-03-01T07:00:00Z",
    },
    "a run id prefix": {"run_id_prefix": "8e5d"},
    "a whole run id, a principal's": {
        "run_id_prefix": "8e5d07f1-3c2a-8b4e-9d6f-0a1b2c3d4e5f",
        "principal": ("https://issuer.example.org", "scale"),
    },
}
"""Each filter of ``GET /v1/runs`` (CONTRACT §8.2) alone, and a few together, and the
searches by run id (a start key's search is one by the whole id it derives)."""


async def listed_plans(conn: asyncpg.Connection, namespace: str, wanted: Any) -> list[Any]:
    """The plans of the statements a list request runs (its page and its total), planned as
    reads.list_runs has them planned: for their values (see :func:`explained`)."""
    async with explained(conn) as plans:
        await statements.session_plans_per_call(conn)
        queries = Statements(namespace)
        await reads._page(conn, queries, wanted)
        await reads._total(conn, queries, wanted)
    return plans


async def test_every_list_filter_is_served_by_an_index(
    kit: ReviewKit, postgres_server: PostgresCluster, database: DatabaseHandle
) -> None:
    if not isinstance(postgres_server, PostgresServer):
        pytest.skip("auto_explain is loaded by a superuser, which an external server lends none")
    await quiet_then_bulk(kit)
    superuser = await postgres_server.superuser_connect(database.database)
    firsts = await first_columns(kit.db, kit.deployment.namespace)
    offending: dict[str, list[str]] = {}
    try:
        # With the statistics of the quiet night, then with statistics that know the runs.
        for statistics in ("stale", "analysed"):
            if statistics == "analysed":
                await kit.db.execute(f"ANALYZE {kit.ns}.run, {kit.ns}.step")
            for case, params in LIST_FILTERS.items():
                wanted = reads.ListFilter.build(workflows=(WORKFLOW,), **params)
                plans = await listed_plans(superuser, kit.deployment.namespace, wanted)
                # (the page and the count, each planned; set_config is a plan too)
                assert len(plans) >= 2, (case, len(plans))
                found = [fault for plan in plans for fault in faults(plan, firsts)]
                if found:
                    offending[f"{case} ({statistics} statistics)"] = found
    finally:
        await superuser.close()
    assert offending == {}, offending


async def test_the_plan_check_sees_a_statement_that_reads_every_live_run(
    kit: ReviewKit,
) -> None:
    await quiet_then_bulk(kit)
    # A look-up by id whose condition implies run_live's predicate: the shape the settle
    # statements had (with "ended_at IS NULL", run_live's predicate until issue 24).
    bad = await generic_plan(
        kit,
        f"SELECT 1 FROM {kit.ns}.run WHERE id = $1 AND state IN ('running', 'waiting', 'held')",
    )
    whole = await generic_plan(kit, f"SELECT count(*) FROM {kit.ns}.step")
    good = await generic_plan(kit, f"SELECT 1 FROM {kit.ns}.run WHERE id = $1")
    firsts = await first_columns(kit.db, kit.deployment.namespace)
    assert "Index Scan on run_live" in faults(bad, firsts)
    assert faults(whole, firsts) != []
    assert faults(good, firsts) == []
    # A condition on a later column of an index is checked against all of it (the shape
    # step_attention's look-up by run had while the index began with the step's name).
    assert firsts["step_pkey"] == "run_id"
    await kit.db.execute("SET enable_seqscan = off")
    try:
        by_name = await generic_plan(kit, f"SELECT 1 FROM {kit.ns}.step WHERE step_id = $1")
    finally:
        await kit.db.execute("RESET enable_seqscan")
    assert [fault for fault in faults(by_name, firsts) if "leaves out run_id" in fault], by_name


async def test_runs_per_state_are_exact_up_to_the_cap_and_estimated_past_it(
    kit: ReviewKit,
) -> None:
    await quiet_then_bulk(kit)
    store = Store(kit.runtime, "recovery")
    kit.stores.append(store)
    await store.open()
    async with store.connection() as conn:
        stale = await run_counts(conn, store.queries)
        await kit.db.execute(f"ANALYZE {kit.ns}.run")
        analysed = await run_counts(conn, store.queries)
    # Under the cap: exact. Past it, the statistics' estimate — which, taken while no run
    # was live, says none: the count then says at least the cap, never a made-up zero.
    assert stale["succeeded"] == analysed["succeeded"] == ENDED
    assert stale["held"] == stale["running"] == 0
    assert stale["waiting"] == COUNTED_EXACTLY + 1
    assert LIVE * 0.9 <= analysed["waiting"] <= LIVE * 1.1
