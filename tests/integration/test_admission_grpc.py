"""The Admission servicer over a real gRPC Unix socket, started by ``serve(runtime)``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from admission.service import serve
from core.documents import status_document
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import call, channel
from devstack.postgres import DatabaseHandle
from tests.helpers.serving import Served, served, serving

pytestmark = pytest.mark.postgres

CALLER = pb.Caller(iss="https://issuer.example.org", sub="alice", client_id="intake-portal")


@contextlib.asynccontextmanager
async def running(env: Served) -> AsyncIterator[pb_grpc.AdmissionStub]:
    async with (
        serving(admission=lambda started: serve(env.runtime, started)),
        channel(env.runtime.endpoints, "admission") as ch,
    ):
        yield pb_grpc.AdmissionStub(ch)


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Served]:
    async with served(tmp_path, database, components=()) as made:
        yield made


def start_request(key: str, input_json: str) -> pb.StartRequest:
    return pb.StartRequest(
        caller=CALLER, workflow_id="approval-notice", idempotency_key=key, input_json=input_json
    )


async def test_start_over_grpc_answers_created_then_the_same_run(env: Served) -> None:
    async with running(env) as stub:
        first = await call("admission", stub.Start, start_request("k-1", '{"subjectRef":"S-1"}'))
        again = await call("admission", stub.Start, start_request("k-1", '{"subjectRef": "S-1"}'))

    assert first.created is True and again.created is False
    assert first.run_id == again.run_id
    status = status_document(first.status)
    assert status["runId"] == first.run_id and status["state"] == "running"
    assert status_document(again.status) == status


async def test_refusals_cross_the_wire_with_code_and_pointers(env: Served) -> None:
    async with running(env) as stub:
        with pytest.raises(CoordinatorError) as invalid:
            await call("admission", stub.Start, start_request("k-1", '{"subjectRef": 7}'))
        with pytest.raises(CoordinatorError) as malformed:
            await call("admission", stub.Start, start_request("k-1", "{not json"))
        with pytest.raises(CoordinatorError) as events:
            await call("admission", stub.StartFromEvent, pb.EventRequest(source_key="x"))

    assert invalid.value.code == "input.invalid"
    assert invalid.value.extra == {
        "errors": [{"pointer": "/subjectRef", "reason": invalid.value.extra["errors"][0]["reason"]}]
    }
    assert malformed.value.code == "request.invalid"
    # An event source this runtime file does not configure starts nothing.
    assert events.value.code == "authentication.refused"


async def test_check_reports_store_and_activation(env: Served) -> None:
    async with running(env) as stub:
        healthy = await call("admission", stub.Check, pb.Empty())
        await env.owner_execute(
            "UPDATE {ns}.deployment SET activation_serial = activation_serial + 1"
        )
        changed = await call("admission", stub.Check, pb.Empty())

    assert (healthy.store_ready, healthy.activation_ready, list(healthy.reasons)) == (
        True,
        True,
        [],
    )
    assert (changed.store_ready, changed.activation_ready) == (True, False)
    assert list(changed.reasons) == ["activation-changed"]
