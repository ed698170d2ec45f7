"""The Recovery servicer over a real gRPC Unix socket, started by ``serve(runtime)``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.documents import (
    doctor_document,
    inspection_document,
    list_document,
    operator_answer_document,
    status_document,
)
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import call, channel
from devstack.postgres import DatabaseHandle
from recovery.service import AuditProbe, serve
from tests.helpers.admitting import admit
from tests.helpers.serving import Caller, Served, served, serving

pytestmark = pytest.mark.postgres

ALICE = Caller()
WORKFLOW = "approval-notice"


@contextlib.asynccontextmanager
async def running(
    env: Served, audit_ready: AuditProbe | None
) -> AsyncIterator[pb_grpc.RecoveryStub]:
    async with (
        serving(recovery=lambda started: serve(env.runtime, started, audit_ready)),
        channel(env.runtime.endpoints, "recovery") as ch,
    ):
        yield pb_grpc.RecoveryStub(ch)


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Served]:
    async with served(tmp_path, database, components=("admission",)) as made:
        yield made


async def test_reads_over_grpc(env: Served) -> None:
    created, run_id = await admit(
        env.store("admission"), env.runtime, ALICE, WORKFLOW, "k-1", {"subjectRef": "S"}
    )
    assert created

    async def audit_ready() -> bool:
        return True

    async with running(env, audit_ready) as stub:
        owner = await call("recovery", stub.GetRunOwner, pb.RunRef(run_id=run_id))
        missing = await call("recovery", stub.GetRunOwner, pb.RunRef(run_id="nope"))
        status = status_document(await call("recovery", stub.Status, pb.RunRef(run_id=run_id)))
        inspection = inspection_document(
            await call("recovery", stub.Inspect, pb.RunRef(run_id=run_id))
        )
        listed = list_document(
            await call(
                "recovery",
                stub.List,
                pb.ListRequest(
                    workflows=[WORKFLOW],
                    only_principal=True,
                    principal_iss=ALICE.iss,
                    principal_sub=ALICE.sub,
                ),
            )
        )
        doctor = doctor_document(await call("recovery", stub.Doctor, pb.Empty()))
        with pytest.raises(CoordinatorError) as not_found:
            await call("recovery", stub.Status, pb.RunRef(run_id="nope"))
        with pytest.raises(CoordinatorError) as bad_limit:
            await call("recovery", stub.List, pb.ListRequest(workflows=[WORKFLOW], limit=500))

    assert (owner.found, owner.workflow_id, owner.iss, owner.sub) == (
        True,
        WORKFLOW,
        ALICE.iss,
        ALICE.sub,
    )
    assert missing.found is False
    assert status["runId"] == run_id and status["state"] == "running"
    assert [step["step"] for step in inspection["steps"]] == ["call-notices"]
    assert listed == {"runs": [status], "nextCursor": None, "total": 1, "totalIsEstimate": False}
    assert doctor["state"]["auditReady"] is True and doctor["mode"] == "ordinary"
    assert not_found.value.code == "run.not-found"
    assert bad_limit.value.code == "request.invalid"


async def test_actions_cross_the_wire_with_answers_and_refusals(env: Served) -> None:
    async with running(env, None) as stub:
        with pytest.raises(CoordinatorError) as run_action:
            await call(
                "recovery",
                stub.RunAction,
                pb.RunActionRequest(run_id="x", action="cancel", reason="INC-1"),
            )
        with pytest.raises(CoordinatorError) as operator_action:
            await call(
                "recovery", stub.OperatorAction, pb.OperatorActionRequest(action="restore-hold")
            )
        held = await call(
            "recovery",
            stub.OperatorAction,
            pb.OperatorActionRequest(action="restore-hold", reason=pb.ReasonBody(reason="INC-1")),
        )
        # No auditd is listening here: the default probe reports the journal not ready.
        doctor = doctor_document(await call("recovery", stub.Doctor, pb.Empty()))
        health = await call("recovery", stub.Check, pb.Empty())
        metrics = await call("recovery", stub.Metrics, pb.Empty())

    # The action runs over the wire and finds no such run.
    assert run_action.value.code == "run.not-found"
    # An empty body is refused as malformed before anything is done.
    assert operator_action.value.code == "request.invalid"
    # A valid one answers its document, and the doctor sees the holds it set.
    assert operator_answer_document(held)["holds"] == {"execution": True, "admission": True}
    assert doctor["holds"] == {"execution": True, "admission": True}
    assert doctor["state"]["auditReady"] is False
    assert (health.store_ready, health.activation_ready, list(health.reasons)) == (True, True, [])
    assert "coordinator_store_available 1.0" in metrics.text.splitlines()
