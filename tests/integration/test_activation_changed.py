"""After an apply changes the activation, every API call answers 409
``deployment.activation-changed`` until the service restarts (CONTRACT §6.4): the reads and
operator actions recovery serves, and the starts and wake-ups admission serves. Readiness
(``Check``) keeps answering, with the reason, so ``/ready`` can say why."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from admission.service import serve as serve_admission
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import call, channel
from devstack.postgres import DatabaseHandle
from recovery.service import serve as serve_recovery
from tests.helpers.serving import Served, served, serving

pytestmark = pytest.mark.postgres

CALLER = pb.Caller(
    iss="https://issuer.example.org", sub="ops", client_id="case-operators", operator=True
)


async def _ready() -> bool:
    return True


@contextlib.asynccontextmanager
async def both(env: Served) -> AsyncIterator[tuple[pb_grpc.RecoveryStub, pb_grpc.AdmissionStub]]:
    async with (
        serving(
            recovery=lambda started: serve_recovery(env.runtime, started, _ready),
            admission=lambda started: serve_admission(env.runtime, started),
        ),
        channel(env.runtime.endpoints, "recovery") as rch,
        channel(env.runtime.endpoints, "admission") as ach,
    ):
        yield pb_grpc.RecoveryStub(rch), pb_grpc.AdmissionStub(ach)


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Served]:
    async with served(tmp_path, database, components=()) as made:
        yield made


def _calls(
    recovery: pb_grpc.RecoveryStub, admission: pb_grpc.AdmissionStub
) -> dict[str, Callable[[], Awaitable[Any]]]:
    run = pb.RunRef(run_id="r-unknown")
    return {
        "owner": lambda: call("recovery", recovery.GetRunOwner, run),
        "status": lambda: call("recovery", recovery.Status, run),
        "inspect": lambda: call("recovery", recovery.Inspect, run),
        "list": lambda: call(
            "recovery", recovery.List, pb.ListRequest(workflows=["approval-notice"], limit=20)
        ),
        "doctor": lambda: call("recovery", recovery.Doctor, pb.Empty()),
        "run-action": lambda: call(
            "recovery",
            recovery.RunAction,
            pb.RunActionRequest(caller=CALLER, run_id="r-unknown", action="cancel", reason="x"),
        ),
        "operator-action": lambda: call(
            "recovery",
            recovery.OperatorAction,
            pb.OperatorActionRequest(
                caller=CALLER, action="restore-hold", reason=pb.ReasonBody(reason="inc-1")
            ),
        ),
        "start": lambda: call(
            "admission",
            admission.Start,
            pb.StartRequest(
                caller=CALLER,
                workflow_id="approval-notice",
                idempotency_key="k-1",
                input_json='{"subjectRef":"S-1"}',
            ),
        ),
        "review-completion": lambda: call(
            "admission",
            admission.ReviewCompletion,
            pb.CompletionRequest(connection="review", review_id="rv-1"),
        ),
    }


async def test_every_api_call_refuses_after_the_activation_changed(env: Served) -> None:
    async with both(env) as (recovery, admission):
        calls = _calls(recovery, admission)
        # Before: the reads answer (or refuse for their own reasons, never this one).
        before: dict[str, str | None] = {}
        for name, make in calls.items():
            if name in {"run-action", "operator-action", "start"}:
                continue  # these change state; only their refusal afterwards matters
            try:
                await make()
                before[name] = None
            except CoordinatorError as exc:
                before[name] = exc.code
        assert "deployment.activation-changed" not in before.values()

        await env.owner_execute(
            "UPDATE {ns}.deployment SET activation_serial = activation_serial + 1"
        )
        after: dict[str, str] = {}
        for name, make in calls.items():
            with pytest.raises(CoordinatorError) as refused:
                await make()
            after[name] = refused.value.code
        health = await call("recovery", recovery.Check, pb.Empty())

    assert after == dict.fromkeys(calls, "deployment.activation-changed")
    # Readiness still answers, and says why it is not ready.
    assert "activation-changed" in health.reasons
