"""The internal channel over TCP: mutual TLS between components, nothing without it."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from core.config.check import check_runtime_file
from core.deploy import apply
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.workflow.package import build_package
from devstack.postgres import PostgresCluster
from devstack.postgres_tls import CertificateAuthority
from devstack.stack import LocalStack, free_port, wait_until
from tests.helpers.internal_tls import use_internal_tls

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mtls_stack(
    postgres_server: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalStack, dict[str, int], CertificateAuthority]]:
    root = tmp_path_factory.mktemp("mtls")
    name = f"coordinator_mtls_{os.getpid()}"
    database = postgres_server.create_database(name)
    built = build_package(ROOT / "examples" / "appointment-booking", root / "packages")
    stack = LocalStack.prepare(
        root / "stack", packages=[(built.path, built.digest)], database=database
    )
    ports = {c: free_port() for c in ("admission", "dispatcher", "recovery", "auditd")}
    authority = use_internal_tls(stack, {c: f"127.0.0.1:{p}" for c, p in ports.items()})
    try:
        stack.start_products()
        asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
        stack.start_coordinator()
        yield stack, ports, authority
    finally:
        stack.stop()
        postgres_server.drop_database(name)


def test_a_run_completes_with_components_on_mutual_tls(
    mtls_stack: tuple[LocalStack, dict[str, int], CertificateAuthority], tmp_path: Path
) -> None:
    stack, _, _ = mtls_stack
    token = stack.mint("producer", "alice", tmp_path / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())}
    body = {"input": {"slotRef": "s-1", "subjectRef": "APP-1", "recipientRef": "p-1"}}
    answer = httpx.post(
        f"{stack.url}/v1/workflows/appointment-booking/runs",
        json=body,
        headers=headers,
        timeout=10.0,
    )
    assert answer.status_code == 201
    run_id = answer.json()["runId"]
    state: dict[str, Any] = {}

    def ended() -> bool:
        nonlocal state
        state = httpx.get(f"{stack.url}/v1/runs/{run_id}", headers=headers, timeout=5.0).json()
        return state["state"] not in ("running", "waiting")

    wait_until(ended, "the run", timeout=30.0)
    assert state["state"] == "succeeded"


async def _check(address: str, credentials: grpc.ChannelCredentials | None) -> pb.Health:
    # Channels belong to the running event loop, so they are made here.
    channel = (
        grpc.aio.insecure_channel(address)
        if credentials is None
        else grpc.aio.secure_channel(address, credentials)
    )
    async with channel:
        stub = pb_grpc.RecoveryStub(channel)
        health: pb.Health = await stub.Check(pb.Empty(), timeout=3.0)
        return health


def test_plaintext_and_foreign_clients_are_refused(
    mtls_stack: tuple[LocalStack, dict[str, int], CertificateAuthority],
) -> None:
    _, ports, authority = mtls_stack
    address = f"127.0.0.1:{ports['recovery']}"
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(_check(address, None))
    stranger = CertificateAuthority.create("someone else")
    certificate, key = stranger.issue_server(("127.0.0.1",), client_auth=True)
    foreign = grpc.ssl_channel_credentials(
        root_certificates=authority.pem, private_key=key, certificate_chain=certificate
    )
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(_check(address, foreign))
    # the same call with the deployment's own certificate is answered
    own_cert, own_key = authority.issue_server(("127.0.0.1",), client_auth=True)
    own = grpc.ssl_channel_credentials(
        root_certificates=authority.pem, private_key=own_key, certificate_chain=own_cert
    )
    assert asyncio.run(_check(address, own)).store_ready
