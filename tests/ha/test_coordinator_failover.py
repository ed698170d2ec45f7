"""The coordinator over a Patroni pair: the primary's machine lost, and a planned switchover,
under load (issue 40).

The coordinator (all five components, real processes talking gRPC) runs on a host of its
own, the issuer and the Messaging stand-in on another (:mod:`tests.helpers.ha_spread`), and
the deployment's runtime and migration URLs name both servers (CONTRACT §6.5). While the
load driver of the reliability tier starts runs through the HTTP API and the dispatcher
sends their commands, the primary changes with a few calls out (the stand-in processed them
and holds their answers back):

- **kill**: the primary's Patroni and postmaster are killed with SIGKILL; Patroni promotes
  the synchronous standby; later the old primary is started again and rejoins as the
  standby (``pg_rewind``), while the coordinator stays on the new one;
- **switchover**: ``patronictl switchover`` hands the primary over on purpose;
- **kill, asynchronous replication**: the kill again on a pair without synchronous
  replication. What the new primary never saw is reported, not forbidden (issue 40 item 3):
  admitted runs it lacks, and commands sent again with their same key because their
  prepare was lost. What must hold even then: nothing processed twice by the product (the
  key), no held run without a reason, the coordinator back by itself.

The same coordinator processes, never restarted, find the new primary through the same URL,
run the activation checks on it, and go on. Afterwards the invariants of
:mod:`tests.helpers.load_kit` hold: every run admitted with a 2xx exists, nothing was
processed or sent twice, every held run shows why, the audit chain verifies.
"""

from __future__ import annotations

import time
from typing import Any, Final

import pytest

from devstack.stack import wait_until
from tests.helpers.faults import COMPONENTS, component_pid
from tests.helpers.ha_cluster import HaCluster, Node, ha_cluster
from tests.helpers.ha_spread import TRUST_ENV, database_on, spread_stack
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
"""Runs admitted (and some dispatched) before the fault and again after it."""
IN_FLIGHT: Final = 3
"""Calls whose answers the stand-in holds back until the primary has changed."""
ALWAYS: Final = ("duplicated: ", "held without a reason: ", "unknown effect", "audit chain")
"""Invariants that hold even when a failover lost acknowledged writes (a lost run whose
command the product processed is an orphan effect there: reported, not forbidden)."""


def _other(cluster: HaCluster, node: Node) -> Node:
    return next(other for other in cluster.nodes if other is not node)


def _drill(
    cluster: HaCluster, monkeypatch: pytest.MonkeyPatch, fault: str, family: str
) -> dict[str, Any]:
    """Run the coordinator under load through ``fault`` (kill or switchover) of the primary;
    answers the figures (written as ``family``) and the verdict's violations."""
    with spread_stack(cluster, database_on(cluster)) as spread:
        monkeypatch.setenv(TRUST_ENV, str(spread.trust_file))
        stack = spread.stack
        driver = LoadDriver(stack, label="haload")
        launcher = stack.start(prefix=spread.core.command())
        pids = {name: component_pid(launcher, name) for name in COMPONENTS}
        old = cluster.leader()
        assert old is not None
        with driver:
            wait_flowing(stack, driver, FLOW_RUNS, f"runs flowing before the {fault}")
            cluster.wait_for("the standby caught up", cluster.standby_promotable)
            hold_calls(stack, IN_FLIGHT, f"the {fault}")
            before = driver.figures()
            began = time.monotonic()
            if fault == "kill":
                cluster.kill_node(old)
            else:
                cluster.switchover(old, _other(cluster, old))
            promoted = cluster.wait_for(
                "the other server promoted",
                lambda: (leader := cluster.leader()) is not None and leader is not old,
            )
            release_held(stack, IN_FLIGHT)
            driver.wait_admitted(1, "a run admitted on the new primary")
            admitted_again = time.monotonic() - began
            wait_flowing(stack, driver, FLOW_RUNS, f"runs flowing after the {fault}")
            during = driver.figures().since(before)
            settle(stack, driver)
        seen = observe(stack, driver.admitted_ids())
        verdict = check_invariants(seen)
        load = driver.figures()
        new = cluster.leader()
        assert new is not None and new is not old
        figures: dict[str, Any] = {
            "replication": "synchronous" if cluster.synchronous else "asynchronous",
            "promotedAfterSeconds": round(promoted, 1),
            "firstRunAdmittedAgainAfterSeconds": round(admitted_again, 1),
            "startsAttempted": load.attempted,
            "startAnswers": {str(k): v for k, v in sorted(load.statuses.items())},
            f"startsRefused503AroundThe{fault.title()}": during.statuses.get(503, 0),
            "startsUnanswered": load.unanswered,
            "unknownEffects": sum(len(steps) for steps in unknown_steps(stack).values()),
            **verdict.figures,
            "violations": verdict.violations[:20],
        }
        # The same processes throughout: nothing was restarted to recover.
        assert launcher.poll() is None
        assert {name: component_pid(launcher, name) for name in COMPONENTS} == pids
        assert set(load.statuses) <= {201, 503}, load.statuses
        assert load.unanswered == 0
        assert_no_traceback(stack)
        # Serving moved to the new primary, and said so.
        doctor = stack.get("/v1/operator/doctor").json()
        assert doctor["state"]["storeHost"] == f"{new.host.address}:5432"
        wait_until(stack.ready, "/ready on the new primary")

        if fault == "kill":
            # The old primary comes back as the standby (pg_rewind where it had gone
            # ahead); the coordinator stays where it writes, and works on.
            cluster.start_node(old)
            figures["oldPrimaryRejoinedAfterSeconds"] = round(
                cluster.wait_for("the old primary rejoined", cluster.healthy_pair), 1
            )
            assert cluster.leader() is new
            barrier = stack.finish_barrier_run()
            assert stack.processed(barrier) == 1
            doctor = stack.get("/v1/operator/doctor").json()
            assert doctor["state"]["storeHost"] == f"{new.host.address}:5432"
        write_figures(family, figures)
        if cluster.synchronous:
            verdict.assert_holds()
        else:
            kept = [v for v in verdict.violations if v.startswith(ALWAYS)]
            assert not kept, kept
        return figures


@pytest.mark.timeout(300)
def test_the_primary_lost_under_load_loses_no_run_and_sends_nothing_twice(
    cluster: HaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _drill(cluster, monkeypatch, "kill", "ha-primary-killed")
    assert figures["lost"] == 0 and figures["resent"] == 0


@pytest.mark.timeout(300)
def test_a_planned_switchover_under_load_loses_no_run_and_sends_nothing_twice(
    cluster: HaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _drill(cluster, monkeypatch, "switchover", "ha-switchover")
    assert figures["lost"] == 0 and figures["resent"] == 0


@pytest.mark.timeout(300)
def test_without_synchronous_replication_the_loss_is_counted_and_nothing_processed_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ha_cluster(synchronous=False) as cluster:
        figures = _drill(cluster, monkeypatch, "kill", "ha-primary-killed-async")
    # What was lost is a figure of this drill (the note reports it); what may never happen
    # is checked inside the drill. The counts must agree with themselves.
    assert figures["admitted"] - figures["lost"] <= figures["stored"]
    assert figures["duplicated"] == 0
