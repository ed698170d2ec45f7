"""Leases, replicas, holds and stopping: the dispatcher's safety properties on the real
PostgreSQL server (CONTRACT §2.1 SIGTERM, §9.2, §9.3 step 5, §10.5)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import channel, unix_endpoints
from core.runtime import Runtime, Store
from devstack.postgres import DatabaseHandle
from dispatcher.claim import Sweep
from dispatcher.engine import Dispatcher
from dispatcher.service import DispatcherService, serve
from dispatcher.settings import DispatchSettings
from tests.helpers.base_kit import ISSUER
from tests.helpers.dispatching import DispatchKit, dispatch_kit, running, until
from tests.helpers.pinned_clock import T0

pytestmark = pytest.mark.postgres
STOP_BUDGET_SECONDS = 15.0
"""CONTRACT §2.1: a stopped component is gone within this."""


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


async def abandon(kit: DispatchKit, run_id: str, state: str) -> None:
    """Make the run's first step look like a dead dispatcher's: leased until T0 + 30 s."""
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET state = $2, command_key = $3, lease_owner = 'dead-replica', "
        "lease_expires_at = $4, lease_epoch = 0, attempts = $5 "
        "WHERE run_id = $1 AND step_id = 'send'",
        run_id,
        state,
        kit.key(run_id),
        T0 + timedelta(seconds=30),
        1 if state == "prepared" else 0,
    )


async def test_an_expired_lease_on_a_prepared_command_makes_it_uncertain(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-1"})
    await abandon(kit, run_id, "prepared")

    assert await dispatcher.run_once() == 0  # leased by another, not expired yet
    assert (await kit.step(run_id, "send"))["state"] == "prepared"

    fake_clock(T0 + timedelta(seconds=31))
    assert await dispatcher.run_once() == 0
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["lease_owner"], send["due_at"]) == (
        "uncertain",
        "unknown",
        None,
        None,
    )
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("held", True)
    await dispatcher.drain()
    assert (await kit.stats())["received"] == {}  # the survivor never sends it


async def test_an_expired_lease_before_preparing_lets_the_step_proceed(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-2"})
    await abandon(kit, run_id, "ready")
    fake_clock(T0 + timedelta(seconds=31))
    await dispatcher.drain()
    assert (await kit.run(run_id))["state"] == "succeeded"
    assert (await kit.stats())["processed"] == {kit.key(run_id): 1}


async def test_two_dispatchers_never_execute_the_same_step_twice(kit: DispatchKit) -> None:
    first = await kit.dispatcher(owner="replica-1")
    second = await kit.dispatcher(owner="replica-2")
    async with running(first), running(second):
        runs = [await kit.start("notice", {"applicantRef": f"applicant-{n}"}) for n in range(20)]

        async def all_ended() -> bool:
            count = await kit.db.fetchval(
                f"SELECT count(*) FROM {kit.ns}.run WHERE ended_at IS NULL"
            )
            return int(count) == 0

        await until(all_ended, first, second)

    states = await kit.db.fetch(f"SELECT state FROM {kit.ns}.run")
    assert [row["state"] for row in states] == ["succeeded"] * 20
    stats = await kit.stats()
    keys = {kit.key(run_id) for run_id in runs}
    assert stats["processed"] == dict.fromkeys(keys, 1)
    assert stats["received"] == dict.fromkeys(keys, 1)
    # A call and a finish per run, each executed by exactly one of the two.
    assert first.executed + second.executed == 40


async def test_the_execution_hold_stops_all_dispatch(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-3"})
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true")
    assert await dispatcher.run_once() == 0
    assert (await dispatcher.claimer.next_wake()).execution_hold
    assert (await kit.stats())["received"] == {}

    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = false")
    await dispatcher.drain()
    assert (await kit.run(run_id))["state"] == "succeeded"


async def test_an_answer_after_a_restore_hold_does_not_advance_the_step(kit: DispatchKit) -> None:
    await kit.fault(mode="hang-after", count=1)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-4"})
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await kit.messaging.faults.wait_hanging(1)
    # A restore-hold raises the epoch while the command is out.
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true, epoch = epoch + 1")
    kit.messaging.faults.release()
    await working
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("prepared", None)
    assert (await kit.run(run_id))["state"] == "running"


async def test_stopping_while_a_call_hangs_makes_it_uncertain_within_the_budget(
    kit: DispatchKit,
) -> None:
    await kit.fault(mode="hang-after")
    dispatcher = await kit.dispatcher(DispatchSettings(shutdown_budget_seconds=0.5))
    task = asyncio.create_task(dispatcher.run())
    run_id = await kit.start("notice", {"applicantRef": "applicant-5"})
    async with asyncio.timeout(10):
        await kit.messaging.faults.wait_hanging(1)
    started = time.monotonic()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 3.0

    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["lease_owner"]) == ("uncertain", "unknown", None)
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("held", True)
    assert (await kit.stats())["processed"] == {kit.key(run_id): 1}


class Gate:
    """An ASGI wrapper that holds requests to one path until opened."""

    def __init__(self, app: Any, path: str) -> None:
        self.app = app
        self.path = path
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == self.path:
            self.entered.set()
            await self.opened.wait()
        await self.app(scope, receive, send)


async def test_stopping_gives_back_claimed_work_that_was_not_sent(kit: DispatchKit) -> None:
    gate = Gate(kit.issuer.app, "/token")
    kit.router.add(ISSUER, gate)
    dispatcher = await kit.dispatcher(DispatchSettings(shutdown_budget_seconds=5.0))
    task = asyncio.create_task(dispatcher.run())
    run_id = await kit.start("notice", {"applicantRef": "applicant-6"})
    async with asyncio.timeout(10):
        await gate.entered.wait()
    assert (await kit.step(run_id, "send"))["lease_owner"] == dispatcher.owner
    started = time.monotonic()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # Nothing was out, so nothing had to be waited for.
    assert time.monotonic() - started < 2.0

    send = await kit.step(run_id, "send")
    assert (send["state"], send["lease_owner"], send["effect"]) == ("ready", None, None)
    assert send["due_at"] is not None
    assert (await kit.run(run_id))["state"] == "running"
    assert (await kit.stats())["received"] == {}


async def test_the_metrics_rpc_answers_the_dispatcher_series(kit: DispatchKit) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-7"})
    await dispatcher.drain()
    service = DispatcherService(dispatcher.store, dispatcher.metrics)
    text = (await service.Metrics(pb.Empty(), None)).text
    assert 'coordinator_calls_total{connection_type="messaging",result="accepted"} 1.0\n' in text
    assert "coordinator_admission_to_dispatch_seconds_count 1.0\n" in text
    assert run_id not in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    label_names = set(re.findall(r'[{,]([a-z_]+)="', "\n".join(samples)))
    calls = {"connection_type", "result", "le"}
    # The process series (component, python_info's versions, the gc generation) and
    # coordinator_build_info{version,python}.
    process = {"component", "generation", "implementation", "major", "minor", "patchlevel"}
    assert label_names == calls | process | {"version", "python"}
    assert 'python_info{component="dispatcher",' in text
    health = await service.Check(pb.Empty(), None)
    assert (health.store_ready, health.activation_ready, list(health.reasons)) == (True, True, [])


async def test_serve_answers_health_and_stops_when_cancelled(
    kit: DispatchKit, tmp_path: Path
) -> None:
    runtime = Runtime(
        kit.checked, kit.runtime.resolver, unix_endpoints(tmp_path / "sockets"), False
    )
    started = asyncio.Event()
    serving = asyncio.create_task(serve(runtime, started))
    async with asyncio.timeout(15):
        await started.wait()
    try:
        async with channel(runtime.endpoints, "dispatcher") as chan:
            stub = pb_grpc.DispatcherStub(chan)
            health = await stub.Check(pb.Empty(), timeout=5)
            assert (health.store_ready, health.activation_ready) == (True, True)
            metrics = await stub.Metrics(pb.Empty(), timeout=5)
            assert "# TYPE coordinator_calls_total counter" in metrics.text
    finally:
        serving.cancel()
        # Bounded by the contract's stop budget, not timed: a loaded machine may be slow.
        async with asyncio.timeout(STOP_BUDGET_SECONDS):
            with contextlib.suppress(asyncio.CancelledError):
                await serving
    with pytest.raises(grpc.aio.AioRpcError):
        async with channel(runtime.endpoints, "dispatcher") as chan:
            await pb_grpc.DispatcherStub(chan).Check(pb.Empty(), timeout=1)


async def test_a_stop_that_arrives_with_a_wake_up_still_stops_the_loop(kit: DispatchKit) -> None:
    # Python 3.11's asyncio.wait_for returns the awaited result and drops the cancellation
    # when both are ready in the same turn of the loop; the idle loop must stop anyway.
    dispatcher = await kit.dispatcher(DispatchSettings(idle_cap_seconds=600))
    task = asyncio.create_task(dispatcher.run())
    wake = dispatcher._wake  # the event the idle loop sleeps on
    async with asyncio.timeout(10):
        while not wake._waiters:  # asyncio.Event keeps its sleepers here
            await asyncio.sleep(0)
    dispatcher.wake()
    task.cancel()
    # asyncio.wait, not a timeout around ``await task``: that would cancel the task again.
    await asyncio.wait({task}, timeout=STOP_BUDGET_SECONDS)
    stopped = task.done()
    if not stopped:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert stopped, "the dispatcher's loop took a wake-up for its stop and went on"
    assert task.cancelled()


async def test_a_hold_placed_while_a_step_is_claimed_keeps_its_command_from_leaving(
    kit: DispatchKit,
) -> None:
    gate = Gate(kit.issuer.app, "/token")
    kit.router.add(ISSUER, gate)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-8"})
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await gate.entered.wait()
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true, epoch = epoch + 1")
    gate.opened.set()
    await working

    send = await kit.step(run_id, "send")
    # A lease from before the hold writes nothing, not even its own release: a real
    # restore-hold clears leases itself, and this bare epoch bump leaves it to expire.
    assert (send["state"], send["lease_owner"], send["command_key"]) == (
        "ready",
        dispatcher.owner,
        None,
    )
    assert (await kit.stats())["received"] == {}


async def test_expired_leases_are_looked_for_at_most_once_per_sweep_interval(
    kit: DispatchKit,
) -> None:
    store = Store(kit.runtime, "dispatcher")
    kit.stores.append(store)
    await store.open()
    now = [100.0]
    dispatcher = Dispatcher.from_store(store, kit.http, monotonic=lambda: now[0])
    sweeps: list[float] = []
    sweep = dispatcher.claimer.sweep

    async def counted() -> Sweep:
        sweeps.append(now[0])
        return await sweep()

    dispatcher.claimer.sweep = counted  # type: ignore[method-assign]
    for instant in (100.0, 100.4, 100.99, 101.0, 101.5, 102.2):
        now[0] = instant
        await dispatcher._look()  # one round of the loop, as run() makes them
    # The first look sweeps, then one every sweep_interval_seconds (1 s by default).
    assert sweeps == [100.0, 101.0, 102.2]
