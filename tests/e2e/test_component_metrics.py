"""Components on their own hosts (the compose shape): mutual TLS between them, each serving
its own /metrics on deployment.internal.metricsPort, and a dispatcher with no internal
address — as each of several replicas has — that serves no gRPC and still dispatches."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core import __version__
from core.config.check import check_runtime_file
from core.deploy import apply
from core.workflow.package import build_package
from devstack.postgres import PostgresCluster
from devstack.stack import LocalStack, free_port, wait_until
from tests.helpers.internal_tls import use_internal_tls

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# Every 127/8 address is this host's loopback: one host per component, as on a network.
HOSTS = {"admission": "127.0.0.2", "recovery": "127.0.0.3", "auditd": "127.0.0.4"}


@dataclass
class Spread:
    stack: LocalStack
    metrics_port: int


@pytest.fixture(scope="module")
def spread(
    postgres_server: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Spread]:
    root = tmp_path_factory.mktemp("spread")
    name = f"coordinator_spread_{os.getpid()}"
    database = postgres_server.create_database(name)
    built = build_package(ROOT / "examples" / "appointment-booking", root / "packages")
    stack = LocalStack.prepare(
        root / "stack", packages=[(built.path, built.digest)], database=database
    )
    metrics_port = free_port()
    # No dispatcher address: it is reached by nobody, like each of several replicas.
    addresses = {c: f"{host}:{free_port()}" for c, host in HOSTS.items()}
    use_internal_tls(stack, addresses, metricsPort=metrics_port)
    try:
        stack.start_products()
        asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
        stack.start_coordinator()
        yield Spread(stack, metrics_port)
    finally:
        stack.stop()
        postgres_server.drop_database(name)


def series(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    answer = httpx.get(url, timeout=5.0)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_a_run_completes_and_every_component_shows_its_own_series(
    spread: Spread, tmp_path: Path
) -> None:
    stack = spread.stack
    token = stack.mint("producer", "alice", tmp_path / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())}
    body = {"input": {"slotRef": "s-1", "subjectRef": "APP-1", "recipientRef": "p-1"}}
    answer = httpx.post(
        f"{stack.url}/v1/workflows/appointment-booking/runs", json=body, headers=headers
    )
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["runId"]

    def ended() -> bool:
        state = httpx.get(f"{stack.url}/v1/runs/{run_id}", headers=headers).json()["state"]
        return bool(state == "succeeded")

    wait_until(ended, "the run", timeout=30.0)

    port = spread.metrics_port
    dispatcher = series(f"http://127.0.0.1:{port}/metrics")
    accepted = dispatcher["coordinator_calls_total"]
    assert sum(v for labels, v in accepted.items() if ("result", "accepted") in labels) >= 1
    recovery = series(f"http://{HOSTS['recovery']}:{port}/metrics")
    assert recovery["coordinator_runs"][(("state", "succeeded"),)] == 1
    auditd = series(f"http://{HOSTS['auditd']}:{port}/metrics")
    assert auditd["coordinator_audit_ready"][()] == 1
    admission = series(f"http://{HOSTS['admission']}:{port}/metrics")
    # Admission keeps no series of its own but its process's, named by component.
    assert {dict(labels)["component"] for labels in admission["process_start_time_seconds"]} == {
        "admission"
    }
    assert not any(name.startswith("coordinator_runs") for name in admission)
    # Each process says which build it runs.
    for own in (dispatcher, recovery, auditd, admission):
        [labels] = own["coordinator_build_info"]
        assert dict(labels)["version"] == __version__

    # The gateway's merged view has every component it can reach, and no dispatcher; the
    # process series of each of those, and of the gateway, side by side.
    merged = series(f"{stack.metrics_url}/metrics")
    assert merged["coordinator_runs"][(("state", "succeeded"),)] == 1
    assert "coordinator_calls_total" not in merged
    components = {dict(labels)["component"] for labels in merged["coordinator_component_up"]}
    assert components == {"admission", "recovery", "auditd"}
    processes = {dict(labels)["component"] for labels in merged["process_start_time_seconds"]}
    assert processes == {"gateway", "admission", "recovery", "auditd"}
    assert len(merged["coordinator_build_info"]) == 1

    log = stack.log_text("coordinator")
    assert f"dispatcher serving on http://127.0.0.1:{port}/metrics" in log
    assert "dispatcher serving on /" not in log  # no gRPC socket, no address
