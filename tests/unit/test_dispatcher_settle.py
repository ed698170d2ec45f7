"""Recording an outcome survives a database outage and a deadlock, and stops at a lost lease.

Every transition the settler writes is one statement through :meth:`Settler._transition`;
here its statement is a stand-in that fails as scripted before it answers, and the
transition function's row is scripted too (the functions themselves are driven on the real
server by tests/integration/test_transitions.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

from core.codes import Code
from core.db.statements import DispatcherStepSettleRow
from core.errors import CoordinatorError
from core.states import Transition
from dispatcher import settle
from dispatcher.claim import Claimed
from dispatcher.settle import STORE_RETRY_DELAYS, Settler

CLAIMED = Claimed("run-1", "send", 1, "call", "ready", 0, None, None, False, lease_epoch=3)


class FlakySettler(Settler):
    """A settler whose statements fail as scripted before they work."""

    def __init__(self, failures: list[BaseException], *, epoch: int = 3) -> None:
        async def hold_epoch(conn: Any) -> int:
            return epoch

        store: Any = SimpleNamespace(
            runtime=SimpleNamespace(config=SimpleNamespace(namespace="n")),
            queries=SimpleNamespace(dispatcher_hold_epoch=hold_epoch),
        )
        self.slept: list[float] = []

        async def sleep(seconds: float) -> None:
            self.slept.append(seconds)

        super().__init__(store, keyring=None, owner="me", sleep=sleep)  # type: ignore[arg-type]
        self.failures = failures
        self.opened = 0


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dispatcher.settle.statement`` opens nothing: it fails as the settler's script says."""

    @contextlib.asynccontextmanager
    async def statement(store: Any) -> AsyncIterator[Any]:
        settler: FlakySettler = store.settler
        settler.opened += 1
        if settler.failures:
            raise settler.failures.pop(0)
        yield "conn"

    monkeypatch.setattr(settle, "statement", statement)


def flaky(failures: list[BaseException], *, epoch: int = 3) -> FlakySettler:
    settler = FlakySettler(failures, epoch=epoch)
    settler.store.settler = settler  # type: ignore[attr-defined]
    return settler


def answering(outcome: str) -> Any:
    async def write(conn: Any) -> DispatcherStepSettleRow:
        assert conn == "conn"
        return DispatcherStepSettleRow(outcome, None)

    return write


@pytest.mark.usefixtures("statements")
async def test_an_outcome_is_recorded_after_outages_and_a_deadlock() -> None:
    settler = flaky(
        [
            CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database cannot be reached"),
            asyncpg.DeadlockDetectedError("deadlock detected"),
            CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database cannot be reached"),
        ]
    )
    outcome, row = await settler._transition(CLAIMED, answering("written"))
    assert (outcome, row) == (Transition.WRITTEN, DispatcherStepSettleRow("written", None))
    assert settler.opened == 4
    assert settler.slept == list(STORE_RETRY_DELAYS[:3])


@pytest.mark.usefixtures("statements")
async def test_retries_are_bounded() -> None:
    outage = CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database cannot be reached")
    settler = flaky([outage] * 20)
    with pytest.raises(CoordinatorError):
        await settler._transition(CLAIMED, answering("written"))
    assert settler.opened == len(STORE_RETRY_DELAYS) + 1
    assert sum(settler.slept) < 30  # within one lease


@pytest.mark.usefixtures("statements")
async def test_other_refusals_are_not_retried() -> None:
    settler = flaky([CoordinatorError(Code.DEPLOYMENT_REFUSED, "permission denied")])
    with pytest.raises(CoordinatorError):
        await settler._transition(CLAIMED, answering("written"))
    assert (settler.opened, settler.slept) == (1, [])


@pytest.mark.usefixtures("statements")
async def test_a_lost_lease_records_nothing_and_says_which_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settler = flaky([])
    outcome, _ = await settler._transition(CLAIMED, answering("lease-lost"))
    assert outcome is Transition.LEASE_LOST
    assert settler.opened == 1
    assert "the lease was lost" in caplog.text
    caplog.clear()
    # A restore-hold raised the epoch since the claim: said as the restore's refusal.
    outcome, _ = await flaky([], epoch=4)._transition(CLAIMED, answering("lease-lost"))
    assert outcome is Transition.LEASE_LOST
    assert "restore.lease-incompatible" in caplog.text
