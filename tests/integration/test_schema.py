"""Schema version 4: install, verification, drift, earlier layouts, clock and channels."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from core import deploy
from core.db.connect import connect
from core.db.queries import Queries, load
from core.db.query_names import IDENTIFIERS
from core.db.roles import component_role
from core.db.schema import catalog_dump, drift, render_schema, render_transitions
from core.errors import CoordinatorError
from devstack.postgres import DatabaseHandle
from tests.helpers.deployment import (
    TestDeployment,
    drop_deployment,
    insert_run,
    migration_connection,
    unique_namespace,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
async def deployment(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[TestDeployment]:
    made = TestDeployment.create(tmp_path, database)
    yield made
    await drop_deployment(database, made.namespace)


@pytest.fixture
async def migrator(database: DatabaseHandle) -> AsyncIterator[asyncpg.Connection]:
    conn = await migration_connection(database)
    yield conn
    await conn.close()


def _normal(text: str | None, namespace: str) -> str:
    return re.sub(rf'"?{namespace}"?(?![a-z0-9_])', "NS", text or "")


async def _columns(conn: asyncpg.Connection, namespace: str) -> set[tuple[str, ...]]:
    rows = await conn.fetch(
        """
        SELECT table_name::text, column_name::text, data_type::text, is_nullable::text,
               column_default::text, is_identity::text
          FROM information_schema.columns WHERE table_schema = $1
        """,
        namespace,
    )
    return {tuple(_normal(value, namespace) for value in row) for row in rows}


async def _indexes(conn: asyncpg.Connection, namespace: str) -> set[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1", namespace
    )
    return {(row[0], _normal(row[1], namespace)) for row in rows}


async def test_the_applied_schema_equals_schema_sql(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    await deploy.apply(deployment.checked(), [])
    direct = unique_namespace("direct")
    await migrator.execute(f'CREATE SCHEMA "{direct}"')
    try:
        await migrator.execute(render_schema(direct))
        await migrator.execute(render_transitions(direct))
        applied_columns = await _columns(migrator, deployment.namespace)
        assert len(applied_columns) > 100
        assert applied_columns == await _columns(migrator, direct)
        applied_indexes = await _indexes(migrator, deployment.namespace)
        assert (
            "step_due",
            "CREATE INDEX step_due ON NS.step USING btree (due_at) "
            "WHERE ((due_at IS NOT NULL) AND (lease_owner IS NULL))",
        ) in applied_indexes
        assert applied_indexes == await _indexes(migrator, direct)
        assert await catalog_dump(migrator, deployment.namespace) == await catalog_dump(
            migrator, direct
        )
    finally:
        await migrator.execute(f'DROP SCHEMA "{direct}" CASCADE')


DRIFTS = {
    "an added column": ("ALTER TABLE {ns}.run ADD COLUMN note text", "column run.note"),
    "a dropped index": ("DROP INDEX {ns}.step_due", "index step_due is missing"),
    "a changed default": (
        "ALTER TABLE {ns}.step ALTER COLUMN attempts SET DEFAULT 1",
        "column step.attempts differs",
    ),
    "a replaced function": (
        "CREATE OR REPLACE FUNCTION {ns}.now() RETURNS timestamptz LANGUAGE sql STABLE "
        "AS $$ SELECT clock_timestamp() $$",
        "function now() differs",
    ),
    "an added function": (
        "CREATE FUNCTION {ns}.extra() RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$",
        "function extra() is not part of version 4",
    ),
    "a changed argument type": (
        "ALTER TYPE {ns}.settle_args ADD ATTRIBUTE note text",
        "column settle_args.note is not part of version 4",
    ),
}


@pytest.mark.parametrize("change", sorted(DRIFTS))
async def test_drift_is_refused(
    change: str, deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    statement, words = DRIFTS[change]
    await migrator.execute(statement.format(ns=f'"{deployment.namespace}"'))
    with pytest.raises(CoordinatorError) as refused:
        await deploy.apply(checked, [])
    assert refused.value.code == "deployment.refused"
    assert words in refused.value.detail


async def test_apply_puts_the_transition_functions_of_its_release_in_place(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = f'"{deployment.namespace}"'
    # An earlier release's run_close_cancelled, say: same arguments, another body.
    await migrator.execute(
        f"""CREATE OR REPLACE FUNCTION {ns}.run_close_cancelled(p_run text, p_step text)
            RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN RETURN false; END $$"""
    )
    [found] = await drift(migrator, deployment.namespace)
    assert found.startswith("function run_close_cancelled(p_run text,")
    assert found.endswith(" differs")

    await deploy.apply(checked, [])
    assert await drift(migrator, deployment.namespace) == []


async def test_apply_over_a_build_before_chained_settles_leaves_one_step_settle(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = f'"{deployment.namespace}"'
    # What an earlier build of this version left: step_settle without the next call's
    # arguments, and step_settle_chain around it.
    await migrator.execute(
        f"""CREATE FUNCTION {ns}.step_settle(
                p_run text, p_step text, p_owner text, p_settle {ns}.settle_args,
                OUT outcome text, OUT run_state text)
            LANGUAGE plpgsql AS $$ BEGIN outcome := 'written'; END $$;
            CREATE FUNCTION {ns}.step_settle_chain(
                p_run text, p_step text, p_owner text, p_settle {ns}.settle_args,
                p_lease_seconds float8, p_key_version integer, p_nonce bytea,
                p_ciphertext bytea, p_command_key text, p_deadline_seconds integer,
                OUT outcome text)
            LANGUAGE plpgsql AS $$ BEGIN outcome := 'written'; END $$"""
    )
    found = await drift(migrator, deployment.namespace)
    assert [line.split("(")[0] for line in found] == [
        "function step_settle",
        "function step_settle_chain",
    ]
    assert all(line.endswith("is not part of version 4") for line in found)

    await deploy.apply(checked, [])
    assert await drift(migrator, deployment.namespace) == []
    left = await migrator.fetch(
        "SELECT p.proname, p.pronargs FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = $1 AND p.proname LIKE 'step_settle%'",
        deployment.namespace,
    )
    assert [tuple(row) for row in left] == [("step_settle", 10)]


# The transition functions as the release before settle_args (issue 39) installed them: the
# ends of a step as 14 positional arguments. Their bodies do not matter here.
EARLIER_SIGNATURES = (
    "step_settle(p_run text, p_step text, p_owner text, p_state text, p_effect text, "
    "p_purposes text[], p_key_versions integer[], p_nonces bytea[], p_ciphertexts bytea[], "
    "p_passed_ids text[], p_passed_types text[], p_next text, p_next_type text, "
    "p_run_state text, p_outcome text, p_failure_kind text, p_failure_path text, "
    "OUT outcome text, OUT run_state text)",
    "step_operator_settle(p_run text, p_step text, p_version text, p_state text, "
    "p_effect text, p_purposes text[], p_key_versions integer[], p_nonces bytea[], "
    "p_ciphertexts bytea[], p_passed_ids text[], p_passed_types text[], p_next text, "
    "p_next_type text, p_run_state text, p_outcome text, p_failure_kind text, "
    "p_failure_path text, OUT outcome text, OUT run_state text)",
    "step_record_read(p_run text, p_step text, p_owner text, p_ends boolean, "
    "p_may_time_out boolean, p_attention boolean, p_purposes text[], "
    "p_key_versions integer[], p_nonces bytea[], p_ciphertexts bytea[], "
    "p_passed_ids text[], p_passed_types text[], p_next text, p_next_type text, "
    "p_run_state text, p_outcome text, OUT outcome text, OUT run_state text, "
    "OUT ended boolean)",
)


async def test_apply_over_the_release_before_the_argument_types_leaves_no_old_signature(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = f'"{deployment.namespace}"'
    # What that release left: no argument types, and its functions under their signatures.
    await migrator.execute(
        f"DROP TYPE {ns}.settle_args, {ns}.start_args, {ns}.binding_args CASCADE"
    )
    for signature in EARLIER_SIGNATURES:
        await migrator.execute(
            f"CREATE FUNCTION {ns}.{signature} LANGUAGE plpgsql "
            "AS $$ BEGIN outcome := 'written'; END $$"
        )
    assert len(await drift(migrator, deployment.namespace)) > len(EARLIER_SIGNATURES)

    await deploy.apply(checked, [])
    assert await drift(migrator, deployment.namespace) == []
    left = await migrator.fetchval(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = $1"
        " AND p.proname IN ('step_settle', 'step_operator_settle', 'step_record_read')",
        deployment.namespace,
    )
    assert left == 3


async def test_apply_keeps_the_argument_types_it_finds(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = f'"{deployment.namespace}"'
    types = ("settle_args", "binding_args", "start_args")
    before = [await migrator.fetchval(f"SELECT '{ns}.{name}'::regtype::oid") for name in types]
    await deploy.apply(checked, [])
    after = [await migrator.fetchval(f"SELECT '{ns}.{name}'::regtype::oid") for name in types]
    # The same types, not new ones of the same name: what a connection prepared and
    # asyncpg's codec name stays valid across an apply.
    assert after == before
    assert await drift(migrator, deployment.namespace) == []


async def test_an_earlier_layout_is_refused(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    ns = f'"{deployment.namespace}"'
    # What a version-3 namespace looks like from here: its own tables and version 3.
    await migrator.execute(
        f"CREATE SCHEMA {ns}; "
        f"CREATE TABLE {ns}.schema_version (version integer PRIMARY KEY); "
        f"INSERT INTO {ns}.schema_version VALUES (3); "
        f"CREATE TABLE {ns}.runs (id text PRIMARY KEY, state text)"
    )
    with pytest.raises(CoordinatorError) as refused:
        await deploy.apply(deployment.checked(), [])
    assert refused.value.code == "deployment.schema-too-old"
    assert "version 3" in refused.value.detail
    # Nothing was installed beside it.
    tables = await migrator.fetchval(
        "SELECT count(*) FROM pg_tables WHERE schemaname = $1", deployment.namespace
    )
    assert tables == 2


async def test_a_later_or_unknown_layout_is_refused(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    ns = f'"{deployment.namespace}"'
    await migrator.execute(f"CREATE SCHEMA {ns}; CREATE TABLE {ns}.things (id int)")
    with pytest.raises(CoordinatorError) as unknown:
        await deploy.apply(deployment.checked(), [])
    assert unknown.value.code == "deployment.refused"
    assert "no schema version" in unknown.value.detail

    await migrator.execute(
        f"CREATE TABLE {ns}.schema_version (version integer PRIMARY KEY); "
        f"INSERT INTO {ns}.schema_version VALUES (5)"
    )
    with pytest.raises(CoordinatorError) as later:
        await deploy.apply(deployment.checked(), [])
    assert later.value.code == "deployment.refused"
    assert "version 5" in later.value.detail


async def test_an_empty_precreated_schema_is_installed_into(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    await migrator.execute(f'CREATE SCHEMA "{deployment.namespace}"')
    checked = deployment.checked()
    await deploy.apply(checked, [])
    assert (await deploy.status(checked)).schema_version == 4


async def test_the_sql_clock_can_be_moved(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    await deploy.apply(deployment.checked(), [])
    ns = f'"{deployment.namespace}"'
    await migrator.execute("SET coordinator.fake_now = '2031-05-06T07:08:09Z'")
    assert await migrator.fetchval(f"SELECT {ns}.now()") == datetime(
        2031, 5, 6, 7, 8, 9, tzinfo=UTC
    )
    await migrator.execute("RESET coordinator.fake_now")
    real = await migrator.fetchval(f"SELECT {ns}.now()")
    assert abs((real - datetime.now(UTC)).total_seconds()) < 60


async def test_due_work_notifies_and_uses_the_partial_index(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = f'"{deployment.namespace}"'
    run_id = await insert_run(
        deployment.database,
        deployment.namespace,
        "approval-notice",
        checked.packages["approval-notice"].digest,
    )
    woke = asyncio.Event()
    channels: list[str] = []

    def heard(_conn: object, _pid: int, channel: str, _payload: str) -> None:
        channels.append(channel)
        woke.set()

    listener = await migration_connection(deployment.database)
    # Admission makes the first step due, as the service will: the trigger must fire for a
    # role that may not execute the trigger function itself.
    admission = await connect(deployment.database.runtime_url, deployment.database.ca_pem)
    try:
        await listener.add_listener(f"{deployment.namespace}_due", heard)
        await admission.execute(f'SET ROLE "{component_role(deployment.namespace, "admission")}"')
        await admission.execute(
            f"INSERT INTO {ns}.step (run_id, step_id, seq, step_type, due_at) "
            f"VALUES ($1, 'call-notices', 1, 'call', {ns}.now())",
            run_id,
        )
        await asyncio.wait_for(woke.wait(), timeout=10)
        assert channels == [f"{deployment.namespace}_due"]
    finally:
        await admission.close()
        await listener.close()

    await migrator.execute("SET enable_seqscan = off")
    plan = "\n".join(
        row[0]
        for row in await migrator.fetch(
            f"EXPLAIN SELECT run_id FROM {ns}.step "
            f"WHERE due_at <= {ns}.now() AND lease_owner IS NULL ORDER BY due_at LIMIT 10"
        )
    )
    assert "step_due" in plan


async def test_state_key_versions_in_use_lists_each_version_once(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = f'"{deployment.namespace}"'
    digest = checked.packages["approval-notice"].digest
    for version in (3, 1, 3, 7):
        run_id = await insert_run(
            deployment.database, deployment.namespace, "approval-notice", digest
        )
        await migrator.execute(
            f"INSERT INTO {ns}.payload (run_id, purpose, key_version, nonce, ciphertext) "
            "VALUES ($1, 'input', $2, $3, $4)",
            run_id,
            version,
            bytes(12),
            b"\x01",
        )
    versions = [
        row[0] for row in await migrator.fetch(f"SELECT * FROM {ns}.state_key_versions_in_use()")
    ]
    assert versions == [1, 3, 7]


async def test_every_named_query_prepares_against_an_installed_namespace(
    deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    await deploy.apply(deployment.checked(), [])
    queries = Queries(deployment.namespace)
    for name in load():
        # A query that takes identifiers is prepared with a probe name in each place.
        words = IDENTIFIERS.get(name, ())
        identifiers = dict.fromkeys(words, "coordinator_probe")
        sql = queries.with_identifiers(name, **identifiers) if words else queries[name]
        await migrator.prepare(sql)


# Rows that break one rule each, written straight to the table, and the rule the refusal
# names. The value that breaks it (a made-up state, a run id) never appears in the message.
BROKEN_ROWS = {
    "a run state": (
        "INSERT INTO {ns}.run (id, workflow_id, package_digest, principal_iss, principal_sub, "
        "state) SELECT 'run-ok-1', workflow_id, package_digest, 'i', 's', 'finished' "
        "FROM {ns}.run LIMIT 1",
        "a run row breaks the rule: state is a run state",
        "finished",
    ),
    "a run id": (
        "INSERT INTO {ns}.run (id, workflow_id, package_digest, principal_iss, principal_sub) "
        "SELECT 'run id!', workflow_id, package_digest, 'i', 's' FROM {ns}.run LIMIT 1",
        "a run row breaks the rule: id is 1 to 64 id characters",
        "run id!",
    ),
    "an ended run without its end": (
        "UPDATE {ns}.run SET state = 'succeeded', outcome = 'done'",
        "a run row breaks the rule: a run has ended_at exactly when it ended",
        "succeeded",
    ),
    "a step state": (
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state) "
        "SELECT id, 'a-step', 1, 'call', 'sleeping' FROM {ns}.run",
        "a step row breaks the rule: state is a step state",
        "sleeping",
    ),
    "a step's seq": (
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type) "
        "SELECT id, 'a-step', 0, 'call' FROM {ns}.run",
        "a step row breaks the rule: seq > 0",
        "a-step",
    ),
    "half a lease": (
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, lease_owner) "
        "SELECT id, 'a-step', 1, 'call', 'dispatcher-x' FROM {ns}.run",
        "a step row breaks the rule: a lease has an owner, an expiry and an epoch",
        "dispatcher-x",
    ),
    "a command of a choose": (
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, command_key) "
        "SELECT id, 'a-step', 1, 'choose', 'key-x' FROM {ns}.run",
        "a step row breaks the rule: only a call has a command",
        "key-x",
    ),
    "retrying without its record": (
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, cause) "
        "SELECT id, 'a-step', 1, 'call', 'retrying' FROM {ns}.run",
        "a step row breaks the rule: retrying has a retry record",
        "a-step",
    ),
    "a short nonce": (
        "INSERT INTO {ns}.payload (run_id, purpose, key_version, nonce, ciphertext) "
        "SELECT id, 'input', 1, '\\x0102'::bytea, '\\x01'::bytea FROM {ns}.run",
        "a payload row breaks the rule: a nonce has 12 bytes",
        "0102",
    ),
    "a command of no step": (
        "INSERT INTO {ns}.payload (run_id, purpose, key_version, nonce, ciphertext) "
        "SELECT id, 'command', 1, '\\x000000000000000000000000'::bytea, '\\x01'::bytea "
        "FROM {ns}.run",
        "a payload row breaks the rule: only an input or an event belongs to no step",
        "command",
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_ROWS))
async def test_a_row_that_breaks_a_tables_rule_is_refused_by_the_rules_name(
    broken: str, deployment: TestDeployment, migrator: asyncpg.Connection
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = f'"{deployment.namespace}"'
    run_id = await insert_run(
        deployment.database,
        deployment.namespace,
        "approval-notice",
        checked.packages["approval-notice"].digest,
    )
    statement, rule, value = BROKEN_ROWS[broken]
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await migrator.execute(statement.format(ns=ns))
    assert refused.value.message == rule
    for shown in (refused.value.message, refused.value.detail or "", str(refused.value)):
        assert value not in shown and run_id not in shown
    # The row the statement would have written is not there; the run it read still is.
    assert await migrator.fetchval(f"SELECT count(*) FROM {ns}.run") == 1
    assert await migrator.fetchval(f"SELECT count(*) FROM {ns}.step") == 0
    assert await migrator.fetchval(f"SELECT count(*) FROM {ns}.payload") == 0
