"""The PostgreSQL harness gives tests what production has: TLS, two roles, PostgreSQL 17+."""

from __future__ import annotations

import asyncio
import gc
import os
import select
import signal
import ssl
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import asyncpg
import pytest

from core.db.connect import (
    connect,
    create_pool,
    parse_database_url,
    quote_ident,
    require_server_version,
)
from core.errors import CoordinatorError
from devstack.postgres import DatabaseHandle, PostgresCluster, PostgresServer, postgres_url
from devstack.postgres_tls import CertificateAuthority

pytestmark = pytest.mark.postgres


async def test_runtime_role_connects_with_verify_full(database: DatabaseHandle) -> None:
    assert parse_database_url(database.runtime_url).sslmode == "verify-full"
    conn = await connect(database.runtime_url, database.ca_pem)
    try:
        row = await conn.fetchrow("SELECT current_user, session_user, current_database()")
    finally:
        await conn.close()
    assert row is not None
    assert tuple(row) == ("coordinator_runtime", "coordinator_runtime", database.database)


async def test_connection_is_encrypted_per_pg_stat_ssl(database: DatabaseHandle) -> None:
    conn = await connect(database.runtime_url, database.ca_pem)
    try:
        row = await conn.fetchrow(
            "SELECT ssl, version, cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        )
    finally:
        await conn.close()
    assert row is not None
    assert row["ssl"] is True
    assert row["version"] in ("TLSv1.2", "TLSv1.3")
    assert row["cipher"]


@pytest.mark.parametrize("who", ["runtime", "migration"])
async def test_server_refuses_plain_text(database: DatabaseHandle, who: str) -> None:
    user, password = (
        (database.runtime_role, database.runtime_password)
        if who == "runtime"
        else (database.migration_role, database.migration_password)
    )
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError) as refused:
        await asyncpg.connect(
            host=database.host,
            port=database.port,
            user=user,
            password=password,
            database=database.database,
            ssl=False,
        )
    assert refused.value.sqlstate == "28000"  # rejected by pg_hba.conf, before any password


async def test_superuser_cannot_log_in_over_tcp(database: DatabaseHandle) -> None:
    url = postgres_url("postgres", "irrelevant", database.host, database.port, "postgres")
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
        await connect(url, database.ca_pem)


def test_a_refused_tls_login_leaves_no_socket_behind(database: DatabaseHandle) -> None:
    # The loop is closed right after the refusal, as a CLI command or a test would do; the
    # socket must already be closed by then, not left for the garbage collector to report.
    refused = postgres_url("postgres", "irrelevant", database.host, database.port, "postgres")

    async def attempt() -> None:
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
            await connect(refused, database.ca_pem)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(10):
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(attempt())
            finally:
                loop.close()
            gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_server_is_postgresql_17_or_newer(database: DatabaseHandle) -> None:
    conn = await connect(database.migration_url, database.ca_pem)
    try:
        version = await require_server_version(conn)
        raw = await conn.fetchval("SHOW server_version_num")
    finally:
        await conn.close()
    assert version >= 170000
    assert version == int(raw)


async def test_wrong_root_certificate_fails_verification(database: DatabaseHandle) -> None:
    stranger = CertificateAuthority.create("Somebody else's CA")
    with pytest.raises(ssl.SSLCertVerificationError):
        await connect(database.runtime_url, stranger.pem)


async def test_system_roots_do_not_trust_the_private_ca(database: DatabaseHandle) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await connect(database.runtime_url, None)


