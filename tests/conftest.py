"""Shared pytest fixtures.

PostgreSQL: one real server per session (``postgres_server``), one fresh database per test
(``database``) cloned from a session template. Set ``COORDINATOR_TEST_DATABASE_URL`` (a
migration URL of a running PostgreSQL 17+, with ``COORDINATOR_TEST_DATABASE_CA`` naming its
root certificate file if it is private) to use that server instead; its role then needs
CREATEDB and CREATEROLE. ``COORDINATOR_POSTGRES_BIN`` picks another PostgreSQL bin folder.
"""

from __future__ import annotations

import itertools
import os

# The suite starts real processes (PostgreSQL, the coordinator) after in-process tests have
# used gRPC. gRPC's fork handlers then run in every forked child before it execs, which
# breaks some children and slows all of them; our children never use the parent's gRPC
# state, so the handlers are switched off before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.postgres import (
    DatabaseHandle,
    ExternalPostgres,
    PostgresCluster,
    PostgresServer,
)

_database_numbers = itertools.count(1)

HA_TIER_ENV = "COORDINATOR_HA_TIER"
DEPLOY_TIER_ENV = "COORDINATOR_DEPLOY_TIER"
# The failover tier (tests/ha) and the deploy tier (tests/deploy_live) are CI steps of their
# own, `make ha-test` (root, Patroni and etcd from `make ha-host`) and `make deploy-test`
# (root, a Docker daemon and images built here): each takes minutes, and `make test` stays
# the quick default. `make test` does not collect them, so they are never counted as skipped.
collect_ignore = [
    tier
    for tier, env in (("ha", HA_TIER_ENV), ("deploy_live", DEPLOY_TIER_ENV))
    if os.environ.get(env) != "1"
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that reaches the server is a postgres test even if its author forgot the mark,
    # so `-m "not postgres"` really runs without a server.
    for item in items:
        if "postgres_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresCluster]:
    """The session's PostgreSQL 17+ server (started here unless an external one is named)."""
    url = os.environ.get("COORDINATOR_TEST_DATABASE_URL")
    server: PostgresCluster
    if url:
        ca_file = os.environ.get("COORDINATOR_TEST_DATABASE_CA")
        server = ExternalPostgres.open(url, Path(ca_file).read_bytes() if ca_file else None)
    else:
        server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_template(postgres_server: PostgresCluster) -> Iterator[str]:
    """Name of the database every test database is cloned from (empty for now)."""
    # The process id keeps concurrent sessions apart on a shared external server.
    name = f"coordinator_template_{os.getpid()}"
    postgres_server.create_database(name)
    try:
        yield name
    finally:
        postgres_server.drop_database(name)


@pytest.fixture
def database(postgres_server: PostgresCluster, postgres_template: str) -> Iterator[DatabaseHandle]:
    """A fresh database for this test, owned by the migration role; dropped afterwards."""
    name = f"coordinator_test_{os.getpid()}_{next(_database_numbers)}"
    handle = postgres_server.create_database(name, template=postgres_template)
    try:
        yield handle
    finally:
        postgres_server.drop_database(name)


@pytest.fixture
def secrets_dir(database: DatabaseHandle, tmp_path: Path) -> Path:
    """A 0700 folder holding ``migration-db-url``, ``runtime-db-url`` and ``db-root.pem``."""
    folder = tmp_path / "secrets"
    database.write_secret_files(folder)
    return folder
