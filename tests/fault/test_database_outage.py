"""PostgreSQL goes away under a running coordinator and comes back (CONTRACT §2.1).

The test runs its own server, since it stops it: ``halt`` is ``pg_ctl stop -m fast``, and
``start_again`` starts the same cluster on the same port.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from devstack.postgres import PostgresServer
from devstack.stack import wait_until
from tests.helpers.faults import WAIT_SECONDS, component_pid, fault_stack

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NOTICE = re.compile(r"^store-unavailable: (\w+): ", re.MULTILINE)
NOTICE_INTERVAL_SECONDS = 10.0
# Failing calls made during the outage: each reaches a component's store, so without the
# rate limit each would print its own line.
ATTEMPTS = 12


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


def _code_of_503(answer: httpx.Response) -> str:
    """The problem code of an answer that must be a 503 problem document."""
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    return str(answer.json()["code"])


def test_outage_is_reported_survived_and_recovered(own_server: PostgresServer) -> None:
    with fault_stack(own_server.default, test_clock=False) as stack:
        launcher = stack.start()
        children = {
            name: component_pid(launcher, name)
            for name in ("gateway", "admission", "dispatcher", "recovery", "auditd")
        }
        before = stack.start_run("person-before")
        assert stack.wait_state(before, ("succeeded",), "the run before the outage")

        logged_before = len(stack.log_of(launcher))
        own_server.halt()
        outage_began = time.monotonic()

        def not_ready() -> bool:
            answer = stack.get("/ready")
            return answer.status_code == 503 and "store-unavailable" in answer.json()["reasons"]

        wait_until(not_ready, "/ready answering 503 store-unavailable", timeout=WAIT_SECONDS)

        codes: list[str] = []
        for _attempt in range(ATTEMPTS):
            codes.append(_code_of_503(stack.get(f"/v1/runs/{before}", operator=False)))
            codes.append(_code_of_503(stack.post_start("person-during")))
            codes.append(_code_of_503(stack.get("/v1/runs")))
        assert set(codes) == {"service.unavailable"}

        # Every component that keeps a store has said so, and the dispatcher (which looks
        # for work every second meanwhile) as well.
        def reported() -> bool:
            found = set(NOTICE.findall(stack.log_of(launcher)))
            return {"admission", "recovery", "dispatcher"} <= found

        wait_until(reported, "store-unavailable on standard error", timeout=WAIT_SECONDS)
        outage = time.monotonic() - outage_began
        allowed = 1 + int(outage // NOTICE_INTERVAL_SECONDS)
        during = stack.log_of(launcher)[logged_before:]
        counts = Counter(NOTICE.findall(during))
        assert max(counts.values()) <= allowed, (counts, f"{outage:.1f} s")
        # Nothing else repeats per attempt either (a traceback per reconnect, say).
        assert "Traceback" not in during, during
        lines = Counter(line for line in during.splitlines() if line.strip())
        assert max(lines.values()) <= allowed, (lines, f"{outage:.1f} s")

        # Nobody gave up: the launcher and each of its components still run.
        assert launcher.poll() is None
        assert {name: component_pid(launcher, name) for name in children} == children

        own_server.start_again()
        wait_until(stack.ready, "/ready after the database returned", timeout=WAIT_SECONDS)
        after = stack.start_run("person-after")
        status = stack.wait_state(after, ("succeeded", "failed", "held"), "the run after")
        assert status["state"] == "succeeded", status
        assert stack.processed(after) == 1
        assert stack.processed(before) == 1
        assert set(stack.run_ids()) == {before, after}
        assert launcher.poll() is None
