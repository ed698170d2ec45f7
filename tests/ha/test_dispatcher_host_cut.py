"""A dispatcher's host cut off while it holds leases and calls are out (issue 40).

The gateway, admission, recovery and auditd run on the core host, the issuer and the
Messaging stand-in on the products host (:mod:`tests.helpers.ha_spread`), the database on
the Patroni pair, and the dispatchers on hosts of their own. Under load, with one dispatcher
(host ``disp1``) running, the stand-in processes a few commands and holds their answers;
then ``disp1``'s link goes down. Its dispatcher is not dead: it still holds its leases and
waits for its answers, cut off from the database and the product alike.

A second dispatcher starts on ``disp2``. While the cut-off holder's leases last it leaves
those steps alone; once the coordinator's clock is past them it takes the runs over, and as
it cannot know whether the calls took effect, it holds them for an operator (effect
unknown), sending nothing again. Then the link returns and the stand-in lets the held
answers go: the cut-off dispatcher receives answers that say the calls succeeded, and tries
to record them. The settle statement checks the lease it names against the step's (the
fence): the holder changed, so the statement records nothing and answers ``lease-lost``,
which the dispatcher logs. The held runs stay as the second dispatcher left them, each
command processed and received once, and the invariants of the reliability tier hold over
the whole run of the load.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final

import pytest

from devstack.stack import wait_until
from tests.helpers.faults import CALL_STEP, LEASE_SECONDS, WAIT_SECONDS, FaultStack
from tests.helpers.ha_cluster import HaCluster
from tests.helpers.ha_spread import TRUST_ENV, database_on, dispatcher_host, spread_stack
from tests.helpers.load_kit import (
    LoadDriver,
    assert_no_traceback,
    check_invariants,
    hold_calls,
    observe,
    release_held,
    settle,
    wait_flowing,
    write_figures,
)

pytestmark = [pytest.mark.slow]

FLOW_RUNS: Final = 15
IN_FLIGHT: Final = 3
"""Calls the stand-in processed and holds the answers of when the host is cut off."""
FENCED: Final = re.compile(r"step (\S+) of run (\S+): the lease was lost; nothing is recorded")


def _leased(stack: FaultStack) -> dict[str, str]:
    """Run id → lease owner, for every call step a dispatcher holds prepared."""
    rows = stack.owner_fetch(
        "SELECT run_id, lease_owner FROM {ns}.step"
        " WHERE step_id = $1 AND state = 'prepared' AND lease_owner IS NOT NULL",
        CALL_STEP,
    )
    return {str(row["run_id"]): str(row["lease_owner"]) for row in rows}


def _fenced(log: str) -> set[str]:
    """The runs whose late outcome a dispatcher's log says the fence refused."""
    return {match[2] for match in FENCED.finditer(log) if match[1] == CALL_STEP}


@pytest.mark.timeout(300)
def test_a_cut_off_dispatcher_writes_nothing_on_its_stale_leases_when_it_returns(
    cluster: HaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with spread_stack(cluster, database_on(cluster)) as spread:
        monkeypatch.setenv(TRUST_ENV, str(spread.trust_file))
        stack = spread.stack
        one, two = dispatcher_host(cluster, 1), dispatcher_host(cluster, 2)
        for component in ("auditd", "recovery", "admission", "gateway"):
            stack.start_component(component, prefix=spread.core.command())
        first = stack.start_component("dispatcher", prefix=one.command(), wait_ready=True)
        driver = LoadDriver(stack, label="hacut")
        with driver:
            wait_flowing(stack, driver, FLOW_RUNS, "runs flowing through disp1")
            hold_calls(stack, IN_FLIGHT, "disp1's cut")
            before = driver.figures()
            one.cut()
            cut_at = time.monotonic()
            leased = _leased(stack)
            answered = {run for run in leased if stack.processed(run) == 1}
            assert len(answered) >= IN_FLIGHT, (leased, answered)
            assert len(set(leased.values())) == 1, leased  # disp1's, the only dispatcher

            second = stack.start_component("dispatcher", prefix=two.command())
            # The holder's leases are still good: disp2 leaves the steps alone.
            barrier = stack.finish_barrier_run()
            now = _leased(stack)
            assert {run: now.get(run) for run in leased} == leased
            stack.advance(LEASE_SECONDS + 1)
            for run in leased:
                held = stack.wait_state(run, ("held", "succeeded", "failed"), "the take-over")
                assert held["state"] == "held", held
            taken_over = time.monotonic() - cut_at
            rows = {run: stack.step_row(run) for run in leased}
            for row in rows.values():
                assert row is not None
                assert (row["state"], row["effect"], row["lease_owner"]) == (
                    "uncertain",
                    "unknown",
                    None,
                ), row

            # The link returns, and with it the answers the stand-in held.
            one.mend()
            mended_at = time.monotonic()
            release_held(stack, IN_FLIGHT)
            wait_until(
                lambda: answered <= _fenced(stack.log_of(first)),
                "disp1's late answers refused by the lease check",
                timeout=WAIT_SECONDS * 2,
            )
            fenced_after = time.monotonic() - mended_at
            wait_flowing(stack, driver, FLOW_RUNS, "runs flowing with both dispatchers")
            during = driver.figures().since(before)
            settle(stack, driver)

        # The fence held: nothing the late answers said was written, nothing sent again.
        for run, row in rows.items():
            assert stack.step_row(run) == row
            assert stack.status(run)["state"] == "held"
            # A command disp1 had prepared but not yet sent may still arrive once the link is
            # back (its bytes were on their way): once, never twice.
            sent = (stack.processed(run), stack.received(run))
            assert sent == (1, 1) if run in answered else sent in ((0, 0), (1, 1)), (run, sent)
        assert stack.processed(barrier) == 1
        seen = observe(stack, driver.admitted_ids())
        verdict = check_invariants(seen)
        load = driver.figures()
        log = stack.log_of(first)
        figures: dict[str, Any] = {
            "leasesHeldWhenCutOff": len(leased),
            "callsAnsweredWhileCutOff": len(answered),
            "takenOverAfterSeconds": round(taken_over, 1),
            "lateAnswersRefusedAfterMendSeconds": round(fenced_after, 1),
            "lateAnswersRefused": len(_fenced(log) & set(leased)),
            "startsAttempted": load.attempted,
            "startAnswers": {str(k): v for k, v in sorted(load.statuses.items())},
            "startsRefused503DuringTheCut": during.statuses.get(503, 0),
            "disp1StoreUnavailableLines": log.count("store-unavailable"),
            **verdict.figures,
        }
        write_figures("ha-dispatcher-host-cut", figures)
        verdict.assert_holds()
        # Both dispatchers live on, the cut-off one included: it was cut off, not killed.
        assert first.poll() is None and second.poll() is None
        assert set(load.statuses) == {201}, load.statuses
        assert_no_traceback(stack)
