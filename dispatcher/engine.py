"""The dispatcher: the claim loop, the steps in flight, and a graceful stop.

:meth:`Dispatcher.run` loops until cancelled: release expired leases, claim as many due
steps as there are free slots (at most ``concurrency`` in flight), start one task per step,
then sleep until notified (``LISTEN``), until a task finishes, or until the next due instant
the database reported — whichever comes first.

A step of a run being cancelled that the cancel abandoned (see :mod:`core.execution.settlement`)
and that comes to be claimed anyway — recovery ends the unleased ones itself, so only a
claim racing the cancel gets here — is ended ``cancelled`` before its executor runs:
nothing is sent, read or decided for it.

Stopping (the task is cancelled; the launcher does that on SIGTERM): claim nothing more;
steps that have sent nothing are given back at once (a prepared but unsent command becomes
ready again); steps whose command is out get ``shutdown_budget_seconds`` to be answered and
recorded, after which they are cut off and marked uncertain — they are never resent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping

import asyncpg

from core.codes import Code
from core.crypto import Keyring, keyring_from_config
from core.errors import CoordinatorError
from core.execution.settlement import CANCEL
from core.execution.steps import Reached
from core.products.calls import ConnectionCalls
from core.products.http import Exchanger, ProductHttp, refuse_retired_settings
from core.products.tokens import ConnectionTokens
from core.runtime import Store
from core.states import StepState
from core.workflow.stored import WorkflowCache
from dispatcher.claim import Claimed, Claimer, Listener
from dispatcher.crash_points import CrashPoints, NoCrash
from dispatcher.metrics import DispatchMetrics
from dispatcher.run_view import load_claimed
from dispatcher.settings import DispatchSettings
from dispatcher.settle import Settler
from dispatcher.steps.base import WORKING, Flight, StepEnv
from dispatcher.steps.executors import EXECUTORS

log = logging.getLogger("coordinator.dispatcher")

STORE_WAIT_SECONDS = 1.0
# Recording a given-back step; with the shutdown budget this keeps a stop under ~10 s.
GIVE_BACK_SECONDS = 2.0


def product_client(environ: Mapping[str, str]) -> ProductHttp:
    """The HTTP client for products and the issuer (see :mod:`core.products.http`); refuses
    a setting it no longer reads, if ``environ`` has one."""
    refuse_retired_settings(environ)
    return ProductHttp()


class Dispatcher:
    """One dispatcher replica working on one deployment's database."""

    def __init__(
        self,
        store: Store,
        *,
        keyring: Keyring,
        admission_key: bytes,
        tokens: ConnectionTokens,
        http: Exchanger,
        calls: ConnectionCalls,
        settings: DispatchSettings | None = None,
        metrics: DispatchMetrics | None = None,
        owner: str | None = None,
        jitter: Callable[[], float] = random.random,
        crash_points: CrashPoints | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings or DispatchSettings()
        self.metrics = metrics or DispatchMetrics()
        # The owner names this replica in lease columns; unique per process start so a
        # restarted dispatcher never mistakes an old lease for its own.
        self.owner = owner or f"dispatcher-{uuid.uuid4().hex[:16]}"
        self.claimer = Claimer(store, self.owner, self.settings)
        self.settler = Settler(store, keyring, self.owner)
        self.workflows = WorkflowCache()
        self.env = StepEnv(
            store=store,
            settler=self.settler,
            settings=self.settings,
            metrics=self.metrics,
            keyring=keyring,
            admission_key=admission_key,
            tokens=tokens,
            http=http,
            calls=calls,
            stopping=lambda: self.stopping,
            jitter=jitter,
            crash_points=crash_points or NoCrash(),
        )
        self.stopping = False
        self._executed = 0
        self.progress = asyncio.Condition()
        """Notified whenever a step execution ends; tests wait on it instead of sleeping."""
        self._wake = asyncio.Event()
        self._flights: dict[asyncio.Task[None], Flight] = {}
        self.listener = Listener(store, self._wake.set)
        self._monotonic = monotonic
        self._next_sweep = float("-inf")

    @property
    def executed(self) -> int:
        """Steps this dispatcher finished working on (whatever the outcome), counting the
        local steps a settling statement recorded (see :mod:`core.execution.onward`)."""
        return self._executed + self.settler.steps_done_inline + self.settler.calls_chained

    @classmethod
    def from_store(
        cls,
        store: Store,
        http: Exchanger,
        *,
        settings: DispatchSettings | None = None,
        metrics: DispatchMetrics | None = None,
        owner: str | None = None,
        crash_points: CrashPoints | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> Dispatcher:
        """A dispatcher for the store's runtime file: its keys and connections."""
        runtime = store.runtime
        config = runtime.config
        return cls(
            store,
            keyring=keyring_from_config(config, runtime.resolver),
            admission_key=runtime.resolver.read_key(config.deployment.admission_key_ref),
            tokens=ConnectionTokens(config, runtime.resolver, http),
            http=http,
            calls=ConnectionCalls(config, runtime.resolver),
            settings=settings,
            metrics=metrics,
            owner=owner,
            crash_points=crash_points,
            monotonic=monotonic,
        )

    @property
    def in_flight(self) -> int:
        """Steps being worked on now."""
        return len(self._flights)

    def wake(self) -> None:
        """Look for work now (a notification does the same)."""
        self._wake.set()

    # ------------------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Claim and execute due work until cancelled, then stop gracefully."""
        listening = asyncio.create_task(self.listener.run(), name="dispatcher-listen")
        try:
            while True:
                delay = await self._look()
                # Not asyncio.wait_for: on Python 3.11 it drops a cancellation that
                # arrives with the wake-up, and the loop would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
        finally:
            self.stopping = True
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listening
            await self._stop_flights()

    async def _look(self) -> float:
        """One round: sweep (at most once per ``sweep_interval_seconds``), claim, start
        tasks. Answers how long to sleep if not woken."""
        self._wake.clear()
        try:
            if self._monotonic() >= self._next_sweep:
                await self.claimer.sweep()
                self._next_sweep = self._monotonic() + self.settings.sweep_interval_seconds
            free = self.settings.concurrency - len(self._flights)
            claimed = await self.claimer.claim(free)
            for step in claimed:
                self._start(step)
            if free > 0 and len(claimed) == free:
                return 0.0  # there may be more due work than slots were free
            if free <= len(claimed):
                return self.claimer.idle_cap()  # full: a finishing task wakes the loop
            wake = await self.claimer.next_wake()
            sweep_in = max(0.0, self._next_sweep - self._monotonic())
            return wake.delay(self.claimer.idle_cap(), sweep_in)
        except CoordinatorError as exc:
            if exc.code != Code.SERVICE_UNAVAILABLE:
                raise
            return STORE_WAIT_SECONDS
        except asyncpg.PostgresError as exc:
            # A deadlock or a cancelled statement is worth another look, not a crash.
            log.warning("looking for due work failed (%s); looking again", type(exc).__name__)
            return STORE_WAIT_SECONDS

    def _start(self, step: Claimed) -> None:
        flight = Flight()
        task = asyncio.create_task(self._execute(step, flight), name=f"step-{step.step_id}")
        self._flights[task] = flight
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._flights.pop(task, None)
        self._wake.set()

    async def run_once(self) -> int:
        """Sweep, claim every due step there is room for, execute them, and wait for them.

        For tests and tools that drive the dispatcher step by step; answers how many steps
        were executed, the local steps their settling statements recorded included.
        """
        await self.claimer.sweep()
        claimed = await self.claimer.claim(self.settings.concurrency)
        flights = [Flight() for _ in claimed]
        before = self.executed
        await asyncio.gather(
            *(self._execute(step, flight) for step, flight in zip(claimed, flights, strict=True))
        )
        return self.executed - before

    async def drain(self, limit: int = 100) -> int:
        """:meth:`run_once` until nothing is due; answers the total executed."""
        total = 0
        for _ in range(limit):
            done = await self.run_once()
            if not done:
                return total
            total += done
        raise RuntimeError(f"work was still due after {limit} rounds")

    # ---------------------------------------------------------------------- one step

    async def _execute(self, claimed: Claimed, flight: Flight) -> None:
        renewing = asyncio.create_task(self._renew(claimed, flight))
        try:
            await self._run_step(claimed, flight)
        except asyncio.CancelledError:
            await self._give_back(flight.step or claimed, flight, 0.0)
            raise
        except CoordinatorError as exc:
            current = flight.step or claimed
            if exc.code == Code.SERVICE_UNAVAILABLE:
                # Expected while the database is away: the store says so itself
                # (``store-unavailable``, rate-limited); the step is only paused.
                log.warning(
                    "step %s of run %s paused: the database cannot be reached; "
                    "it will be tried again",
                    current.step_id,
                    current.run_id,
                )
            else:
                _unexpected(current, exc)
            await self._give_back(current, flight, self.settings.error_retry_seconds)
        except Exception as exc:
            _unexpected(flight.step or claimed, exc)
            await self._give_back(flight.step or claimed, flight, self.settings.error_retry_seconds)
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            self._executed += 1
            async with self.progress:
                self.progress.notify_all()

    async def _run_step(self, claimed: Claimed, flight: Flight) -> None:
        log.info(
            "run %s step %s: claimed (%s, %s, attempts so far %d)",
            claimed.run_id,
            claimed.step_id,
            claimed.step_type,
            claimed.state,
            claimed.attempts,
        )
        # The claim statement read the run and what a call of it needs: no read here.
        loaded = await load_claimed(claimed, self.store, self.settler.keyring, self.workflows)
        if loaded is None:
            await self.settler.release(claimed)
            return
        run = loaded.run
        if claimed.abandoned and claimed.state != StepState.PREPARED:
            # (A prepared command may have left: the call executor makes it uncertain.) A
            # cancel is never undone, so the step is still abandoned when step_settle locks
            # it, and ends cancelled (or the lease was lost, or the run ended meanwhile).
            await self.settler.conclude(claimed, CANCEL)
            return
        step = run.workflow.step(claimed.step_id)
        now = claimed.now
        assert now is not None  # a claimed row carries the database's clock
        at = Reached(run.workflow, run.scope, now, run.bindings)
        await EXECUTORS[claimed.step_type](self.env, claimed, loaded, step, flight, at)

    async def _give_back(self, claimed: Claimed, flight: Flight, delay: float) -> None:
        """Give up the lease without an outcome; what was sent becomes uncertain."""
        try:
            async with asyncio.timeout(GIVE_BACK_SECONDS):
                if flight.phase == WORKING:
                    await self.settler.unprepare(claimed, delay)
                else:
                    await self.settler.release(claimed, delay)
        except (TimeoutError, CoordinatorError, OSError):
            # The lease runs out by itself; whoever finds it then treats a prepared
            # command as uncertain.
            log.warning("could not give back step %s of run %s", claimed.step_id, claimed.run_id)

    async def _renew(self, claimed: Claimed, flight: Flight) -> None:
        """Extend the lease of the step the execution works on (the call it went on to,
        once it went on) every third of a lease, until the execution ends. A lost lease is
        said once; the loop goes on, since the execution may yet go on to another call."""
        interval = self.settings.lease_seconds / 3
        lost: Claimed | None = None
        while True:
            await asyncio.sleep(interval)
            current = flight.step or claimed
            if current is lost:
                continue
            try:
                renewed = await self.settler.renew(current, self.settings.lease_seconds)
                if not renewed and (flight.step or claimed) is current:
                    lost = current
                    log.warning(
                        "lease on step %s of run %s was lost", current.step_id, current.run_id
                    )
            except (CoordinatorError, OSError):
                continue  # the store is away; the lease may still hold when it returns

    # ---------------------------------------------------------------------- stopping

    async def _stop_flights(self) -> None:
        """Give back unsent work now; wait a while for sent commands, then cut them off."""
        for task, flight in list(self._flights.items()):
            if flight.phase == WORKING:
                task.cancel()
        tasks = set(self._flights)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_budget_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=GIVE_BACK_SECONDS + 1.0)


def _unexpected(claimed: Claimed, exc: Exception) -> None:
    detail = exc.detail if isinstance(exc, CoordinatorError) else ""
    log.error(
        "step %s of run %s failed unexpectedly (%s%s); it will be tried again",
        claimed.step_id,
        claimed.run_id,
        type(exc).__name__,
        f": {detail}" if detail else "",
    )
