"""PostgreSQL faults under load (issue 27, item 4; CONTRACT §2.1, §9.3).

While a load driver starts runs through the HTTP API and the dispatcher sends their commands
to the Messaging stand-in, the test takes the database away three ways:

- **killed**: ``kill -9`` of the postmaster (its backends die with it), then a restart,
  which runs crash recovery;
- **stopped past a lease**: ``pg_ctl stop -m fast``, the coordinator's clock moved past the
  30 s lease while the server is down, then a restart; every lease taken before the outage
  has run out when the database returns;
- **starved**: the runtime role's connection slots revoked (``CONNECTION LIMIT 0``) and its
  sessions ended, so the server runs but refuses the coordinator every connection; then the
  slots given back.

Each time, a few calls are out when the database goes: the stand-in has processed them
and holds their answers back, and lets them go while the database is away (so the
dispatcher knows an outcome it cannot record yet) or, past a lease, only once the leases
have run out (so the calls must become unknown effects, shown by inspection).

Each time the service must log ``store-unavailable``, answer 503 ``service.unavailable``
(``/ready`` too) while the database is away, and come back by itself — the same coordinator
processes, never restarted — and start and dispatch runs again. Afterwards the invariants of
:mod:`tests.helpers.load_kit` hold: every run admitted with a 2xx exists, no command was
processed (or sent) twice, every held run shows why, the audit chain verifies.

The server is the test's own (it is killed), and durable: with ``synchronous_commit`` off,
a killed server may lose the last commits it acknowledged, which is the harness's speed
setting and not something the coordinator could help.

``COORDINATOR_RELIABILITY_LONG=1`` runs the three faults three times over.

The checker's broken variants, and the regression test of the defect this family found (a
connection lost inside a transaction answered 500), close the module.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.codes import Code
from core.db.connect import connect
from core.errors import CoordinatorError
from core.payloads import transaction
from core.runtime import Store
from devstack.postgres import RUNTIME_ROLE, DatabaseHandle, PostgresServer
from devstack.stack import wait_until
from tests.helpers.dispatching import DispatchKit, dispatch_kit
from tests.helpers.faults import (
    COMPONENTS,
    LEASE_SECONDS,
    WAIT_SECONDS,
    FaultStack,
    children_of,
    component_pid,
    fault_stack,
)
from tests.helpers.load_kit import (
    EXPECTED_VIOLATION,
    LoadDriver,
    assert_broken_variants_fail,
    assert_no_traceback,
    broken_variants,
    check_invariants,
    fabricated_observation,
    hold_calls,
    keep_exposure,
    observe,
    release_held,
    settle,
    unknown_steps,
    wait_flowing,
    write_figures,
)
from tests.reliability.exposure import EXPOSURE

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

FAMILY = "postgres-faults"
LONG = os.environ.get("COORDINATOR_RELIABILITY_LONG") == "1"
ROUNDS = 3 if LONG else 1
NOTICE = re.compile(r"^store-unavailable: (\w+): ", re.MULTILINE)
FLOW_RUNS = 15
"""Runs admitted (and some dispatched) before each fault and again after it."""
IN_FLIGHT = 3
"""Calls whose answers the stand-in holds back until the database is away."""
PROBES = 3
"""API calls of each kind made while the database is away; each must answer 503."""


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    server = PostgresServer.start(durable=True)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------- the faults


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _superuser(server: PostgresServer, *sql: str) -> None:
    async def run() -> None:
        conn = await server.superuser_connect()
        try:
            for text in sql:
                await conn.execute(text)
        finally:
            await conn.close()

    asyncio.run(run())


@dataclass(frozen=True)
class Fault:
    """One way of taking the database away and giving it back."""

    name: str
    inject: Callable[[], None]
    restore: Callable[[], None]
    while_away: Callable[[], None] = lambda: None
    past_lease: bool = False
    """The outage outlasts the lease (the clock is moved while the database is away)."""


def _faults(server: PostgresServer, stack: FaultStack) -> list[Fault]:
    def kill_postmaster() -> None:
        pid = int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])
        backends = [child for child, _command in children_of(pid)]
        os.kill(pid, signal.SIGKILL)
        # Its backends notice and exit; the cluster restarts only once all of them are gone
        # (they still hold its shared memory).
        wait_until(
            lambda: not any(_alive(p) for p in [pid, *backends]),
            "the killed postmaster's processes gone",
            timeout=WAIT_SECONDS,
        )
        # A new postmaster takes a dead one that was not reaped yet (a zombie) for a running
        # server and refuses to start: wait for the reaping, and where nobody reaps (a
        # container without an init), remove its lock files as an operator would.
        with contextlib.suppress(RuntimeError):
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), "reaped", timeout=10)
        if Path(f"/proc/{pid}").exists():
            (server.data_dir / "postmaster.pid").unlink(missing_ok=True)
            (server.socket_dir / f".s.PGSQL.{server.port}.lock").unlink(missing_ok=True)

    starve = (
        f"ALTER ROLE {RUNTIME_ROLE} CONNECTION LIMIT 0",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        f" WHERE usename = '{RUNTIME_ROLE}' AND pid <> pg_backend_pid()",
    )
    return [
        Fault("killed", kill_postmaster, server.start_again),
        Fault(
            "stopped past a lease",
            server.halt,
            server.start_again,
            # Leases are judged by the database's clock, which is the coordinator's.
            while_away=lambda: stack.advance(LEASE_SECONDS + 1),
            past_lease=True,
        ),
        Fault(
            "starved",
            lambda: _superuser(server, *starve),
            lambda: _superuser(server, f"ALTER ROLE {RUNTIME_ROLE} CONNECTION LIMIT -1"),
        ),
    ]


def _problem_code(answer: httpx.Response) -> str:
    assert answer.headers["content-type"].startswith("application/problem+json"), answer.text
    EXPOSURE.keep_response(f"{FAMILY}/503-{answer.request.method}", answer)
    return f"{answer.status_code} {answer.json()['code']}"


def _survive(
    stack: FaultStack,
    launcher: Any,
    pids: dict[str, int],
    driver: LoadDriver,
    fault: Fault,
) -> dict[str, Any]:
    """Take the database away under load, check what the service says meanwhile, give it
    back, and check the same processes start and dispatch runs again."""
    wait_flowing(stack, driver, FLOW_RUNS, f"runs flowing before {fault.name}")
    # A few calls are in flight when the database goes: the stand-in processes them and
    # holds their answers back. Once the fault is used up, that many requests are held.
    hold_calls(stack, IN_FLIGHT, fault.name)
    unknown_before = _unknown_count(stack)
    logged = len(stack.log_of(launcher))
    before = driver.figures()
    fault.inject()

    def not_ready() -> bool:
        answer = stack.get("/ready")
        return answer.status_code == 503 and "store-unavailable" in answer.json()["reasons"]

    wait_until(not_ready, f"{fault.name}: /ready answering 503 store-unavailable")
    known = next(iter(driver.admitted_ids()))
    codes = set()
    for _probe in range(PROBES):
        codes.add(_problem_code(stack.post_start(driver.subject)))
        codes.add(_problem_code(stack.get(f"/v1/runs/{known}", operator=False)))
        codes.add(_problem_code(stack.get("/v1/runs")))
    assert codes == {"503 service.unavailable"}, (fault.name, codes)

    def reported() -> bool:
        return bool(NOTICE.findall(stack.log_of(launcher)[logged:]))

    wait_until(reported, f"{fault.name}: store-unavailable on standard error")
    fault.while_away()
    if not fault.past_lease:
        # The held answers arrive while the database is away: known, not yet recorded.
        release_held(stack, IN_FLIGHT)
    during = driver.figures().since(before)
    fault.restore()

    wait_until(stack.ready, f"{fault.name}: /ready after the database returned")
    if fault.past_lease:
        # The held calls' leases ran out while the database was away: the dispatcher that
        # finds them so cannot know what their holder sent, so each becomes an unknown
        # effect, and its run is held. Their answers come too late to change that.
        wait_until(
            lambda: _unknown_count(stack) >= unknown_before + IN_FLIGHT,
            f"{fault.name}: the calls in flight uncertain once their leases ran out",
        )
        release_held(stack, IN_FLIGHT)
    wait_flowing(stack, driver, FLOW_RUNS, f"runs flowing after {fault.name}")
    # The same processes: nothing was restarted to recover.
    assert launcher.poll() is None, fault.name
    assert {name: component_pid(launcher, name) for name in COMPONENTS} == pids, fault.name
    notices = sorted(set(NOTICE.findall(stack.log_of(launcher)[logged:])))
    return {
        "fault": fault.name,
        "startsRefused503WhileAway": during.statuses.get(503, 0),
        "callsInFlight": IN_FLIGHT,
        "unknownEffectsMade": _unknown_count(stack) - unknown_before,
        "storeUnavailableFrom": notices,
    }


def _unknown_count(stack: FaultStack) -> int:
    return sum(len(steps) for steps in unknown_steps(stack).values())


# ---------------------------------------------------------------------------- the test


@pytest.mark.timeout(600 if LONG else 240)
def test_the_database_killed_stopped_and_starved_under_load(
    own_server: PostgresServer, tmp_path: Path
) -> None:
    with fault_stack(own_server.default) as stack:
        driver = LoadDriver(stack, label="pgload")
        try:
            launcher = stack.start()
            pids = {name: component_pid(launcher, name) for name in COMPONENTS}
            survived: list[dict[str, Any]] = []
            with driver:
                for _round in range(ROUNDS):
                    for fault in _faults(own_server, stack):
                        survived.append(_survive(stack, launcher, pids, driver, fault))
                settle(stack, driver)
            seen = observe(stack, driver.admitted_ids())
            verdict = check_invariants(seen)
            load = driver.figures()
            figures = {
                "faultsSurvived": len(survived),
                "postmasterKillsSurvived": sum(1 for f in survived if f["fault"] == "killed"),
                "faults": survived,
                "startsAttempted": load.attempted,
                "startAnswers": {str(k): v for k, v in sorted(load.statuses.items())},
                "startsUnanswered": load.unanswered,
                "refusalCodes": dict(driver.codes),
                **verdict.figures,
                "rounds": ROUNDS,
            }
            write_figures(f"{FAMILY}-long" if LONG else FAMILY, figures)
            verdict.assert_holds()

            # While the database was away, starts were refused with 503 and nothing else;
            # the gateway itself never went away.
            assert set(load.statuses) <= {201, 503}, load.statuses
            assert set(driver.codes) == {"503 service.unavailable"}, driver.codes
            assert load.unanswered == 0, driver.unanswered
            assert all(fault["startsRefused503WhileAway"] > 0 for fault in survived), survived
            # Every unknown effect the outages past a lease made is shown (the checker
            # looked), and there were some to show.
            assert verdict.figures["unknownEffectsShown"] >= IN_FLIGHT * ROUNDS, figures
            assert launcher.poll() is None
            assert_no_traceback(stack)

            # The same checker rejects this very observation once it is broken.
            assert_broken_variants_fail(seen, tmp_path)
        finally:
            keep_exposure(FAMILY, stack, driver)


# ---------------------------------------------------------------------------- the checker fails


def test_the_invariant_checker_accepts_an_observation_that_holds(tmp_path: Path) -> None:
    verdict = check_invariants(fabricated_observation(tmp_path))
    assert verdict.violations == []
    assert (verdict.figures["lost"], verdict.figures["duplicated"]) == (0, 0)
    assert verdict.figures["held"] == verdict.figures["heldWithReason"] == 1


@pytest.mark.parametrize("variant", sorted(EXPECTED_VIOLATION))
def test_the_invariant_checker_rejects_a_broken_observation(variant: str, tmp_path: Path) -> None:
    variants = broken_variants(fabricated_observation(tmp_path), tmp_path / "tampered.jsonl")
    verdict = check_invariants(variants[variant])
    assert any(v.startswith(EXPECTED_VIOLATION[variant]) for v in verdict.violations), (
        verdict.violations
    )
    with pytest.raises(AssertionError, match="invariants broken"):
        verdict.assert_holds()


# ---------------------------------------------------------------------------- defects found


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


async def test_a_connection_lost_inside_a_transaction_is_the_store_unavailable(
    kit: DispatchKit, database: DatabaseHandle
) -> None:
    """Found here: with the postmaster killed, a start answered 500 ``internal``. The
    session ended while a transaction was open, and leaving the transaction block then fails
    with a bare ``InterfaceError`` (the connection is closed) that was not taken for the
    database being away. Reproduced by ending the session from the server side (as the
    runtime role, which may end its own sessions) while it is inside a transaction."""
    store = Store(kit.runtime, "admission")
    kit.stores.append(store)
    await store.open()
    ender = await connect(database.runtime_url, database.ca_pem)
    try:
        with pytest.raises(CoordinatorError) as raised:
            async with transaction(store) as conn:
                await ender.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
                await conn.execute("SELECT 1")
    finally:
        await ender.close()
    assert raised.value.code == Code.SERVICE_UNAVAILABLE
    assert store.available is False
    # The pool replaces the lost connection by itself.
    async with transaction(store) as conn:
        assert await conn.fetchval("SELECT 1") == 1
    assert store.available is True
