"""GrpcBackend against in-process gRPC servicers on Unix sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.actions import members_of
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc import transport
from core.rpc.transport import Endpoints, server, unix_endpoints
from core.runs import VERDICT_WAIT_SECONDS
from gateway import backend as gateway_backend
from gateway.backend import AuditRecord, BackendCaller, GrpcBackend, ListQuery
from gateway.policies import RunOwner
from tests.helpers.gateway_kit import (
    ISSUER,
    RUN_A,
    RUN_B,
    WORKFLOW,
    FakeAdmission,
    FakeAudit,
    FakeRecovery,
)

CALLER = BackendCaller(ISSUER, "alice", "intake-portal", False)


@dataclass
class Stack:
    endpoints: Endpoints
    admission: FakeAdmission
    recovery: FakeRecovery
    audit: FakeAudit


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    # Socket paths must stay short: a short folder under /tmp, not pytest's tmp_path.
    folder = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    endpoints = unix_endpoints(folder)
    admission, recovery, audit = FakeAdmission(), FakeRecovery(), FakeAudit()
    servers = [server(endpoints, name) for name in ("admission", "recovery", "auditd")]
    pb_grpc.add_AdmissionServicer_to_server(admission, servers[0])
    pb_grpc.add_RecoveryServicer_to_server(recovery, servers[1])
    pb_grpc.add_AuditServicer_to_server(audit, servers[2])
    for srv in servers:
        await srv.start()
    try:
        yield Stack(endpoints, admission, recovery, audit)
    finally:
        for srv in servers:
            await srv.stop(None)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def backend(stack: Stack) -> AsyncIterator[GrpcBackend]:
    grpc_backend = GrpcBackend(stack.endpoints, timeout=5.0)
    try:
        yield grpc_backend
    finally:
        await grpc_backend.close()


async def test_start_relays_the_status_document(backend: GrpcBackend, stack: Stack) -> None:
    result = await backend.start(CALLER, WORKFLOW, "key-1", '{"a":1}')
    assert result.created and result.run_id == RUN_A
    assert result.status["runId"] == RUN_A
    sent = stack.admission.requests[0]
    assert (sent.caller.iss, sent.caller.sub, sent.caller.client_id) == (
        ISSUER,
        "alice",
        "intake-portal",
    )
    assert (sent.workflow_id, sent.idempotency_key, sent.input_json) == (
        WORKFLOW,
        "key-1",
        '{"a":1}',
    )


async def test_refusals_keep_their_code(backend: GrpcBackend) -> None:
    with pytest.raises(CoordinatorError) as refused:
        await backend.start(CALLER, "missing", "key-1", "{}")
    assert refused.value.code == "workflow.not-found"
    with pytest.raises(CoordinatorError) as missing:
        await backend.status(RUN_B)
    assert missing.value.code == "run.not-found"


async def test_run_owner(backend: GrpcBackend) -> None:
    assert await backend.run_owner(RUN_A) == RunOwner(WORKFLOW, ISSUER, "alice")
    assert await backend.run_owner(RUN_B) is None


async def test_list_request_carries_the_scope(backend: GrpcBackend, stack: Stack) -> None:
    document = await backend.list(
        ListQuery(
            (WORKFLOW,),
            (ISSUER, "alice"),
            True,
            "held",
            5,
            "c1",
            order="oldest",
            step="send",
            cause="status-5xx",
            updated_before="2026-12-04T09:30:00Z",
        )
    )
    assert document == {"runs": [], "nextCursor": None, "total": 0, "totalIsEstimate": False}
    sent = stack.recovery.requests[0]
    assert list(sent.workflows) == [WORKFLOW]
    assert sent.only_principal and (sent.principal_iss, sent.principal_sub) == (ISSUER, "alice")
    assert (sent.attention, sent.state, sent.limit, sent.cursor) == ("true", "held", 5, "c1")
    assert (sent.order, sent.step, sent.cause, sent.updated_before) == (
        "oldest",
        "send",
        "status-5xx",
        "2026-12-04T09:30:00Z",
    )
    await backend.list(ListQuery((WORKFLOW,), None, None, None, 20, None))
    operator = stack.recovery.requests[1]
    assert not operator.only_principal and operator.attention == ""
    assert (operator.order, operator.step, operator.cause) == ("newest", "", "")


async def test_operator_action_sends_the_typed_body(backend: GrpcBackend, stack: Stack) -> None:
    body = {"before": "2027-01-01T00:00:00Z", "limit": 3}
    assert await backend.operator_action(CALLER, "retain", body) == {"erased": 0, "runIds": []}
    sent = stack.recovery.requests[0]
    assert sent.action == "retain" and sent.WhichOneof("body") == "retain"
    assert members_of("retain", sent) == body


async def test_run_action_refusal(backend: GrpcBackend, stack: Stack) -> None:
    with pytest.raises(CoordinatorError) as refused:
        await backend.run_action(CALLER, RUN_A, "reconcile", "INC-1")
    assert refused.value.code == "reconcile.unsupported"
    assert stack.recovery.requests[0].reason == "INC-1"


async def test_run_action_deadline_allows_the_verdict_wait(
    backend: GrpcBackend, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # retry-same may wait its whole verdict wait after acting: the call's deadline must
    # allow that on top of the ordinary one, or a `pending` answer arrives as a 503.
    deadlines: list[float] = []
    real_call = transport.call

    async def recording(component: str, method: Any, request: Any, *, timeout: float) -> Any:
        deadlines.append(timeout)
        return await real_call(component, method, request, timeout=timeout)

    monkeypatch.setattr(gateway_backend, "call", recording)
    for wait in (None, 2.5, 0.0, 99.0):
        with pytest.raises(CoordinatorError):
            await backend.run_action(CALLER, RUN_A, "retry-same", "INC-1", wait)
    assert deadlines == [5.0 + VERDICT_WAIT_SECONDS, 7.5, 5.0, 5.0 + VERDICT_WAIT_SECONDS]
    sent = stack.recovery.requests
    assert [r.HasField("verdict_wait_ms") for r in sent] == [False, True, True, True]
    assert [r.verdict_wait_ms for r in sent[1:]] == [2500, 0, 10000]


async def test_an_answer_without_its_run_is_an_internal_failure(backend: GrpcBackend) -> None:
    with pytest.raises(CoordinatorError) as broken:
        await backend.inspect(RUN_A)
    assert broken.value.code == "internal"
    assert (await backend.doctor())["schemaVersion"] == 4


async def test_audit_append_and_its_failure(backend: GrpcBackend, stack: Stack) -> None:
    await backend.append_audit(
        [AuditRecord("cancel", "ok", (ISSUER, "alice"), "intake-portal", RUN_A, "INC-1")]
    )
    record = stack.audit.records[0]
    assert (record.action, record.outcome, record.run_id, record.reason) == (
        "cancel",
        "ok",
        RUN_A,
        "INC-1",
    )
    await backend.append_audit([AuditRecord("hold", "ok", None, None)])
    assert (stack.audit.records[1].principal_iss, stack.audit.records[1].client_id) == ("", "")
    stack.audit.broken = True
    with pytest.raises(CoordinatorError) as refused:
        await backend.append_audit([AuditRecord("status", "ok", None, None)])
    assert refused.value.code == "audit.response-unavailable"


async def test_checks_report_unreachable_components(backend: GrpcBackend) -> None:
    healths = {health.component: health for health in await backend.checks()}
    assert set(healths) == {"admission", "dispatcher", "recovery", "auditd"}
    assert not healths["dispatcher"].reachable  # no dispatcher server in this stack
    assert healths["dispatcher"].reasons == ("dispatcher-unavailable",)
    assert healths["admission"].reasons == ("store-unavailable",)
    assert healths["recovery"].reasons == ("x-y",)  # malformed words are dropped
    assert healths["auditd"].reachable and healths["auditd"].reasons == ()


async def test_metrics_skip_unreachable_components(backend: GrpcBackend) -> None:
    texts = await backend.metrics()
    assert len(texts) == 3
    assert any("coordinator_runs" in text for text in texts)


async def test_recovery_only_admits_nothing_and_asks_fewer_components(stack: Stack) -> None:
    backend = GrpcBackend(stack.endpoints, recovery_only=True)
    try:
        with pytest.raises(CoordinatorError) as refused:
            await backend.start(CALLER, WORKFLOW, "key-1", "{}")
        assert refused.value.code == "admission.recovery-only"
        assert stack.admission.requests == []
        assert [h.component for h in await backend.checks()] == ["recovery", "auditd"]
    finally:
        await backend.close()


async def test_a_stopped_component_is_service_unavailable(stack: Stack) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    backend = GrpcBackend(unix_endpoints(folder), timeout=2.0)
    try:
        with pytest.raises(CoordinatorError) as down:
            await backend.status(RUN_A)
        assert down.value.code == "service.unavailable"
    finally:
        await backend.close()
        shutil.rmtree(folder, ignore_errors=True)
