"""The runtime role checks and the component roles' grants (CONTRACT §6.2, §6.3)."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from core import deploy
from core.db.connect import connect, quote_ident
from core.db.queries import composite_types
from core.db.roles import COMPONENTS, GRANTS, component_role
from core.errors import CoordinatorError
from devstack.postgres import DatabaseHandle, PostgresServer, scram_verifier
from tests.helpers.deployment import (
    TestDeployment,
    drop_deployment,
    insert_run,
    migration_connection,
    write_secret,
)

pytestmark = pytest.mark.postgres

Superuser = Callable[[], Awaitable[asyncpg.Connection]]


@pytest.fixture
def superuser(postgres_server: Any, database: DatabaseHandle) -> Superuser:
    """Opens a superuser connection to the test database (for making defective roles)."""
    if not isinstance(postgres_server, PostgresServer):
        pytest.skip("needs the harness's own server: a superuser makes the defective roles")

    async def open_connection() -> asyncpg.Connection:
        return await postgres_server.superuser_connect(database.database)

    return open_connection


@pytest.fixture
async def login_role(
    superuser: Superuser, database: DatabaseHandle
) -> AsyncIterator[tuple[str, str]]:
    """A fresh runtime login role (name, password) that only this test uses."""
    name = f"coordinator_login_{secrets.token_hex(5)}"
    password = secrets.token_urlsafe(18)
    conn = await superuser()
    try:
        await conn.execute(
            f"CREATE ROLE {quote_ident(name)} LOGIN NOINHERIT PASSWORD '{scram_verifier(password)}'"
        )
        await conn.execute(
            f"GRANT CONNECT ON DATABASE {quote_ident(database.database)} TO {quote_ident(name)}"
        )
    finally:
        await conn.close()
    yield name, password
    # A test may have handed the schema to this role: give it back, then drop the role.
    conn = await superuser()
    try:
        await conn.execute(
            f"REASSIGN OWNED BY {quote_ident(name)} TO {quote_ident(database.migration_role)}"
        )
        await conn.execute(f"DROP OWNED BY {quote_ident(name)}")
        await conn.execute(f"DROP ROLE {quote_ident(name)}")
    finally:
        await conn.close()


@pytest.fixture
async def deployment(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[TestDeployment]:
    made = TestDeployment.create(tmp_path, database)
    yield made
    await drop_deployment(database, made.namespace)


async def _as_superuser(superuser: Superuser, *statements: str) -> None:
    conn = await superuser()
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


# Each defect: the statement that introduces it and words the refusal must contain.
DEFECTS = {
    "superuser": ("ALTER ROLE {role} SUPERUSER", "is a superuser"),
    "bypassrls": ("ALTER ROLE {role} BYPASSRLS", "has BYPASSRLS"),
    "member of the migration role": ("GRANT {migration} TO {role}", "member of"),
    "create on the schema": ("GRANT CREATE ON SCHEMA {ns} TO {role}", "can CREATE"),
    "owner of the schema": ("ALTER SCHEMA {ns} OWNER TO {role}", "owns the schema"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
async def test_a_defective_runtime_role_is_refused(
    defect: str,
    deployment: TestDeployment,
    login_role: tuple[str, str],
    superuser: Superuser,
) -> None:
    role, password = login_role
    deployment.set_runtime_login(role, password)
    checked = deployment.checked()
    await deploy.apply(checked, [])
    assert (await deploy.status(checked)).to_json()["status"] == "checked"

    statement, words = DEFECTS[defect]
    await _as_superuser(
        superuser,
        statement.format(
            role=quote_ident(role),
            migration=quote_ident(deployment.database.migration_role),
            ns=quote_ident(deployment.namespace),
        ),
    )
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "status": lambda: deploy.status(checked),
        "plan": lambda: deploy.plan(checked, []),
        "apply": lambda: deploy.apply(checked, []),
    }
    for command, attempt in attempts.items():
        with pytest.raises(CoordinatorError) as refused:
            await attempt()
        assert refused.value.code == "deployment.refused", (command, refused.value)
        assert words in refused.value.detail, (command, refused.value.detail)
        assert role in refused.value.detail


async def test_a_runtime_role_other_than_the_url_user_is_refused(
    deployment: TestDeployment,
) -> None:
    await deploy.apply(deployment.checked(), [])
    deployment.doc["deployment"]["runtimeRole"] = "coordinator_someone_else"
    checked = deployment.checked()
    for command in (deploy.plan, deploy.apply):
        with pytest.raises(CoordinatorError) as refused:
            await command(checked, [])
        assert refused.value.code == "deployment.refused"
        assert "deployment.runtimeRole" in refused.value.detail
    with pytest.raises(CoordinatorError) as status_refused:
        await deploy.status(checked)
    assert "deployment.runtimeRole" in status_refused.value.detail


async def test_the_migration_role_as_runtime_role_is_refused(deployment: TestDeployment) -> None:
    db = deployment.database
    write_secret(deployment.secrets, "runtime-db-url", db.migration_url.encode())
    deployment.doc["deployment"]["runtimeRole"] = db.migration_role
    with pytest.raises(CoordinatorError) as refused:
        await deploy.apply(deployment.checked(), [])
    assert refused.value.code == "deployment.refused"
    assert "is the migration role" in refused.value.detail


# --------------------------------------------------------------------- component roles


async def _runtime(d: TestDeployment) -> asyncpg.Connection:
    return await connect(d.database.runtime_url, d.database.ca_pem)


async def _denied(conn: asyncpg.Connection, statement: str) -> bool:
    try:
        async with conn.transaction():
            await conn.execute(statement)
    except asyncpg.InsufficientPrivilegeError:
        return True
    return False


async def test_component_roles_can_do_only_their_part(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    ns = quote_ident(deployment.namespace)
    run_id = await insert_run(
        deployment.database,
        deployment.namespace,
        "approval-notice",
        checked.packages["approval-notice"].digest,
    )
    insert_payload = (
        f"INSERT INTO {ns}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext) "
        f"VALUES ('{run_id}', {{step}}, {{purpose}}, 1, '\\x000102030405060708090a0b'::bytea, "
        "'\\xff'::bytea) RETURNING id"
    )
    conn = await _runtime(deployment)
    try:
        # Without SET ROLE the runtime role reads nothing.
        assert await _denied(conn, f"SELECT 1 FROM {ns}.run")
        assert await _denied(conn, f"SELECT 1 FROM {ns}.activation")

        await conn.execute(
            f"SET ROLE {quote_ident(component_role(deployment.namespace, 'admission'))}"
        )
        assert await _denied(conn, f"UPDATE {ns}.step SET state = 'completed' WHERE false")
        assert await _denied(conn, f"UPDATE {ns}.run SET state = 'failed' WHERE false")
        assert await _denied(conn, f"DELETE FROM {ns}.payload WHERE false")
        assert await _denied(conn, f"SELECT ciphertext FROM {ns}.payload")
        assert not await _denied(
            conn,
            f"UPDATE {ns}.step SET next_check_at = {ns}.now(), due_at = {ns}.now() WHERE false",
        )
        assert not await _denied(conn, f"SELECT 1 FROM {ns}.activation")
        assert await _denied(conn, f"SELECT 1 FROM {ns}.token_refusal")
        # Writing a payload (and learning its id) needs no sequence privilege of its own.
        assert not await _denied(conn, insert_payload.format(step="NULL", purpose="'input'"))

        await conn.execute("RESET ROLE")
        await conn.execute(
            f"SET ROLE {quote_ident(component_role(deployment.namespace, 'dispatcher'))}"
        )
        assert await _denied(conn, f"UPDATE {ns}.hold SET execution_hold = false")
        assert await _denied(
            conn, f"INSERT INTO {ns}.recovery_record (epoch, restore_reason) VALUES (1, 'x')"
        )
        assert await _denied(conn, f"DELETE FROM {ns}.payload WHERE false")
        assert not await _denied(conn, f"UPDATE {ns}.step SET state = 'completed' WHERE false")
        assert not await _denied(conn, f"SELECT execution_hold FROM {ns}.hold")
        assert not await _denied(conn, insert_payload.format(step="'a'", purpose="'command'"))
        # Its last refused token request per connection, for doctor: written, replaced, cleared.
        assert not await _denied(
            conn,
            f"INSERT INTO {ns}.token_refusal (connection, error, refused_at) "
            f"VALUES ('notices', 'invalid_client', {ns}.now()) ON CONFLICT (connection) "
            "DO UPDATE SET error = excluded.error, refused_at = excluded.refused_at",
        )
        assert not await _denied(conn, f"DELETE FROM {ns}.token_refusal WHERE connection = 'x'")

        await conn.execute("RESET ROLE")
        await conn.execute(
            f"SET ROLE {quote_ident(component_role(deployment.namespace, 'recovery'))}"
        )
        assert not await _denied(conn, f"SELECT connection, error FROM {ns}.token_refusal")
        assert await _denied(conn, f"DELETE FROM {ns}.token_refusal WHERE false")

        await conn.execute("RESET ROLE")
        await conn.execute(f"SET ROLE {quote_ident(component_role(deployment.namespace, 'audit'))}")
        assert await _denied(conn, f"SELECT 1 FROM {ns}.run")
        assert not await _denied(
            conn,
            f"INSERT INTO {ns}.audit_segment (segment, fingerprint, first_seq) "
            f"VALUES (1, repeat('a', 64), 1)",
        )
    finally:
        await conn.close()


async def test_grants_equal_the_declared_table(deployment: TestDeployment) -> None:
    await deploy.apply(deployment.checked(), [])
    # Widen a grant by hand: the next apply must take it back.
    admission = component_role(deployment.namespace, "admission")
    conn = await migration_connection(deployment.database)
    try:
        await conn.execute(
            f"GRANT DELETE ON {quote_ident(deployment.namespace)}.run TO {quote_ident(admission)}"
        )
        await deploy.apply(deployment.checked(), [])
        rows = await conn.fetch(
            """
            SELECT g.grantee::text AS grantee, g.table_name::text AS table_name,
                   g.privilege_type::text AS privilege
              FROM information_schema.role_table_grants g
             WHERE g.table_schema = $1 AND g.grantee <> g.grantor
            """,
            deployment.namespace,
        )
        column_rows = await conn.fetch(
            """
            SELECT grantee::text AS grantee, table_name::text AS table_name,
                   privilege_type::text AS privilege, column_name::text AS column_name
              FROM information_schema.column_privileges
             WHERE table_schema = $1 AND grantee <> grantor
            """,
            deployment.namespace,
        )
    finally:
        await conn.close()

    table_level: set[tuple[str, str, str]] = set()
    column_level: set[tuple[str, str, str, str]] = set()
    columns_of: dict[str, set[str]] = {}
    for row in column_rows:
        columns_of.setdefault(row["table_name"], set()).add(row["column_name"])
    for component, tables in GRANTS.items():
        role = component_role(deployment.namespace, component)
        for table, privileges in tables.items():
            for privilege in privileges:
                verb, _, cols = privilege.partition(" ")
                if cols:
                    for column in cols.strip("()").split(", "):
                        column_level.add((role, table, verb, column))
                else:
                    table_level.add((role, table, verb))
    found_tables = {(r["grantee"], r["table_name"], r["privilege"]) for r in rows}
    assert found_tables == table_level
    found_columns = {
        (r["grantee"], r["table_name"], r["privilege"], r["column_name"]) for r in column_rows
    }
    # information_schema lists a table-level grant once per column too: keep only the
    # column grants that no table-level grant explains.
    only_columns = {
        item for item in found_columns if (item[0], item[1], item[2]) not in table_level
    }
    assert only_columns == column_level
    assert deployment.database.runtime_role not in {row["grantee"] for row in rows}


async def test_no_role_but_the_owner_may_use_the_argument_types(
    deployment: TestDeployment,
) -> None:
    await deploy.apply(deployment.checked(), [])
    roles = ["public", deployment.database.runtime_role]
    roles += [component_role(deployment.namespace, c) for c in COMPONENTS]
    conn = await migration_connection(deployment.database)
    try:
        usage = {
            (role, name): await conn.fetchval(
                "SELECT has_type_privilege($1, $2, 'USAGE')",
                role,
                f"{quote_ident(deployment.namespace)}.{name}",
            )
            for role in roles
            for name in composite_types()
        }
    finally:
        await conn.close()
    assert len(usage) == len(roles) * 3
    assert not any(usage.values()), usage


async def test_a_component_role_cannot_reach_another_namespace(
    tmp_path: Path, database: DatabaseHandle, deployment: TestDeployment
) -> None:
    other = TestDeployment.create(tmp_path / "other", database)
    try:
        await deploy.apply(deployment.checked(), [])
        await deploy.apply(other.checked(), [])
        conn = await _runtime(deployment)
        try:
            for component in ("admission", "dispatcher", "recovery", "audit"):
                await conn.execute(
                    f"SET ROLE {quote_ident(component_role(deployment.namespace, component))}"
                )
                assert await _denied(conn, f"SELECT 1 FROM {quote_ident(other.namespace)}.run")
                assert await _denied(
                    conn, f"SELECT 1 FROM {quote_ident(other.namespace)}.activation"
                )
                await conn.execute("RESET ROLE")
        finally:
            await conn.close()
    finally:
        await drop_deployment(database, other.namespace)


async def test_a_runtime_role_with_its_own_table_privilege_is_refused_until_apply(
    deployment: TestDeployment,
) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    conn = await migration_connection(deployment.database)
    try:
        await conn.execute(
            f"GRANT SELECT ON {quote_ident(deployment.namespace)}.run "
            f"TO {quote_ident(deployment.database.runtime_role)}"
        )
    finally:
        await conn.close()
    with pytest.raises(CoordinatorError) as refused:
        await deploy.status(checked)
    assert refused.value.code == "deployment.refused"
    assert "holds table privileges" in refused.value.detail
    await deploy.apply(checked, [])  # resets the grants
    assert (await deploy.status(checked)).to_json()["status"] == "checked"
