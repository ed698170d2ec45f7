"""One running local stack per e2e module: real processes, real gRPC, TLS PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.clock import ENV_VAR, write_test_clock
from core.config.check import check_runtime_file
from core.deploy import apply
from core.workflow.package import build_package
from devstack.postgres import DatabaseHandle, PostgresCluster
from devstack.stack import LocalStack

ROOT = Path(__file__).resolve().parents[2]
_numbers = itertools.count(1)


@dataclass
class Running:
    """A started stack, its database, its test clock and two tokens."""

    stack: LocalStack
    database: DatabaseHandle
    clock_file: Path
    producer_token: str
    operator_token: str
    other_producer_token: str

    def move_clock(self, instant: datetime) -> None:
        write_test_clock(self.clock_file, instant)

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def running_stack(
    postgres_server: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("stack")
    name = f"coordinator_e2e_{os.getpid()}_{next(_numbers)}"
    database = postgres_server.create_database(name)
    built = [
        build_package(ROOT / "examples" / example, root / "packages")
        for example in ("appointment-booking", "register-change")
    ]
    stack = LocalStack.prepare(
        root / "stack", packages=[(b.path, b.digest) for b in built], database=database
    )
    clock_file = root / "clock"
    write_test_clock(clock_file, datetime(2027, 1, 4, 9, 0, tzinfo=UTC))
    try:
        stack.start_products()
        asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
        stack.start_coordinator(env={ENV_VAR: str(clock_file)})
        tokens = root / "tokens"
        tokens.mkdir(mode=0o700)
        yield Running(
            stack=stack,
            database=database,
            clock_file=clock_file,
            producer_token=stack.mint("producer", "alice", tokens / "alice").read_text().strip(),
            operator_token=stack.mint("operator", "olga", tokens / "olga").read_text().strip(),
            other_producer_token=stack.mint("producer", "bob", tokens / "bob").read_text().strip(),
        )
    finally:
        stack.stop()
        postgres_server.drop_database(name)
