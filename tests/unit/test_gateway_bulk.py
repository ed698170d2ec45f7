"""Bulk run actions at the gateway (CONTRACT §8.7), with a fake backend and real tokens:
which runs are chosen, how each is acted on and audited, and every refusal."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from core.codes import Code
from core.errors import CoordinatorError
from gateway import bulk
from gateway.backend import ListQuery
from tests.helpers.gateway_kit import (
    ISSUER,
    RUN_A,
    WORKFLOW,
    FakeBackend,
    bearer,
    context,
    main_client,
    mint,
    primed,
)

ALICE = bearer(mint("alice", "intake-portal"))
READER = bearer(mint("carol", "reader"))
CASE_OPERATOR = bearer(mint("olga", "case-operators"))
REASON = "INC-2041"


def run_ids(count: int) -> list[str]:
    return [str(uuid.UUID(int=n + 1)) for n in range(count)]


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def client(backend: FakeBackend) -> AsyncIterator[httpx.AsyncClient]:
    async with main_client(await primed(context(backend))) as http:
        yield http


def actions_of(backend: FakeBackend) -> list[tuple[str, str]]:
    """``(run id, action)`` of every run action the backend was asked for, in order."""
    return [(detail[1], detail[2]) for name, detail in backend.log if name == "run_action"]


def lists_of(backend: FakeBackend) -> list[ListQuery]:
    return [detail for name, detail in backend.log if name == "list"]


async def test_a_dry_run_names_the_chosen_runs_and_acts_on_none(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.listed = run_ids(250)
    answer = await client.post(
        "/v1/runs/bulk/retry-same",
        json={
            "reason": REASON,
            "filter": {"attention": True, "cause": "status-5xx", "step": "send-notice"},
            "limit": 230,
            "dryRun": True,
        },
        headers=CASE_OPERATOR,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"dryRun": True, "matched": 230, "runIds": backend.listed[:230]}
    assert actions_of(backend) == []
    # Chosen as the list chooses them: oldest first, the filter passed on, page by page.
    pages = lists_of(backend)
    assert [query.limit for query in pages] == [100, 100, 30]
    assert [query.cursor for query in pages] == [None, "100", "200"]
    assert {(q.order, q.attention, q.cause, q.step) for q in pages} == {
        ("oldest", True, "status-5xx", "send-notice")
    }
    assert {q.workflows for q in pages} == {(WORKFLOW,)}
    assert {q.principal for q in pages} == {None}
    # One record, for the bulk request, with the reason.
    assert [(r.action, r.outcome, r.reason, r.run_id) for r in backend.audits] == [
        ("bulk-retry-same", "ok", REASON, None)
    ]


async def test_the_real_call_acts_on_exactly_the_runs_a_dry_run_names(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.listed = run_ids(40)
    body: dict[str, Any] = {"reason": REASON, "filter": {"state": "held"}, "limit": 25}
    dry = await client.post(
        "/v1/runs/bulk/cancel", json={**body, "dryRun": True}, headers=CASE_OPERATOR
    )
    real = await client.post("/v1/runs/bulk/cancel", json=body, headers=CASE_OPERATOR)
    assert real.status_code == 200, real.text
    document = real.json()
    assert document["dryRun"] is False
    assert document["matched"] == dry.json()["matched"] == 25
    assert [entry["runId"] for entry in document["results"]] == dry.json()["runIds"]
    assert sorted(actions_of(backend)) == sorted((run, "cancel") for run in dry.json()["runIds"])
    # Each run audited as a cancel with the reason, then one record for the request.
    per_run = [r for r in backend.audits if r.action == "cancel"]
    assert sorted(r.run_id or "" for r in per_run) == sorted(dry.json()["runIds"])
    assert {(r.outcome, r.reason) for r in per_run} == {("ok", REASON)}
    assert backend.audits[-1].action == "bulk-cancel"
    assert [r.action for r in backend.audits].count("bulk-cancel") == 2  # dry run and real


async def test_a_runs_refusal_is_its_code_and_the_others_go_on(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.listed = run_ids(5)
    backend.run_refusals[backend.listed[1]] = CoordinatorError(
        Code.RETRY_REFUSED, "the run has ended"
    )
    backend.run_refusals[backend.listed[3]] = CoordinatorError(
        Code.EXECUTION_HELD, "the restore hold stops execution"
    )
    answer = await client.post(
        "/v1/runs/bulk/retry-same",
        json={"reason": REASON, "filter": {"attention": True}},
        headers=CASE_OPERATOR,
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [entry.get("code") for entry in results] == [
        None,
        "retry.refused",
        None,
        "execution.held",
        None,
    ]
    assert [entry.get("result") for entry in results] == [
        "{'action': 'retry-same'}",
        None,
        "{'action': 'retry-same'}",
        None,
        "{'action': 'retry-same'}",
    ]
    outcomes = {r.run_id: r.outcome for r in backend.audits if r.action == "retry-same"}
    assert outcomes == {
        backend.listed[0]: "ok",
        backend.listed[1]: "conflict",
        backend.listed[2]: "ok",
        backend.listed[3]: "conflict",
        backend.listed[4]: "ok",
    }
    # Every retry-same gets what is left of the shared budget, never more than one wait.
    assert len(backend.verdict_waits) == 5
    assert all(w is not None and 0 < w <= 10.0 for w in backend.verdict_waits)


async def test_only_retry_same_is_given_a_verdict_wait(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.listed = run_ids(3)
    answer = await client.post(
        "/v1/runs/bulk/reconcile", json={"reason": REASON, "filter": {}}, headers=CASE_OPERATOR
    )
    assert answer.status_code == 200, answer.text
    assert backend.verdict_waits == [None, None, None]


async def test_a_spent_budget_still_acts_and_waits_no_more(
    client: httpx.AsyncClient, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "VERDICT_BUDGET_SECONDS", 0.0)
    backend.listed = run_ids(4)
    answer = await client.post(
        "/v1/runs/bulk/retry-same", json={"reason": REASON, "filter": {}}, headers=CASE_OPERATOR
    )
    assert answer.status_code == 200, answer.text
    assert len(actions_of(backend)) == 4
    assert backend.verdict_waits == [0.0, 0.0, 0.0, 0.0]


async def test_an_audit_failure_stops_taking_runs_and_answers_503(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.listed = run_ids(200)
    backend.audit_refusal = CoordinatorError(Code.AUDIT_RESPONSE_UNAVAILABLE, "disk full")
    answer = await client.post(
        "/v1/runs/bulk/cancel", json={"reason": REASON, "filter": {}}, headers=CASE_OPERATOR
    )
    assert answer.status_code == 503
    assert answer.json()["code"] == "audit.response-unavailable"
    # The workers in flight finish their run; none takes another.
    assert 1 <= len(actions_of(backend)) <= bulk.CONCURRENCY


async def test_a_caller_who_is_not_an_operator_acts_only_on_its_own_runs(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.listed = [RUN_A]
    answer = await client.post(
        "/v1/runs/bulk/cancel", json={"reason": REASON, "filter": {}}, headers=ALICE
    )
    assert answer.status_code == 200, answer.text
    assert {q.principal for q in lists_of(backend)} == {(ISSUER, "alice")}


async def test_a_policy_without_the_action_is_refused_before_the_body_is_read(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    # The intake portal may cancel, not retry-same; the reader may do neither.
    for token, path in ((ALICE, "retry-same"), (READER, "cancel")):
        answer = await client.post(f"/v1/runs/bulk/{path}", content=b"{not json", headers=token)
        assert answer.status_code == 403, answer.text
        assert answer.json()["code"] == "authorization.refused"
    assert lists_of(backend) == []
    assert [(r.action, r.outcome) for r in backend.audits] == [
        ("bulk-retry-same", "refused"),
        ("bulk-cancel", "refused"),
    ]


async def test_a_workflow_outside_the_policy_is_refused(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    answer = await client.post(
        "/v1/runs/bulk/cancel",
        json={"reason": REASON, "filter": {"workflow": "other-workflow"}},
        headers=CASE_OPERATOR,
    )
    assert answer.status_code == 403
    assert lists_of(backend) == []


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"filter": {}}, "/reason"),
        ({"reason": "no spaces allowed", "filter": {}}, "/reason"),
        ({"reason": REASON}, "/filter"),
        ({"reason": REASON, "filter": []}, "/filter"),
        ({"reason": REASON, "filter": {"colour": "crimson"}}, "/filter"),
        ({"reason": REASON, "filter": {"attention": "true"}}, "/filter/attention"),
        ({"reason": REASON, "filter": {"state": "finito"}}, "/filter/state"),
        ({"reason": REASON, "filter": {"workflow": "Bad_Id"}}, "/filter/workflow"),
        ({"reason": REASON, "filter": {"step": 7}}, "/filter/step"),
        ({"reason": REASON, "filter": {"cause": "gremlins"}}, "/filter/cause"),
        ({"reason": REASON, "filter": {"updatedBefore": "yesterday"}}, "/filter/updatedBefore"),
        ({"reason": REASON, "filter": {}, "limit": 0}, "/limit"),
        ({"reason": REASON, "filter": {}, "limit": 1001}, "/limit"),
        ({"reason": REASON, "filter": {}, "limit": True}, "/limit"),
        ({"reason": REASON, "filter": {}, "dryRun": "yes"}, "/dryRun"),
        ({"reason": REASON, "filter": {}, "order": "newest"}, "member"),
    ],
)
async def test_a_bad_body_is_refused_naming_its_pointer(
    client: httpx.AsyncClient, backend: FakeBackend, body: dict[str, Any], pointer: str
) -> None:
    answer = await client.post("/v1/runs/bulk/retry-same", json=body, headers=CASE_OPERATOR)
    assert answer.status_code == 400, answer.text
    document = answer.json()
    assert document["code"] == "request.invalid"
    assert pointer in document["detail"]
    for value in ("crimson", "gremlins", "yesterday", "Bad_Id", "no spaces allowed", "finito"):
        assert value not in document["detail"]
    assert lists_of(backend) == []


async def test_the_bulk_route_wins_over_a_run_called_bulk(
    client: httpx.AsyncClient, backend: FakeBackend
) -> None:
    backend.listed = []
    answer = await client.post(
        "/v1/runs/bulk/retry-same", json={"reason": REASON, "filter": {}}, headers=CASE_OPERATOR
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"dryRun": False, "matched": 0, "results": []}
    assert "run_owner" not in backend.names()
    # Other methods and unknown actions are not bulk requests.
    assert (await client.get("/v1/runs/bulk/retry-same", headers=CASE_OPERATOR)).status_code == 405
    unknown = await client.post(
        "/v1/runs/bulk/erase", json={"reason": REASON, "filter": {}}, headers=CASE_OPERATOR
    )
    assert unknown.status_code == 404
