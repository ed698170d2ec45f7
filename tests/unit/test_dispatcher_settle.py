"""Recording an outcome survives a database outage and a deadlock, and stops at a lost lease."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

from core.codes import Code
from core.errors import CoordinatorError
from dispatcher.claim import Claimed
from dispatcher.settle import STORE_RETRY_DELAYS, Settler
from dispatcher.tx import Tx

CLAIMED = Claimed("run-1", "send", 1, "call", "ready", 0, None, None, False)


class FlakySettler(Settler):
    """A settler whose locked transaction fails as scripted before it works."""

    def __init__(self, failures: list[BaseException], *, lease_lost: bool = False) -> None:
        store: Any = SimpleNamespace(runtime=SimpleNamespace(config=SimpleNamespace(namespace="n")))
        self.slept: list[float] = []

        async def sleep(seconds: float) -> None:
            self.slept.append(seconds)

        super().__init__(store, keyring=None, owner="me", sleep=sleep)  # type: ignore[arg-type]
        self.failures = failures
        self.lease_lost = lease_lost
        self.opened = 0

    @contextlib.asynccontextmanager
    async def locked(self, claimed: Claimed) -> AsyncIterator[Tx | None]:
        self.opened += 1
        if self.failures:
            raise self.failures.pop(0)
        yield None if self.lease_lost else "tx"  # type: ignore[misc]


async def record(tx: Any) -> str:
    return f"recorded with {tx}"


async def test_an_outcome_is_recorded_after_outages_and_a_deadlock() -> None:
    settler = FlakySettler(
        [
            CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database cannot be reached"),
            asyncpg.DeadlockDetectedError("deadlock detected"),
            CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database cannot be reached"),
        ]
    )
    assert await settler.settle(CLAIMED, record) == (True, "recorded with tx")
    assert settler.opened == 4
    assert settler.slept == list(STORE_RETRY_DELAYS[:3])


async def test_retries_are_bounded() -> None:
    outage = CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database cannot be reached")
    settler = FlakySettler([outage] * 20)
    with pytest.raises(CoordinatorError):
        await settler.settle(CLAIMED, record)
    assert settler.opened == len(STORE_RETRY_DELAYS) + 1
    assert sum(settler.slept) < 30  # within one lease


async def test_other_refusals_are_not_retried() -> None:
    settler = FlakySettler([CoordinatorError(Code.DEPLOYMENT_REFUSED, "permission denied")])
    with pytest.raises(CoordinatorError):
        await settler.settle(CLAIMED, record)
    assert (settler.opened, settler.slept) == (1, [])


async def test_a_lost_lease_records_nothing() -> None:
    settler = FlakySettler([], lease_lost=True)
    assert await settler.settle(CLAIMED, record) == (False, None)
    assert settler.opened == 1
