"""The gateway's HTTP surface (CONTRACT §8, §12) with a fake backend and real tokens."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from core.codes import Code
from core.errors import CoordinatorError
from gateway.auth import JwksUnavailable
from gateway.backend import AuditRecord, BackendCaller, ListQuery
from gateway.bodies import MAX_BODY_BYTES
from gateway.routes import GatewayContext
from tests.helpers.gateway_kit import (
    ISSUER,
    OTHER_KEY,
    RUN_A,
    RUN_B,
    RUN_MISSING,
    WORKFLOW,
    FakeBackend,
    bearer,
    context,
    main_client,
    mint,
    primed,
    verifier,
)

PROBLEM = "application/problem+json"
START_PATH = f"/v1/workflows/{WORKFLOW}/runs"
ALICE = bearer(mint("alice", "intake-portal"))
BOB = bearer(mint("bob", "intake-portal"))
READER = bearer(mint("carol", "reader"))
CASE_OPERATOR = bearer(mint("olga", "case-operators"))
PLATFORM = bearer(mint("pat", "platform-operators"))


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def client(backend: FakeBackend) -> AsyncIterator[httpx.AsyncClient]:
    async with main_client(await primed(context(backend))) as http:
        yield http


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    document = response.json()
    assert document["code"] == code
    assert document["status"] == status
    assert document["type"] == f"https://registry-coordinator.dev/problems/{code}"
    assert document["title"]
    assert isinstance(document["detail"], str)
    return dict(document)


def start_headers(key: str = "order-17", token: dict[str, str] = ALICE) -> dict[str, str]:
    return {**token, "Idempotency-Key": key}


# ----------------------------------------------------------------------------- /ready


async def test_ready_needs_no_token(client: httpx.AsyncClient) -> None:
    response = await client.get("/ready")
    assert response.status_code == 200
    assert response.json() == {"ready": True}


async def test_ready_lists_reasons_when_a_dependency_is_down(backend: FakeBackend) -> None:
    from gateway.backend import ComponentHealth

    backend.health = (
        ComponentHealth("admission", True, False, True, ()),
        ComponentHealth("recovery", True, True, False, ()),
        ComponentHealth("auditd", False, False, False, ("auditd-unavailable",)),
    )

    class Down:
        async def fetch(self) -> Any:
            raise JwksUnavailable("down")

    ctx = context(backend, token_verifier=verifier(Down()))
    async with main_client(ctx) as client:
        response = await client.get("/ready")
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "reasons": [
            "activation-not-ready",
            "audit-unavailable",
            "auditd-unavailable",
            "store-unavailable",
            "token-verifier-unavailable",
        ],
    }


# ----------------------------------------------------------------------------- start


async def test_start_creates_then_returns_the_same_run(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    body = {"input": {"applicant": {"name": "x"}, "count": 2}}
    first = await client.post(START_PATH, json=body, headers=start_headers())
    assert first.status_code == 201
    assert first.headers["location"] == f"/v1/runs/{RUN_A}"
    assert first.json()["runId"] == RUN_A
    again = await client.post(START_PATH, json=body, headers=start_headers())
    assert again.status_code == 200
    assert again.json() == first.json()

    caller, workflow, key, input_json = backend.log[0][1]
    assert caller == BackendCaller(ISSUER, "alice", "intake-portal", False)
    assert (workflow, key) == (WORKFLOW, "order-17")
    assert json.loads(input_json) == body["input"]
    assert backend.audits == [
        AuditRecord("start", "ok", (ISSUER, "alice"), "intake-portal", RUN_A, None),
        AuditRecord("start", "ok", (ISSUER, "alice"), "intake-portal", RUN_A, None),
    ]


async def test_start_conflict_is_a_problem_and_audited(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    await client.post(START_PATH, json={"input": {"a": 1}}, headers=start_headers())
    response = await client.post(START_PATH, json={"input": {"a": 2}}, headers=start_headers())
    problem(response, 409, "start.conflict")
    assert backend.audits[-1].outcome == "conflict"


@pytest.mark.parametrize(
    "key",
    [None, "", "x" * 256, "has space", "tab\there", "caf\u00e9"],
    ids=["missing", "empty", "too-long", "space", "tab", "non-ascii"],
)
async def test_start_refuses_a_bad_idempotency_key(
    client: httpx.AsyncClient, backend: FakeBackend, key: str | None
) -> None:
    headers = [(name.encode(), value.encode()) for name, value in ALICE.items()]
    if key is not None:
        # Header values travel as bytes; a proxy may pass on UTF-8 the client sent.
        headers.append((b"Idempotency-Key", key.encode()))
    response = await client.post(START_PATH, json={"input": {}}, headers=headers)
    problem(response, 400, "request.invalid")
    assert "start" not in backend.names()
    assert backend.audits[-1].outcome == "invalid"


async def test_start_accepts_a_255_character_key(client: httpx.AsyncClient) -> None:
    response = await client.post(START_PATH, json={"input": {}}, headers=start_headers("~" * 255))
    assert response.status_code == 201


@pytest.mark.parametrize(
    "raw",
    [
        b"{",
        b'{"input": {}, "extra": 1}',
        b'{"input": []}',
        b'{"input": "text"}',
        b"[]",
        b"{}",
        b'{"input": {"a": 1, "a": 2}}',
        b'{"input": {"n": NaN}}',
        b'{"input": {"s": "\xff"}}',
        b"\xef\xbb\xbf{}",
    ],
    ids=[
        "truncated",
        "extra-member",
        "array-input",
        "string-input",
        "array-body",
        "no-input",
        "repeated-member",
        "nan",
        "not-utf8",
        "bom",
    ],
)
async def test_start_refuses_malformed_bodies(
    client: httpx.AsyncClient, backend: FakeBackend, raw: bytes
) -> None:
    response = await client.post(
        START_PATH, content=raw, headers={**start_headers(), "content-type": "application/json"}
    )
    problem(response, 400, "request.invalid")
    assert "start" not in backend.names()


def nested(depth: int) -> bytes:
    # ``depth`` levels in all, counting the body object and the input object.
    inner = "[" * (depth - 2) + "]" * (depth - 2)
    return ('{"input": {"deep": ' + (inner or "1") + "}}").encode()


async def test_json_nesting_is_limited_to_32_levels(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    ok = await client.post(START_PATH, content=nested(32), headers=start_headers("k1"))
    assert ok.status_code == 201
    deep = await client.post(START_PATH, content=nested(33), headers=start_headers("k2"))
    document = problem(deep, 400, "request.invalid")
    assert "32" in document["detail"]
    hostile = await client.post(START_PATH, content=b"[" * 60_000, headers=start_headers("k3"))
    problem(hostile, 400, "request.invalid")
    assert backend.names().count("start") == 1


def sized_body(size: int) -> bytes:
    prefix, suffix = b'{"input": {"text": "', b'"}}'
    return prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix


async def test_a_body_of_exactly_64_kib_is_accepted(client: httpx.AsyncClient) -> None:
    response = await client.post(
        START_PATH, content=sized_body(MAX_BODY_BYTES), headers=start_headers()
    )
    assert response.status_code == 201


async def test_content_length_over_64_kib_is_refused(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    response = await client.post(
        START_PATH, content=sized_body(MAX_BODY_BYTES + 1), headers=start_headers()
    )
    problem(response, 413, "request.too-large")
    assert "start" not in backend.names()
    assert backend.audits[-1].outcome == "invalid"


async def test_streamed_body_over_64_kib_is_refused(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"input": {"text": "'
        for _ in range(20):
            yield b"x" * 4096

    request = client.build_request("POST", START_PATH, content=chunks(), headers=start_headers())
    assert "content-length" not in request.headers
    response = await client.send(request)
    problem(response, 413, "request.too-large")
    assert "start" not in backend.names()


async def test_start_refused_by_policy_is_403_and_audited(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    response = await client.post(
        START_PATH, json={"input": {}}, headers=start_headers(token=READER)
    )
    problem(response, 403, "authorization.refused")
    other = await client.post(
        "/v1/workflows/other-flow/runs", json={"input": {}}, headers=start_headers()
    )
    problem(other, 403, "authorization.refused")
    assert [(a.action, a.outcome, a.principal) for a in backend.audits] == [
        ("start", "refused", (ISSUER, "carol")),
        ("start", "refused", (ISSUER, "alice")),
    ]
    assert "start" not in backend.names()


async def test_input_invalid_keeps_only_safe_extras(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.refusal = CoordinatorError(
        Code.INPUT_INVALID,
        "the input does not match the schema",
        {"errors": [{"pointer": "/applicant", "reason": "required"}], "input": "secret"},
    )
    response = await client.post(
        START_PATH, json={"input": {"applicantSecret": "p4ss"}}, headers=start_headers()
    )
    document = problem(response, 422, "input.invalid")
    assert document["errors"] == [{"pointer": "/applicant", "reason": "required"}]
    assert "input" not in document
    assert "p4ss" not in response.text and "applicantSecret" not in response.text


# ------------------------------------------------------------------------ authentication


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic YWxpY2U6cHc="},
        {"Authorization": "Bearer " + mint(key=OTHER_KEY)},
        {"Authorization": "Bearer " + mint(aud="https://elsewhere.example.org")},
        {"Authorization": "Bearer not.a.jwt"},
    ],
    ids=["missing", "empty", "basic", "wrong-key", "wrong-audience", "garbage"],
)
async def test_missing_or_bad_token_is_401(
    client: httpx.AsyncClient, backend: FakeBackend, headers: dict[str, str]
) -> None:
    response = await client.get(f"/v1/runs/{RUN_A}", headers=headers)
    document = problem(response, 401, "authentication.refused")
    assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    credentials = headers.get("Authorization", "").partition(" ")[2]
    if credentials:
        assert credentials not in response.text
    assert document["detail"] == "the access token is missing or not acceptable"
    assert backend.log == []  # no caller, no action, no audit record


async def test_repeated_authorization_headers_are_refused(client: httpx.AsyncClient) -> None:
    request = client.build_request("GET", f"/v1/runs/{RUN_A}")
    request.headers = httpx.Headers(
        [("authorization", ALICE["Authorization"]), ("authorization", BOB["Authorization"])]
    )
    problem(await client.send(request), 401, "authentication.refused")


async def test_verifier_without_keys_is_503(backend: FakeBackend) -> None:
    class Down:
        async def fetch(self) -> Any:
            raise JwksUnavailable("down")

    async with main_client(context(backend, token_verifier=verifier(Down()))) as client:
        response = await client.get(f"/v1/runs/{RUN_A}", headers=ALICE)
    problem(response, 503, "service.unavailable")
    assert "www-authenticate" not in response.headers
    assert backend.log == []


# ----------------------------------------------------------------------- runs: ownership


async def test_status_of_own_run(client: httpx.AsyncClient, backend: FakeBackend) -> None:
    response = await client.get(f"/v1/runs/{RUN_A}", headers=ALICE)
    assert response.status_code == 200
    assert response.json()["runId"] == RUN_A
    assert response.headers["cache-control"] == "no-store"
    assert backend.names() == ["run_owner", "status", "audit"]
    assert backend.audits == [
        AuditRecord("status", "ok", (ISSUER, "alice"), "intake-portal", RUN_A, None)
    ]


async def test_another_principals_run_looks_missing(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    other = await client.get(f"/v1/runs/{RUN_B}", headers=ALICE)
    missing = await client.get(f"/v1/runs/{RUN_MISSING}", headers=ALICE)
    not_uuid = await client.get("/v1/runs/not-a-run", headers=ALICE)
    documents = [problem(r, 404, "run.not-found") for r in (other, missing, not_uuid)]
    assert len({(d["title"], d["detail"]) for d in documents}) == 1
    assert "status" not in backend.names()
    assert backend.names().count("run_owner") == 2  # the malformed id never left the gateway
    assert [(a.outcome, a.run_id) for a in backend.audits] == [
        ("not-found", RUN_B),
        ("not-found", RUN_MISSING),
        ("not-found", None),
    ]


async def test_an_operator_sees_every_run_of_its_workflows(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    response = await client.get(f"/v1/runs/{RUN_B}", headers=CASE_OPERATOR)
    assert response.status_code == 200
    inspected = await client.get(f"/v1/runs/{RUN_B}/inspection", headers=CASE_OPERATOR)
    assert inspected.status_code == 200
    assert inspected.json()["runId"] == RUN_B
    assert [a.action for a in backend.audits] == ["status", "inspect"]


async def test_inspection_needs_the_inspect_action(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    own = await client.get(f"/v1/runs/{RUN_A}/inspection", headers=ALICE)
    assert own.status_code == 200
    refused = await client.get(f"/v1/runs/{RUN_A}/inspection", headers=READER)
    problem(refused, 403, "authorization.refused")
    assert [(a.action, a.outcome) for a in backend.audits] == [
        ("inspect", "ok"),
        ("inspect", "refused"),
    ]


# -------------------------------------------------------------------------------- list


async def test_list_scopes_non_operators_to_their_own_runs(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    response = await client.get("/v1/runs", headers=ALICE)
    assert response.status_code == 200
    assert response.json()["runs"][0]["runId"] == RUN_A
    assert backend.log[0] == (
        "list",
        ListQuery((WORKFLOW,), (ISSUER, "alice"), None, None, 20, None),
    )
    await client.get(
        "/v1/runs",
        params={
            "attention": "true",
            "state": "held",
            "workflow": WORKFLOW,
            "limit": "100",
            "cursor": "abc_DEF-1=",
        },
        headers=CASE_OPERATOR,
    )
    assert backend.log[-2] == (
        "list",
        ListQuery((WORKFLOW,), None, True, "held", 100, "abc_DEF-1="),
    )
    await client.get(
        "/v1/runs",
        params={
            "step": "send-approval",
            "cause": "status-5xx",
            "updatedBefore": "2026-12-04T09:30:00+01:00",
            "order": "oldest",
        },
        headers=CASE_OPERATOR,
    )
    assert backend.log[-2] == (
        "list",
        ListQuery(
            (WORKFLOW,),
            None,
            None,
            None,
            20,
            None,
            order="oldest",
            step="send-approval",
            cause="status-5xx",
            updated_before="2026-12-04T09:30:00+01:00",
        ),
    )
    assert [(a.action, a.outcome) for a in backend.audits] == [("list", "ok")] * 3


@pytest.mark.parametrize(
    "query",
    [
        "attention=yes",
        "state=sleeping",
        "limit=0",
        "limit=101",
        "limit=ten",
        "limit=-1",
        "workflow=Not_A_Workflow",
        "cursor=has%20space",
        "colour=blue",
        "state=held&state=failed",
        "order=random",
        "order=oldest&order=newest",
        "step=Send_Approval",
        "cause=bad-luck",
        "updatedBefore=yesterday",
        "updatedBefore=2026-12-04T09:30:00",
        "runIdPrefix=abc",
        "runIdPrefix=wxyz",
        "runIdPrefix=abcd-",
        "runIdPrefix=abcd&state=held",
        "runIdPrefix=abcd&order=newest",
        "runIdPrefix=abcd&cursor=abc",
        "runIdPrefix=abcd&runIdPrefix=abce",
        "startKey=order-1",
        "startKey=has%20space&workflow=approval-notice",
        "startSub=alice&workflow=approval-notice",
        "startKey=k&workflow=approval-notice&runIdPrefix=abcd",
        "startKey=k&workflow=approval-notice&attention=true",
        "eventSource=urn:x",
        "eventId=e-1",
        "eventSource=urn:x&eventId=%01",
    ],
)
async def test_list_refuses_bad_parameters(
    client: httpx.AsyncClient, backend: FakeBackend, query: str
) -> None:
    response = await client.get(f"/v1/runs?{query}", headers=ALICE)
    problem(response, 400, "request.invalid")
    assert "list" not in backend.names()
    assert backend.audits[-1] == AuditRecord(
        "list", "invalid", (ISSUER, "alice"), "intake-portal", None, None
    )


async def test_list_searches_by_run_id_prefix_start_key_or_event(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    searches: list[tuple[dict[str, str], dict[str, str], dict[str, Any]]] = [
        ({"runIdPrefix": "ABCD1234-E"}, ALICE, {"run_id_prefix": "abcd1234-e"}),
        (
            {"startKey": "order-77", "workflow": WORKFLOW},
            ALICE,
            {"start": (ISSUER, "alice", WORKFLOW, "order-77")},
        ),
        (
            {"startKey": "order-77", "workflow": WORKFLOW, "startSub": "intake-portal"},
            CASE_OPERATOR,
            {"start": (ISSUER, "intake-portal", WORKFLOW, "order-77")},
        ),
        (
            {"eventSource": "urn:example:bookings", "eventId": "evt 9"},
            CASE_OPERATOR,
            {"event": ("urn:example:bookings", "evt 9")},
        ),
    ]
    for params, caller, wanted in searches:
        response = await client.get("/v1/runs", params=params, headers=caller)
        assert response.status_code == 200, response.text
        principal = (ISSUER, "alice") if caller is ALICE else None
        listed = [entry for entry in backend.log if entry[0] == "list"]
        assert listed[-1] == (
            "list",
            ListQuery((WORKFLOW,), principal, None, None, 20, None, **wanted),
        )
    assert len([entry for entry in backend.log if entry[0] == "list"]) == len(searches)


async def test_list_of_an_unlisted_workflow_is_403(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/runs?workflow=other-flow", headers=ALICE)
    problem(response, 403, "authorization.refused")


# ------------------------------------------------------------------------ run actions


@pytest.mark.parametrize("action", ["reconcile", "retry-same", "cancel"])
async def test_run_actions_pass_the_reason(
    client: httpx.AsyncClient, backend: FakeBackend, action: str
) -> None:
    response = await client.post(
        f"/v1/runs/{RUN_B}/{action}", json={"reason": "INC-42:ops/a_b.c"}, headers=CASE_OPERATOR
    )
    assert response.status_code == 200
    assert response.json()["result"] == {"action": action}
    caller, run_id, sent_action, reason = backend.log[-2][1]
    assert caller == BackendCaller(ISSUER, "olga", "case-operators", True)
    assert (run_id, sent_action, reason) == (RUN_B, action, "INC-42:ops/a_b.c")
    assert backend.audits == [
        AuditRecord(action, "ok", (ISSUER, "olga"), "case-operators", RUN_B, "INC-42:ops/a_b.c")
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"reason": "has space"},
        {"reason": "user@example.org"},
        {"reason": "x" * 129},
        {"reason": ""},
        {"reason": 42},
        {},
        {"reason": "ok", "note": "extra"},
    ],
    ids=["space", "at", "too-long", "empty", "number", "missing", "extra"],
)
async def test_run_actions_refuse_bad_reasons(
    client: httpx.AsyncClient, backend: FakeBackend, body: dict[str, Any]
) -> None:
    response = await client.post(f"/v1/runs/{RUN_A}/cancel", json=body, headers=CASE_OPERATOR)
    document = problem(response, 400, "request.invalid")
    assert "user@example.org" not in json.dumps(document)
    assert "run_action" not in backend.names()
    assert backend.audits[-1].outcome == "invalid"
    assert backend.audits[-1].reason is None


async def test_a_128_character_reason_is_accepted(client: httpx.AsyncClient) -> None:
    response = await client.post(
        f"/v1/runs/{RUN_A}/cancel", json={"reason": "r" * 128}, headers=ALICE
    )
    assert response.status_code == 200


async def test_run_action_on_another_principals_run_is_404(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    response = await client.post(f"/v1/runs/{RUN_B}/cancel", json={"reason": "x"}, headers=ALICE)
    problem(response, 404, "run.not-found")
    # Refused before the body was read: its reason is not the audit record's.
    assert backend.audits == [
        AuditRecord("cancel", "not-found", (ISSUER, "alice"), "intake-portal", RUN_B, None)
    ]


@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b"{not json", {}),
        (json.dumps({"reason": "has space"}).encode(), {}),
        (b"x" * (MAX_BODY_BYTES + 1), {}),
    ],
    ids=["malformed", "bad-reason", "too-large"],
)
async def test_run_actions_refuse_an_unauthorised_caller_before_reading_the_body(
    client: httpx.AsyncClient, backend: FakeBackend, content: bytes, headers: dict[str, str]
) -> None:
    # Another principal's run: 404, whatever the body; a caller without the action: 403.
    response = await client.post(
        f"/v1/runs/{RUN_B}/cancel",
        content=content,
        headers={**ALICE, "content-type": "application/json", **headers},
    )
    problem(response, 404, "run.not-found")
    response = await client.post(
        f"/v1/runs/{RUN_A}/reconcile",
        content=content,
        headers={**READER, "content-type": "application/json"},
    )
    problem(response, 403, "authorization.refused")
    assert "run_action" not in backend.names()
    assert [audit.reason for audit in backend.audits] == [None, None]


async def test_run_action_refusal_from_recovery_is_relayed(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.refusal = CoordinatorError(Code.RECONCILE_UNSUPPORTED, "no receipts for this product")
    response = await client.post(
        f"/v1/runs/{RUN_A}/reconcile", json={"reason": "INC-1"}, headers=CASE_OPERATOR
    )
    document = problem(response, 409, "reconcile.unsupported")
    assert document["detail"] == "no receipts for this product"
    assert backend.audits[-1].outcome == "conflict"


# ---------------------------------------------------------------------------- operator


async def test_doctor_for_platform_operators_only(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    response = await client.get("/v1/operator/doctor", headers=PLATFORM)
    assert response.status_code == 200
    assert response.json()["schemaVersion"] == 4
    refused = await client.get("/v1/operator/doctor", headers=CASE_OPERATOR)
    problem(refused, 403, "authorization.refused")
    assert [(a.action, a.outcome, a.client_id) for a in backend.audits] == [
        ("doctor", "ok", "platform-operators"),
        ("doctor", "refused", "case-operators"),
    ]


OPERATOR_BODIES: dict[str, dict[str, Any]] = {
    "restore-hold": {"reason": "restore-2027-01"},
    "release-restore-hold": {"reason": "restore-2027-01"},
    "complete-execution-recovery": {
        "recoveryReference": "restore-2027-01",
        "executionHistoryComplete": True,
        "priorDeploymentFenced": True,
    },
    "release-admission-hold": {
        "recoveryReference": "restore-2027-01",
        "admissionHistoryComplete": True,
        "priorDeploymentFenced": True,
    },
    "retain": {"before": "2027-01-01T00:00:00Z", "limit": 100},
}


@pytest.mark.parametrize("action", sorted(OPERATOR_BODIES))
async def test_operator_actions_pass_validated_bodies(
    client: httpx.AsyncClient, backend: FakeBackend, action: str
) -> None:
    body = OPERATOR_BODIES[action]
    response = await client.post(f"/v1/operator/{action}", json=body, headers=PLATFORM)
    assert response.status_code == 200
    assert response.json() == {"action": action, "done": True}
    caller, sent_action, sent_body = backend.log[0][1]
    assert caller.operator and sent_action == action and sent_body == body
    reason = None if action == "retain" else "restore-2027-01"
    assert backend.audits == [
        AuditRecord(action, "ok", (ISSUER, "pat"), "platform-operators", None, reason)
    ]


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("restore-hold", {"reason": "a b"}),
        ("restore-hold", {"reason": "ok", "force": True}),
        (
            "complete-execution-recovery",
            {**OPERATOR_BODIES["complete-execution-recovery"], "executionHistoryComplete": False},
        ),
        (
            "complete-execution-recovery",
            {**OPERATOR_BODIES["complete-execution-recovery"], "priorDeploymentFenced": "true"},
        ),
        ("release-admission-hold", {"recoveryReference": "r", "admissionHistoryComplete": True}),
        (
            "release-admission-hold",
            {**OPERATOR_BODIES["release-admission-hold"], "recoveryReference": "r?"},
        ),
        ("retain", {"before": "2027-01-01", "limit": 10}),
        ("retain", {"before": "2027-13-01T00:00:00Z", "limit": 10}),
        ("retain", {"before": "2027-01-01T00:00:00", "limit": 10}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 0}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 101}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": True}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 1.5}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 1, "dryRun": "yes"}),
        ("retain", {"before": "2027-01-01T00:00:00Z", "limit": 1, "dryRun": 1}),
    ],
)
async def test_operator_actions_refuse_bad_bodies(
    client: httpx.AsyncClient, backend: FakeBackend, action: str, body: dict[str, Any]
) -> None:
    response = await client.post(f"/v1/operator/{action}", json=body, headers=PLATFORM)
    problem(response, 400, "request.invalid")
    assert "operator_action" not in backend.names()


@pytest.mark.parametrize(("dry_run", "forwarded"), [(True, {"dryRun": True}), (False, {})])
async def test_retain_forwards_a_dry_run_only_when_asked(
    client: httpx.AsyncClient, backend: FakeBackend, dry_run: bool, forwarded: dict[str, Any]
) -> None:
    body = {**OPERATOR_BODIES["retain"], "dryRun": dry_run}
    response = await client.post("/v1/operator/retain", json=body, headers=PLATFORM)
    assert response.status_code == 200
    _caller, _action, sent_body = backend.log[0][1]
    assert sent_body == {**OPERATOR_BODIES["retain"], **forwarded}


async def test_operator_actions_need_an_operator_policy(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    response = await client.post(
        "/v1/operator/retain", json=OPERATOR_BODIES["retain"], headers=ALICE
    )
    problem(response, 403, "authorization.refused")
    assert backend.audits[-1].outcome == "refused"


# --------------------------------------------------------------- producer route hooks


@pytest.mark.parametrize("path", ["/v1/review-completions", "/v1/events"])
async def test_producer_routes_without_a_hook_refuse_every_caller(
    client: httpx.AsyncClient, backend: FakeBackend, path: str
) -> None:
    problem(await client.post(path, json={"reviewId": "r-1"}), 401, "authentication.refused")
    with_token = await client.post(path, json={}, headers=ALICE)
    problem(with_token, 401, "authentication.refused")
    assert backend.log == []


async def test_producer_route_hook_is_called(backend: FakeBackend) -> None:
    from starlette.requests import Request
    from starlette.responses import Response

    seen: list[str] = []

    async def completions(request: Request, ctx: GatewayContext) -> Response:
        seen.append(request.url.path)
        return Response(status_code=202)

    base = context(backend)
    ctx = GatewayContext(base.backend, base.verifier, base.policies, completions=completions)
    async with main_client(ctx) as client:
        response = await client.post("/v1/review-completions", json={"reviewId": "r"})
    assert response.status_code == 202
    assert seen == ["/v1/review-completions"]


# ------------------------------------------------------------------- routing problems


@pytest.mark.parametrize("headers", [{}, ALICE], ids=["anonymous", "with-token"])
@pytest.mark.parametrize("path", ["/nothing", "/v1/runs/", "/metrics", "/v1/operator/x"])
async def test_unknown_routes_are_404_problems(
    client: httpx.AsyncClient, path: str, headers: dict[str, str]
) -> None:
    response = await client.get(path, headers=headers)
    document = problem(response, 404, "not-found")
    assert document["instance"] == path


async def test_wrong_method_is_405_problem(client: httpx.AsyncClient) -> None:
    response = await client.delete(f"/v1/runs/{RUN_A}", headers=ALICE)
    problem(response, 405, "method-not-allowed")
    assert "GET" in response.headers["allow"]
    post_ready = await client.post("/ready")
    problem(post_ready, 405, "method-not-allowed")


@pytest.mark.parametrize(
    ("path", "token"),
    [
        (f"/v1/runs/{RUN_A}", ALICE),
        (f"/v1/runs/{RUN_A}/inspection", CASE_OPERATOR),
        ("/v1/runs", CASE_OPERATOR),
        ("/v1/operator/doctor", PLATFORM),
    ],
)
async def test_head_on_an_acting_route_is_405_and_neither_acts_nor_audits(
    client: httpx.AsyncClient, backend: FakeBackend, path: str, token: dict[str, str]
) -> None:
    response = await client.head(path, headers=token)
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
    assert backend.audits == []
    assert backend.names() == []
    # The same GET acts and is audited.
    assert (await client.get(path, headers=token)).status_code == 200
    assert len(backend.audits) == 1


async def test_head_on_ready_answers_like_get(client: httpx.AsyncClient) -> None:
    response = await client.head("/ready")
    assert response.status_code == 200
    assert response.content == b""


async def test_instance_uses_the_public_url(backend: FakeBackend) -> None:
    ctx = context(backend, public_url="https://coordinator.example.org/")
    async with main_client(ctx) as client:
        response = await client.get(f"/v1/runs/{RUN_B}", headers=ALICE)
    document = problem(response, 404, "run.not-found")
    assert document["instance"] == f"https://coordinator.example.org/v1/runs/{RUN_B}"


# ------------------------------------------------------------------------------- audit


async def test_the_answer_waits_for_the_audit_record(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.audit_gate = asyncio.Event()
    pending = asyncio.create_task(client.get(f"/v1/runs/{RUN_A}", headers=ALICE))
    await backend.audit_called.wait()
    assert not pending.done()
    assert backend.names() == ["run_owner", "status", "audit"]
    backend.audit_gate.set()
    response = await pending
    assert response.status_code == 200
    assert len(backend.audits) == 1


async def test_audit_failure_withholds_the_answer(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.audit_refusal = CoordinatorError(Code.SERVICE_UNAVAILABLE, "auditd is down")
    response = await client.post(START_PATH, json={"input": {"a": 1}}, headers=start_headers())
    problem(response, 503, "audit.response-unavailable")
    assert backend.names() == ["start", "audit"]  # the start may have taken effect
    assert RUN_A not in response.text


async def test_audit_failure_also_withholds_refusals(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.audit_refusal = RuntimeError("journal broke")
    response = await client.get(f"/v1/runs/{RUN_B}", headers=ALICE)
    problem(response, 503, "audit.response-unavailable")


async def test_unexpected_failure_is_a_bare_500_with_a_correlation_id(
    client: httpx.AsyncClient, backend: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    backend.refusal = ValueError("database row 17 had applicant alice@example.org")
    with caplog.at_level(logging.ERROR, logger="coordinator.gateway"):
        response = await client.get(f"/v1/runs/{RUN_A}", headers=ALICE)
    document = problem(response, 500, "internal")
    assert "alice@example.org" not in response.text
    assert "Traceback" not in response.text and "ValueError" not in response.text
    correlation = document["correlationId"]
    assert any(correlation in record.getMessage() for record in caplog.records)
    assert backend.audits[-1].outcome == "failed"


async def test_uncatalogued_refusal_codes_become_500(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.refusal = CoordinatorError(Code.INTERNAL, "the recovery component failed")
    response = await client.get(f"/v1/runs/{RUN_A}", headers=ALICE)
    document = problem(response, 500, "internal")
    assert "recovery" not in document["detail"]


# ----------------------------------------------------------------------------- metrics


async def test_requests_are_counted_by_route_template(backend: FakeBackend) -> None:
    ctx = context(backend)
    async with main_client(ctx) as client:
        await client.get(f"/v1/runs/{RUN_A}", headers=ALICE)
        await client.get(f"/v1/runs/{RUN_B}", headers=ALICE)
        await client.get("/no/such/route")
        await client.get("/ready")
    metrics = ctx.http_metrics
    assert metrics.count("/v1/runs/{runId}", 200) == 1
    assert metrics.count("/v1/runs/{runId}", 404) == 1
    assert metrics.count("unmatched", 404) == 1
    assert metrics.count("/ready", 200) == 1
    text = metrics.render()
    assert RUN_A not in text and RUN_B not in text and "/no/such/route" not in text
