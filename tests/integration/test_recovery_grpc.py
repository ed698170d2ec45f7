"""The Recovery servicer over a real gRPC Unix socket, started by ``serve(runtime)``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from admission.events import EventCaller
from admission.start import Admitter
from core import derive
from core.callers import EVENT_ISSUER
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
INTAKE_SOURCE = "https://intake.example.org/applications"


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


async def test_a_run_is_found_by_the_start_that_made_it(env: Served) -> None:
    store = env.store("admission")
    _, by_key = await admit(store, env.runtime, ALICE, WORKFLOW, "order-77", {"subjectRef": "S"})
    await admit(store, env.runtime, ALICE, WORKFLOW, "order-78", {"subjectRef": "S"})
    # A signed event's start, as EventAdmitter.start admits it once the source is verified
    # (this deployment configures no event source for it to look up).
    key = env.runtime.resolver.read_key(env.runtime.config.deployment.admission_key_ref)
    by_event = (
        await Admitter.from_runtime(env.runtime, store).start_identified(
            EventCaller(iss=EVENT_ISSUER, sub=INTAKE_SOURCE),
            WORKFLOW,
            derive.event_start_identity(key, INTAKE_SOURCE, "evt-9"),
            {"subjectRef": "S"},
        )
    ).run_id

    async def search(**fields: Any) -> list[str]:
        request = pb.ListRequest(workflows=[WORKFLOW], **fields)
        found = list_document(await call("recovery", stub.List, request))
        return [run["runId"] for run in found["runs"]]

    start = {"start_iss": ALICE.iss, "start_sub": ALICE.sub, "workflow_id": WORKFLOW}
    async with running(env, None) as stub:
        assert await search(start_key="order-77", **start) == [by_key]
        # Another client's key, another workflow's or an unknown key name no run.
        assert await search(start_key="order-77", **{**start, "start_sub": "bob"}) == []
        assert await search(start_key="order-79", **start) == []
        assert await search(event_source=INTAKE_SOURCE, event_id="evt-9") == [by_event]
        assert await search(event_source=INTAKE_SOURCE, event_id="evt-10") == []
        # A non-operator's scope still holds: the event's run is not Alice's.
        mine = {"only_principal": True, "principal_iss": ALICE.iss, "principal_sub": ALICE.sub}
        assert await search(event_source=INTAKE_SOURCE, event_id="evt-9", **mine) == []
        assert await search(start_key="order-77", **start, **mine) == [by_key]
        incomplete = []
        for fields in (
            {"start_key": "order-77", "start_iss": ALICE.iss, "start_sub": ALICE.sub},
            {"event_source": INTAKE_SOURCE},
            {"event_id": "evt-9"},
        ):
            with pytest.raises(CoordinatorError) as caught:
                await search(**fields)
            incomplete.append(caught.value.code)
    assert incomplete == ["request.invalid"] * 3
