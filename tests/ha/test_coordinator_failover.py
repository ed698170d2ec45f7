"""The coordinator over a Patroni pair: the primary's machine is lost under load (issue 40).

The coordinator (all five components, real processes talking gRPC) runs a deployment whose
runtime and migration URLs name both servers (CONTRACT §6.5). While the load driver of the
reliability tier starts runs through the HTTP API and the dispatcher sends their commands
to the Messaging stand-in, the primary's Patroni and postmaster are killed with SIGKILL and
a few calls are out (the stand-in processed them and holds their answers back). Patroni
promotes the synchronous standby; the same coordinator processes, never restarted, find it
through the same URL, run the activation checks on it, and go on. Afterwards the
invariants of :mod:`tests.helpers.load_kit` hold: every run admitted with a 2xx exists,
nothing was processed or sent twice, every held run shows why, the audit chain verifies.

The coordinator runs beside the test process (on the bridge's watcher address), not on a
host of its own: its loss is the dispatcher drill's, still to come.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any, Final

import pytest

from devstack.postgres import DatabaseHandle, ExternalPostgres
from devstack.stack import wait_until
from tests.helpers.faults import COMPONENTS, component_pid, fault_stack
from tests.helpers.ha_cluster import HaCluster, ha_cluster
from tests.helpers.load_kit import (
    LoadDriver,
    assert_no_traceback,
    check_invariants,
    hold_calls,
    observe,
    release_held,
    settle,
    unknown_steps,
    wait_flowing,
    write_figures,
)

pytestmark = [pytest.mark.slow]

FLOW_RUNS: Final = 15
"""Runs admitted (and some dispatched) before the kill and again after it."""
IN_FLIGHT: Final = 3
"""Calls whose answers the stand-in holds back until the primary is gone."""


@pytest.fixture
def cluster() -> Iterator[HaCluster]:
    with ha_cluster(synchronous=True) as made:
        yield made


def _database(cluster: HaCluster) -> DatabaseHandle:
    """A database for the deployment on the pair, its URLs naming the leader first."""
    leader = cluster.leader()
    assert leader is not None
    server = ExternalPostgres.open(cluster.url(), cluster.ca.pem)
    handle = server.create_database("registry")
    others = tuple((node.host.address, 5432) for node in cluster.nodes if node is not leader)
    return dataclasses.replace(handle, host=leader.host.address, port=5432, more_hosts=others)


@pytest.mark.timeout(300)
def test_the_primary_lost_under_load_loses_no_run_and_sends_nothing_twice(
    cluster: HaCluster,
) -> None:
    with fault_stack(_database(cluster)) as stack:
        driver = LoadDriver(stack, label="haload")
        launcher = stack.start()
        pids = {name: component_pid(launcher, name) for name in COMPONENTS}
        old = cluster.leader()
        assert old is not None
        with driver:
            wait_flowing(stack, driver, FLOW_RUNS, "runs flowing before the kill")
            hold_calls(stack, IN_FLIGHT, "the primary's loss")
            before = driver.figures()
            killed_at = time.monotonic()
            cluster.kill_node(old)
            promoted = cluster.wait_for(
                "the standby promoted",
                lambda: (leader := cluster.leader()) is not None and leader is not old,
            )
            # The held answers arrive once the primary is gone.
            release_held(stack, IN_FLIGHT)
            driver.wait_admitted(1, "a run admitted on the new primary")
            admitted_again = time.monotonic() - killed_at
            wait_flowing(stack, driver, FLOW_RUNS, "runs flowing after the kill")
            during = driver.figures().since(before)
            settle(stack, driver)
        seen = observe(stack, driver.admitted_ids())
        verdict = check_invariants(seen)
        load = driver.figures()
        unknown = sum(len(steps) for steps in unknown_steps(stack).values())
        figures: dict[str, Any] = {
            "promotedAfterSeconds": round(promoted, 1),
            "firstRunAdmittedAgainAfterSeconds": round(admitted_again, 1),
            "startsAttempted": load.attempted,
            "startAnswers": {str(k): v for k, v in sorted(load.statuses.items())},
            "startsRefused503AroundTheKill": during.statuses.get(503, 0),
            "startsUnanswered": load.unanswered,
            "unknownEffects": unknown,
            **verdict.figures,
        }
        write_figures("ha-primary-killed", figures)
        verdict.assert_holds()
        # The same processes throughout: nothing was restarted to recover.
        assert launcher.poll() is None
        assert {name: component_pid(launcher, name) for name in COMPONENTS} == pids
        assert set(load.statuses) <= {201, 503}, load.statuses
        assert load.unanswered == 0
        assert_no_traceback(stack)
        # Serving moved to the new primary, and said so.
        new = cluster.leader()
        assert new is not None and new is not old
        doctor = stack.get("/v1/operator/doctor").json()
        assert doctor["state"]["storeHost"] == f"{new.host.address}:5432"
        wait_until(stack.ready, "/ready on the new primary")