async def test_runtime_role_has_no_dangerous_attributes(database: DatabaseHandle) -> None:
    conn = await connect(database.migration_url, database.ca_pem)
    try:
        runtime = await conn.fetchrow(
            "SELECT rolsuper, rolbypassrls, rolcreatedb, rolcreaterole, rolreplication, "
            "rolcanlogin FROM pg_roles WHERE rolname = $1",
            database.runtime_role,
        )
        member = await conn.fetchval(
            "SELECT pg_has_role($1, $2, 'MEMBER')", database.runtime_role, database.migration_role
        )
        may_create = await conn.fetchval(
            "SELECT has_schema_privilege($1, 'public', 'CREATE')", database.runtime_role
        )
        owner = await conn.fetchval(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
        )
        migration_super = await conn.fetchval(
            "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
    finally:
        await conn.close()
    assert runtime is not None
    assert dict(runtime) == {
        "rolsuper": False,
        "rolbypassrls": False,
        "rolcreatedb": False,
        "rolcreaterole": False,
        "rolreplication": False,
        "rolcanlogin": True,
    }
    assert member is False
    assert may_create is False
    assert owner == database.migration_role
    assert migration_super is False


async def test_migration_role_can_create_a_schema(database: DatabaseHandle) -> None:
    conn = await connect(database.migration_url, database.ca_pem)
    try:
        await conn.execute("CREATE SCHEMA coordinator_probe")
        owner = await conn.fetchval(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'coordinator_probe'"
        )
    finally:
        await conn.close()
    assert owner == database.migration_role


async def test_runtime_role_holds_connect_only(database: DatabaseHandle) -> None:
    conn = await connect(database.migration_url, database.ca_pem)
    try:
        rows = await conn.fetch(
            "SELECT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END, "
            "a.privilege_type FROM pg_database d, aclexplode(d.datacl) a "
            "WHERE d.datname = current_database() AND a.grantee <> d.datdba"
        )
    finally:
        await conn.close()
    assert {tuple(row) for row in rows} == {(database.runtime_role, "CONNECT")}
    runtime = await connect(database.runtime_url, database.ca_pem)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await runtime.execute("CREATE TEMP TABLE scratch (id int)")
    finally:
        await runtime.close()


async def test_test_databases_are_isolated(
    database: DatabaseHandle, postgres_server: PostgresCluster, postgres_template: str
) -> None:
    conn = await connect(database.migration_url, database.ca_pem)
    try:
        await conn.execute("CREATE TABLE left_behind (id int)")
    finally:
        await conn.close()
    other = await postgres_server.acreate_database(
        f"{database.database}_other", template=postgres_template
    )
    try:
        assert other.database != database.database
        conn = await connect(other.migration_url, other.ca_pem)
        try:
            found = await conn.fetchval("SELECT to_regclass('public.left_behind') IS NOT NULL")
        finally:
            await conn.close()
    finally:
        await postgres_server.adrop_database(other.database)
    assert found is False


async def test_pool_connections_keep_their_set_role(database: DatabaseHandle) -> None:
    component = f"{database.database}_component"
    admin = await connect(database.migration_url, database.ca_pem)
    try:
        await admin.execute(f"CREATE ROLE {quote_ident(component)} NOLOGIN")
        await admin.execute(
            f"GRANT {quote_ident(component)} TO {quote_ident(database.runtime_role)}"
        )
        pool = await create_pool(
            database.runtime_url, database.ca_pem, min_size=1, max_size=1, setup_role=component
        )
        try:
            first = await pool.fetchval("SELECT current_user")
            # The pool's reset on release (RESET ALL etc.) must not drop the role.
            second = await pool.fetchval("SELECT current_user")
            session = await pool.fetchval("SELECT session_user")
        finally:
            await pool.close()
    finally:
        await admin.execute(f"DROP ROLE IF EXISTS {quote_ident(component)}")
        await admin.close()
    assert (first, second, session) == (component, component, database.runtime_role)


async def test_secret_files_are_private_and_usable(
    database: DatabaseHandle, secrets_dir: Path
) -> None:
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    names = sorted(p.name for p in secrets_dir.iterdir())
    assert names == ["db-root.pem", "migration-db-url", "runtime-db-url"]
    for path in secrets_dir.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    url = (secrets_dir / "runtime-db-url").read_text("utf-8")
    conn = await connect(url, (secrets_dir / "db-root.pem").read_bytes())
    try:
        assert await conn.fetchval("SELECT current_user") == "coordinator_runtime"
    finally:
        await conn.close()


def test_passwords_need_percent_encoding(database: DatabaseHandle) -> None:
    # The harness exists partly to catch URL handling bugs: its passwords must contain
    # characters that break an unencoded URL, and the URL must still decode to them.
    for password, url in (
        (database.runtime_password, database.runtime_url),
        (database.migration_password, database.migration_url),
    ):
        assert any(c in password for c in "@:/?#%&=+$,;[]!*'()~ ")
        assert password not in url
        assert parse_database_url(url).password == password


def test_sslmode_disable_is_refused_before_connecting(database: DatabaseHandle) -> None:
    url = database.runtime_url.replace("sslmode=verify-full", "sslmode=disable")
    with pytest.raises(CoordinatorError) as refused:
        parse_database_url(url)
    assert refused.value.code == "deployment.refused"
    assert database.runtime_password not in str(refused.value)


def test_a_stopped_server_leaves_nothing_running() -> None:
    server = PostgresServer.start(default_database=None)
    pid = int((server.data_dir / "postmaster.pid").read_text("utf-8").splitlines()[0])
    base = server.base_dir
    process = os.pidfd_open(pid)
    try:
        assert select.select([process], [], [], 0)[0] == []  # still running
        server.stop()
        # A pidfd turns readable once the process has exited; bounded wait, no sleep.
        assert select.select([process], [], [], 10)[0] == [process]
    finally:
        os.close(process)
    assert not base.exists()


_KILLED_OWNER = """
import os, signal, sys
from devstack.postgres import PostgresServer
server = PostgresServer.start(default_database=None)
pid = (server.data_dir / "postmaster.pid").read_text().splitlines()[0]
print(pid, server._watchdog.pid, server.base_dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_owner_does_not_leave_the_server_running() -> None:
    owner = subprocess.run(
        [sys.executable, "-c", _KILLED_OWNER],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert owner.returncode == -signal.SIGKILL, owner.stderr
    postmaster, watchdog, base = owner.stdout.split()
    handles = []
    try:
        for pid in (postmaster, watchdog):
            try:
                handles.append(os.pidfd_open(int(pid)))
            except ProcessLookupError:
                continue  # already gone, which is what we want
        for handle in handles:
            assert select.select([handle], [], [], 30)[0] == [handle]
    finally:
        for handle in handles:
            os.close(handle)
    assert not Path(base).exists()
