"""``docs/openapi.yaml`` held to the code: the gateway's route table, the policy actions,
``core/codes.py``, and real answers validated against the document's schemas.

The refusals every route shares (401, 403, 400, 413, the router's 404/405, 500, 503) are
provoked through the real app with a fake backend, route by route as the document lists
them. The success documents and the components' own refusals come from a real deployment:
admission, recovery and auditd served over gRPC on a real database, behind the real app.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from starlette.applications import Starlette
from starlette.routing import Route

import core
from admission.service import serve as serve_admission
from auditd.service import serve as serve_auditd
from core import deploy
from core.actions import DEPLOYMENT_ACTIONS, RUN_ACTIONS
from core.codes import Code
from core.config.model import Policy
from core.errors import CoordinatorError
from core.runs import StartResult
from devstack.postgres import DatabaseHandle
from gateway.app import create_app, create_metrics_app
from gateway.auth import JwksUnavailable
from gateway.backend import GrpcBackend
from gateway.bodies import MAX_BODY_BYTES
from gateway.completions import AdmissionProducers, CompletionHandler, load_credentials
from gateway.events import EventHandler, load_sources, sign
from gateway.routes import GatewayContext
from recovery.service import serve as serve_recovery
from tests.helpers.deployment import TestDeployment, drop_deployment, write_secret
from tests.helpers.gateway_kit import (
    POLICIES,
    RUN_A,
    RUN_MISSING,
    WORKFLOW,
    FakeBackend,
    bearer,
    client_for,
    mint,
    primed,
    verifier,
)
from tests.helpers.serving import serving, socket_runtime

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT: Final[dict[str, Any]] = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
BASE: Final = "urn:registry-coordinator:openapi"
REGISTRY: Final[Registry[Any]] = Registry().with_resource(
    BASE, Resource.from_contents(DOCUMENT, default_specification=DRAFT202012)
)
PROBLEM: Final = "application/problem+json"
METHODS: Final = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
ALL_ACTIONS: Final = (*RUN_ACTIONS, *DEPLOYMENT_ACTIONS)

Operation = tuple[str, str]
"""``(METHOD, path template)``."""


# ------------------------------------------------------------------------ the document


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _node(pointer: str) -> Any:
    node: Any = DOCUMENT
    for token in pointer.split("/")[1:]:
        node = node[token.replace("~1", "/").replace("~0", "~")]
    return node


def _follow(pointer: str) -> str:
    """``pointer``, or where its ``$ref`` (and theirs) lead inside the document."""
    for _ in range(8):
        ref = _node(pointer).get("$ref")
        if ref is None:
            return pointer
        assert ref.startswith("#/"), ref
        pointer = ref[1:]
    raise AssertionError(f"{pointer}: $ref chain too long")


def operations() -> Iterator[tuple[Operation, dict[str, Any]]]:
    """Every operation of the document."""
    for path, item in DOCUMENT["paths"].items():
        for method in METHODS:
            if method in item:
                yield (method.upper(), path), item[method]


def operation(method: str, template: str) -> dict[str, Any]:
    found: dict[str, Any] = DOCUMENT["paths"][template][method.lower()]
    return found


def security_of(op: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = op.get("security", DOCUMENT["security"])
    return found


def needs_token(op: dict[str, Any]) -> bool:
    return any("accessToken" in requirement for requirement in security_of(op))


def schema_errors(instance: Any, pointer: str) -> list[str]:
    """Every way ``instance`` breaks the document's schema at ``pointer``."""
    validator = Draft202012Validator(
        {"$ref": f"{BASE}#{pointer}"},
        registry=REGISTRY,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(instance)
    ]


def conforms(response: httpx.Response, response_pointer: str) -> Any:
    """Check an answer against a documented response object; answers its parsed body."""
    pointer = _follow(response_pointer)
    documented = _node(pointer)
    for name in documented.get("headers", {}):
        header = _follow(f"{pointer}/headers/{_escape(name)}")
        if name not in response.headers:
            assert not _node(header).get("required"), f"{name} is documented but missing"
            continue
        errors = schema_errors(response.headers[name], f"{header}/schema")
        assert not errors, f"{name}: {errors}"
    content = documented.get("content")
    if not content:
        assert response.content == b"", "an answer documented without a body has one"
        return None
    media = response.headers["content-type"].split(";")[0].strip()
    assert media in content, f"{media} is not documented here ({sorted(content)})"
    if media == "text/plain":
        return response.text
    body = response.json()
    errors = schema_errors(body, f"{pointer}/content/{_escape(media)}/schema")
    assert not errors, f"{response.status_code} {body}: {errors}"
    if media == PROBLEM:
        code = Code(body["code"])
        assert (body["type"], body["title"]) == (code.type_uri, code.info.title)
    return body


def check(response: httpx.Response, method: str, template: str) -> Any:
    """Check that the route documents this status and that the answer fits it."""
    responses = operation(method, template)["responses"]
    status = str(response.status_code)
    assert status in responses, (
        f"{method} {template} answered {status}, which the document does not list: {response.text}"
    )
    pointer = f"/paths/{_escape(template)}/{method.lower()}/responses/{status}"
    return conforms(response, pointer)


def check_component(response: httpx.Response, name: str) -> Any:
    return conforms(response, f"/components/responses/{name}")


def problem_lists() -> Iterator[tuple[str, int, list[str]]]:
    """Each problem response of the document: where, its status, the codes it may carry."""
    places: list[tuple[str, int | None]] = [
        (f"/components/responses/{name}", None) for name in DOCUMENT["components"]["responses"]
    ]
    for (method, path), op in operations():
        for status in op["responses"]:
            place = f"/paths/{_escape(path)}/{method.lower()}/responses/{status}"
            places.append((place, int(status)))
    for place, status in places:
        pointer = _follow(place)
        media = _node(pointer).get("content", {})
        if PROBLEM not in media:
            continue
        schema = media[PROBLEM]["schema"]
        (narrowed,) = [part for part in schema["allOf"] if "properties" in part]
        const = narrowed["properties"]["status"]["const"]
        assert status in (None, const), f"{place} documents status {const}"
        yield place, const, narrowed["properties"]["code"]["enum"]


# ------------------------------------------------------------- the document on its own


def test_the_document_is_valid_openapi_3_1_for_this_release() -> None:
    validate_openapi(DOCUMENT)
    assert DOCUMENT["openapi"].startswith("3.1.")
    assert DOCUMENT["info"]["version"] == core.__version__
    # Every example request body fits the schema it illustrates.
    for (method, path), op in operations():
        for media, content in op.get("requestBody", {}).get("content", {}).items():
            if "example" in content:
                pointer = (
                    f"/paths/{_escape(path)}/{method.lower()}/requestBody/content/"
                    f"{_escape(media)}/schema"
                )
                assert not schema_errors(content["example"], pointer), (method, path)


def _served(app: Starlette) -> set[Operation]:
    served: set[Operation] = set()
    for route in app.routes:
        assert isinstance(route, Route), route
        methods = set(route.methods or ())
        # The document says only the unaudited GET routes also answer HEAD.
        assert ("HEAD" in methods) == (route.path in ("/ready", "/metrics")), route.path
        served |= {(method, route.path) for method in methods - {"HEAD"}}
    return served


def test_the_route_table_and_the_document_agree_both_ways() -> None:
    ctx = _fake_context(FakeBackend())
    documented = {key for key, _ in operations()}
    on_metrics = {key for key, op in operations() if "metrics" in op.get("tags", ())}
    assert _served(create_metrics_app(ctx)) == on_metrics
    assert _served(create_app(ctx)) == documented - on_metrics
    for key, op in operations():
        assert "operationId" in op and op.get("tags"), key


def test_problem_codes_agree_with_the_catalogue() -> None:
    over_http = {code for code in Code if code.status is not None}
    vocabulary = DOCUMENT["components"]["schemas"]["ProblemCode"]["enum"]
    assert len(vocabulary) == len(set(vocabulary))
    assert {Code(text) for text in vocabulary} == over_http

    answered: set[Code] = set()
    for place, status, codes in problem_lists():
        assert codes and len(codes) == len(set(codes)), place
        for text in codes:
            code = Code.parse(text)
            assert code is not None, f"{place}: {text} is no code of core/codes.py"
            assert code.status == status, f"{place}: {text} is {code.status}, not {status}"
            answered.add(code)
    # The codes the document says no route answers really are listed nowhere else, and
    # with them every code the catalogue gives an HTTP status is accounted for.
    not_answered = {Code(text) for text in DOCUMENT["info"]["x-problem-codes-not-answered"]}
    assert not_answered <= over_http
    assert not_answered.isdisjoint(answered)
    assert answered | not_answered == over_http


def test_every_authenticated_route_names_a_policy_action() -> None:
    for key, op in operations():
        action = op.get("x-coordinator-action")
        if not needs_token(op):
            assert action is None, key
            continue
        assert action in ALL_ACTIONS, key
        assert op.get("x-coordinator-operator", False) is (action in DEPLOYMENT_ACTIONS), key
        assert "401" in op["responses"] and "403" in op["responses"], key


# ------------------------------------------------ the shared refusals, with a fake backend

EVERYTHING: Final = "everything"
"""A client whose policy allows every action (an operator of :data:`WORKFLOW`)."""


def _policies() -> dict[str, Policy]:
    policies = dict(POLICIES)
    policies[EVERYTHING] = Policy(EVERYTHING, True, (WORKFLOW,), ALL_ACTIONS)
    for action in ALL_ACTIONS:
        policies[f"only-{action}"] = Policy(f"only-{action}", True, (WORKFLOW,), (action,))
        rest = tuple(other for other in ALL_ACTIONS if other != action)
        policies[f"all-but-{action}"] = Policy(f"all-but-{action}", True, (WORKFLOW,), rest)
    return policies


async def _never_start(source: str, event_id: str, data_json: str) -> StartResult:
    raise AssertionError("no event is verified in these tests")


async def _never_wake(connection: str, review_id: str) -> None:
    raise AssertionError("no completion is accepted in these tests")


def _fake_context(backend: FakeBackend, **options: Any) -> GatewayContext:
    return GatewayContext(
        backend=backend,
        verifier=options.pop("token_verifier", None) or verifier(),
        policies=_policies(),
        completions=CompletionHandler((), _never_wake),
        events=EventHandler((), _never_start),
        **options,
    )


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def fake(backend: FakeBackend) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_app(await primed(_fake_context(backend)))) as client:
        yield client


def _url(template: str) -> str:
    return template.replace("{workflowId}", WORKFLOW).replace("{runId}", RUN_A)


def _example(op: dict[str, Any]) -> Any:
    return op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("example")


async def _send(
    client: httpx.AsyncClient,
    method: str,
    template: str,
    *,
    client_id: str | None,
    content: bytes | None = None,
) -> httpx.Response:
    """The route with its documented example body (or ``content``) as ``client_id``."""
    op = operation(method, template)
    headers = {"Content-Type": "application/json"}
    if client_id is not None:
        headers.update(bearer(mint("alice", client_id)))
    if any(param.get("$ref", "").endswith("/IdempotencyKey") for param in op.get("parameters", [])):
        headers["Idempotency-Key"] = "order-17"
    example = _example(op)
    if content is None and example is not None:
        content = json.dumps(example).encode()
    return await client.request(method, _url(template), content=content, headers=headers)


TOKEN_ROUTES: Final = [key for key, op in operations() if needs_token(op)]
BODY_ROUTES: Final = [key for key, op in operations() if "requestBody" in op]


@pytest.mark.parametrize(("method", "template"), TOKEN_ROUTES)
async def test_no_token_is_the_documented_401(
    fake: httpx.AsyncClient, method: str, template: str
) -> None:
    response = await _send(fake, method, template, client_id=None)
    assert response.status_code == 401
    check(response, method, template)


@pytest.mark.parametrize(("method", "template"), TOKEN_ROUTES)
async def test_the_documented_action_is_the_one_the_policy_must_allow(
    fake: httpx.AsyncClient, method: str, template: str
) -> None:
    action = operation(method, template)["x-coordinator-action"]
    refused = await _send(fake, method, template, client_id=f"all-but-{action}")
    assert refused.status_code == 403, refused.text
    check(refused, method, template)
    allowed = await _send(fake, method, template, client_id=f"only-{action}")
    assert allowed.status_code < 300, allowed.text


@pytest.mark.parametrize(("method", "template"), BODY_ROUTES)
async def test_oversized_and_malformed_bodies_are_documented(
    fake: httpx.AsyncClient, method: str, template: str
) -> None:
    big = await _send(fake, method, template, client_id=EVERYTHING, content=b" " * 65537)
    assert MAX_BODY_BYTES == 65536
    wrong = await _send(fake, method, template, client_id=EVERYTHING, content=b"[]")
    if template == "/v1/review-completions":
        # The credentials are judged before the body is read: without them, 401 for both.
        assert (big.status_code, wrong.status_code) == (401, 401)
    elif template == "/v1/events":
        # The body is read first (413), but a body that cannot be verified is 401.
        assert (big.status_code, wrong.status_code) == (413, 401)
    else:
        assert (big.status_code, wrong.status_code) == (413, 400)
    check(big, method, template)
    check(wrong, method, template)


async def test_the_routers_own_answers_are_documented(fake: httpx.AsyncClient) -> None:
    missing = await fake.get("/v1/nowhere", headers=bearer(mint("alice", EVERYTHING)))
    slash = await fake.get("/v1/runs/")
    metrics_here = await fake.get("/metrics")
    wrong_method = await fake.delete("/v1/runs")
    for response in (missing, slash, metrics_here):
        assert response.status_code == 404
        check_component(response, "NoSuchRoute")
    assert wrong_method.status_code == 405
    check_component(wrong_method, "MethodNotAllowed")
    async with client_for(create_metrics_app(_fake_context(FakeBackend()))) as metrics:
        elsewhere = await metrics.get("/v1/runs")
        exposition = await metrics.get("/metrics")
    assert elsewhere.status_code == 404
    check_component(elsewhere, "NoSuchRoute")
    assert exposition.status_code == 200
    check(exposition, "GET", "/metrics")


async def test_head_is_answered_as_the_document_says(
    fake: httpx.AsyncClient, backend: FakeBackend
) -> None:
    alice = bearer(mint("alice", "intake-portal"))
    head = await fake.head(f"/v1/runs/{RUN_A}", headers=alice)
    anonymous = await fake.head(f"/v1/runs/{RUN_A}")
    ready = await fake.head("/ready")
    for refused in (head, anonymous):
        assert (refused.status_code, refused.content) == (405, b"")
        assert refused.headers["allow"] == "GET"
    assert (ready.status_code, ready.content) == (200, b"")
    # Nothing was acted on, so nothing was audited.
    assert backend.audits == []


async def test_unexpected_and_unavailable_answers_are_documented(
    fake: httpx.AsyncClient, backend: FakeBackend
) -> None:
    alice = bearer(mint("alice", "intake-portal"))
    backend.refusal = RuntimeError("a component broke")
    crashed = await fake.get(f"/v1/runs/{RUN_A}", headers=alice)
    backend.refusal = CoordinatorError(Code.STATE_PAYLOAD_UNAUTHENTIC, "a row was altered")
    no_status = await fake.get(f"/v1/runs/{RUN_A}/inspection", headers=alice)
    backend.refusal = CoordinatorError(Code.SERVICE_UNAVAILABLE, "the database is away")
    away = await fake.get("/v1/runs", headers=alice)
    backend.refusal = None
    backend.audit_refusal = CoordinatorError(Code.AUDIT_RESPONSE_UNAVAILABLE, "disk full")
    unaudited = await fake.get("/v1/operator/doctor", headers=bearer(mint("pat", EVERYTHING)))

    assert [crashed.status_code, no_status.status_code] == [500, 500]
    check(crashed, "GET", "/v1/runs/{runId}")
    check(no_status, "GET", "/v1/runs/{runId}/inspection")
    assert away.status_code == 503
    assert check(away, "GET", "/v1/runs")["code"] == "service.unavailable"
    assert unaudited.status_code == 503
    assert check(unaudited, "GET", "/v1/operator/doctor")["code"] == "audit.response-unavailable"


async def test_a_verifier_without_keys_and_readiness_are_documented() -> None:
    class Down:
        async def fetch(self) -> Any:
            raise JwksUnavailable("the issuer is away")

    backend = FakeBackend()
    ctx = _fake_context(backend, token_verifier=verifier(Down()))
    async with client_for(create_app(ctx)) as client:
        keyless = await client.get("/v1/runs", headers=bearer(mint("alice", "intake-portal")))
        not_ready = await client.get("/ready")
    async with client_for(create_app(await primed(_fake_context(backend)))) as client:
        ready = await client.get("/ready")

    assert keyless.status_code == 503
    assert check(keyless, "GET", "/v1/runs")["code"] == "service.unavailable"
    assert not_ready.status_code == 503
    assert "token-verifier-unavailable" in check(not_ready, "GET", "/ready")["reasons"]
    assert ready.status_code == 200
    check(ready, "GET", "/ready")


# ------------------------------------------------------ real answers from a real deployment

BINDING: Final = "coordinator-v1"
EVENT_SOURCE: Final = "https://intake.example.org/applications"
RETIRED: Final = "retired-portal"


@dataclass
class Stack:
    """The real app over admission, recovery and auditd on a real database."""

    api: httpx.AsyncClient
    metrics: httpx.AsyncClient
    event_key: bytes
    completion_token: str


def _configure(deployment: TestDeployment, audit_dir: Path) -> tuple[bytes, str]:
    event_key, token = b"k" * 48, "completion-token-of-the-review-connection"
    write_secret(deployment.secrets, "intake-event-hmac", event_key)
    write_secret(deployment.secrets, "review-completion-token", token.encode())
    doc = deployment.doc
    doc["deployment"]["auditFile"] = str(audit_dir / "audit.jsonl")
    doc["connections"]["review"] = {
        "type": "casework-review-producer",
        "baseUrl": "https://casework.internal.example.org",
        "profile": "licensing-reviews",
        "producer": "coordinator",
        "authorization": {
            "clientId": "coordinator-review",
            "signingKeyRef": "secret:file/review-client.jwk",
            "scopes": ["review-requests:write", "review-requests:read"],
        },
        "completion": {
            "recipientBinding": BINDING,
            "bearerTokenRef": "secret:file/review-completion-token",
        },
    }
    doc["eventSources"] = {
        "intake": {
            "source": EVENT_SOURCE,
            "signingKeyRef": "secret:file/intake-event-hmac",
            "workflow": WORKFLOW,
        }
    }
    return event_key, token


@pytest.fixture
async def stack(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Stack]:
    deployment = TestDeployment.create(tmp_path / "deployment", database)
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    event_key, token = _configure(deployment, audit_dir)
    checked = deployment.checked()
    await deploy.apply(checked, [])
    sockets = Path(tempfile.mkdtemp(prefix="rco-", dir="/tmp"))
    runtime = socket_runtime(checked, sockets)
    policies = {**_policies(), RETIRED: Policy(RETIRED, False, ("retired-flow",), ("start",))}
    try:
        async with serving(
            auditd=lambda started: serve_auditd(runtime, started),
            admission=lambda started: serve_admission(runtime, started),
            recovery=lambda started: serve_recovery(runtime, started),
        ):
            backend = GrpcBackend(runtime.endpoints)
            producers = AdmissionProducers(runtime.endpoints)
            ctx = GatewayContext(
                backend=backend,
                verifier=verifier(),
                policies=policies,
                completions=CompletionHandler(
                    load_credentials(checked.config, runtime.resolver),
                    producers.review_completion,
                ),
                events=EventHandler(
                    load_sources(checked.config, runtime.resolver), producers.start_from_event
                ),
            )
            await primed(ctx)
            try:
                async with (
                    client_for(create_app(ctx)) as api,
                    client_for(create_metrics_app(ctx)) as metrics,
                ):
                    yield Stack(api, metrics, event_key, token)
            finally:
                await producers.close()
                await backend.close()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
        await drop_deployment(database, deployment.namespace)


ALICE: Final = bearer(mint("alice", "intake-portal"))
CASE_OPERATOR: Final = bearer(mint("olga", "case-operators"))
PLATFORM: Final = bearer(mint("pat", "platform-operators"))
START: Final = "/v1/workflows/{workflowId}/runs"
LIST: Final = ("GET", "/v1/runs")


async def _start(stack: Stack, key: str, run_input: Any, **headers: str) -> httpx.Response:
    return await stack.api.post(
        _url(START),
        json={"input": run_input},
        headers={**ALICE, "Idempotency-Key": key, **headers},
    )


async def _act(
    stack: Stack, action: str, body: dict[str, Any], token: dict[str, str] = PLATFORM
) -> Any:
    template = f"/v1/operator/{action}"
    response = await stack.api.post(template, json=body, headers=token)
    return response.status_code, check(response, "POST", template)


async def _run_act(stack: Stack, run_id: str, action: str) -> Any:
    template = f"/v1/runs/{{runId}}/{action}"
    response = await stack.api.post(
        f"/v1/runs/{run_id}/{action}", json={"reason": "INC-7"}, headers=CASE_OPERATOR
    )
    return response.status_code, check(response, "POST", template)


@pytest.mark.postgres
async def test_runs_and_run_actions_answer_as_documented(stack: Stack) -> None:
    # No dispatcher is served here, so readiness says so, in the documented shape.
    not_ready = await stack.api.get("/ready")
    assert not_ready.status_code == 503
    assert "dispatcher-unavailable" in check(not_ready, "GET", "/ready")["reasons"]

    first = await _start(stack, "k-1", {"subjectRef": "S-1"})
    assert first.status_code == 201
    run_id = check(first, "POST", START)["runId"]
    assert first.headers["location"] == f"/v1/runs/{run_id}"
    again = await _start(stack, "k-1", {"subjectRef": "S-1"})
    assert (again.status_code, check(again, "POST", START)["runId"]) == (200, run_id)
    refusals = {
        "start.conflict": await _start(stack, "k-1", {"subjectRef": "S-2"}),
        "input.invalid": await _start(stack, "k-2", {"subjectRef": 7}),
        "request.invalid": await _start(stack, "k 2", {"subjectRef": "S-3"}),
        "workflow.not-found": await stack.api.post(
            START.replace("{workflowId}", "retired-flow"),
            json={"input": {}},
            headers={**bearer(mint("rita", RETIRED)), "Idempotency-Key": "k-3"},
        ),
    }
    for code, response in refusals.items():
        assert check(response, "POST", START)["code"] == code
    second = await _start(stack, "k-4", {"subjectRef": "S-4"})
    other_id = check(second, "POST", START)["runId"]

    page = check(await stack.api.get("/v1/runs", params={"limit": "1"}, headers=ALICE), *LIST)
    assert isinstance(page["nextCursor"], str)
    rest = check(
        await stack.api.get("/v1/runs", params={"cursor": page["nextCursor"]}, headers=ALICE),
        *LIST,
    )
    assert rest["nextCursor"] is None
    assert {run["runId"] for run in page["runs"] + rest["runs"]} == {run_id, other_id}
    forged = await stack.api.get("/v1/runs", params={"cursor": "not-issued"}, headers=ALICE)
    assert check(forged, *LIST)["code"] == "request.invalid"

    status = await stack.api.get(f"/v1/runs/{run_id}", headers=ALICE)
    assert check(status, "GET", "/v1/runs/{runId}")["state"] == "running"
    inspection = await stack.api.get(f"/v1/runs/{run_id}/inspection", headers=ALICE)
    steps = check(inspection, "GET", "/v1/runs/{runId}/inspection")["steps"]
    assert [step["state"] for step in steps] == ["ready"]
    missing = await stack.api.get(f"/v1/runs/{RUN_MISSING}", headers=ALICE)
    assert check(missing, "GET", "/v1/runs/{runId}")["code"] == "run.not-found"

    assert (await _run_act(stack, run_id, "reconcile"))[1]["code"] == "reconcile.refused"
    assert (await _run_act(stack, run_id, "retry-same"))[1]["code"] == "retry.refused"
    cancelled, answer = await _run_act(stack, run_id, "cancel")
    assert (cancelled, answer["result"], answer["state"]) == (200, "cancelled", "cancelled")
    assert (await _run_act(stack, run_id, "cancel"))[1]["code"] == "cancel.refused"
    listed = await stack.api.get(f"/v1/runs/{run_id}/inspection", headers=CASE_OPERATOR)
    actions = check(listed, "GET", "/v1/runs/{runId}/inspection")["lastOperatorActions"]
    assert [action["kind"] for action in actions] == ["cancel"]

    # A bulk reconcile of the running runs: the other run only, refused as one would be.
    bulk = "/v1/runs/bulk/reconcile"
    body = {"reason": "INC-7", "filter": {"state": "running"}, "limit": 5}
    dry = await stack.api.post(bulk, json={**body, "dryRun": True}, headers=CASE_OPERATOR)
    assert check(dry, "POST", bulk) == {"dryRun": True, "matched": 1, "runIds": [other_id]}
    real = await stack.api.post(bulk, json=body, headers=CASE_OPERATOR)
    assert check(real, "POST", bulk)["results"] == [
        {"runId": other_id, "code": "reconcile.refused"}
    ]

    # Retention erases the cancelled run; its start key then answers run.payload-erased.
    before = datetime.now(UTC).isoformat()
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert (await _act(stack, "retain", {"before": later, "limit": 5}))[0] == 400
    preview = await _act(stack, "retain", {"before": before, "limit": 5, "dryRun": True})
    assert preview[0] == 200 and preview[1]["runIds"] == [run_id]
    assert await _act(stack, "retain", {"before": before, "limit": 5}) == (
        200,
        {"erased": 1, "runIds": [run_id]},
    )
    erased = await _start(stack, "k-1", {"subjectRef": "S-1"})
    assert check(erased, "POST", START)["code"] == "run.payload-erased"
    assert (await _run_act(stack, run_id, "retry-same"))[1]["code"] == "run.payload-erased"


@pytest.mark.postgres
async def test_operator_routes_and_metrics_answer_as_documented(stack: Stack) -> None:
    run_id = check(await _start(stack, "k-1", {"subjectRef": "S-1"}), "POST", START)["runId"]
    doctor = await stack.api.get("/v1/operator/doctor", headers=PLATFORM)
    report = check(doctor, "GET", "/v1/operator/doctor")
    assert (report["holds"], report["mode"]) == (
        {"execution": False, "admission": False},
        "ordinary",
    )

    attest_execution = {
        "recoveryReference": "RESTORE-7",
        "executionHistoryComplete": True,
        "priorDeploymentFenced": True,
    }
    attest_admission = {
        "recoveryReference": "RESTORE-7",
        "admissionHistoryComplete": True,
        "priorDeploymentFenced": True,
    }
    reason = {"reason": "RESTORE-7"}
    found = {
        "before-hold": (await _act(stack, "release-restore-hold", reason))[1]["code"],
        "attest-early": (await _act(stack, "complete-execution-recovery", attest_execution))[1][
            "code"
        ],
    }
    held = await _act(stack, "restore-hold", reason)
    assert held[0] == 200 and held[1]["holds"] == {"execution": True, "admission": True}
    start_held = await _start(stack, "k-2", {"subjectRef": "S-2"})
    found["start-held"] = check(start_held, "POST", START)["code"]
    found["retry-held"] = (await _run_act(stack, run_id, "retry-same"))[1]["code"]
    found["not-attested"] = (await _act(stack, "release-restore-hold", reason))[1]["code"]
    assert (await _act(stack, "complete-execution-recovery", attest_execution))[0] == 200
    found["admission-first"] = (await _act(stack, "release-admission-hold", attest_admission))[1][
        "code"
    ]
    released = await _act(stack, "release-restore-hold", reason)
    assert released[1]["holds"] == {"execution": False, "admission": True}
    opened = await _act(stack, "release-admission-hold", attest_admission)
    assert opened[1]["holds"] == {"execution": False, "admission": False}
    assert found == {
        "before-hold": "restore.hold-required",
        "attest-early": "restore.hold-required",
        "start-held": "admission.held",
        "retry-held": "execution.held",
        "not-attested": "restore.review-required",
        "admission-first": "restore.hold-required",
    }
    exposition = await stack.metrics.get("/metrics")
    assert "coordinator_http_requests_total" in check(exposition, "GET", "/metrics")


@pytest.mark.postgres
async def test_producer_routes_answer_as_documented(stack: Stack) -> None:
    def event(event_id: str, data: Any, **members: Any) -> dict[str, Any]:
        return {
            "specversion": "1.0",
            "id": event_id,
            "source": EVENT_SOURCE,
            "type": "org.example.application.submitted",
            "data": data,
            **members,
        }

    async def post_event(document: dict[str, Any], key: bytes | None = None) -> httpx.Response:
        body = json.dumps(document).encode()
        signature = sign(key or stack.event_key, body, int(time.time()))
        return await stack.api.post(
            "/v1/events",
            content=body,
            headers={"registry-event-signature": signature, "Content-Type": "application/json"},
        )

    created = await post_event(event("evt-1", {"subjectRef": "S-1"}))
    assert created.status_code == 201
    run_id = check(created, "POST", "/v1/events")["runId"]
    redelivered = await post_event(event("evt-1", {"subjectRef": "S-1"}))
    assert (redelivered.status_code, check(redelivered, "POST", "/v1/events")["runId"]) == (
        200,
        run_id,
    )
    refused = {
        "authentication.refused": await post_event(event("evt-2", {}), key=b"x" * 48),
        "request.invalid": await post_event(event("evt-3", {}, specversion="0.3")),
        "input.invalid": await post_event(event("evt-4", {"subjectRef": 4})),
        "start.conflict": await post_event(event("evt-1", {"subjectRef": "S-9"})),
    }
    for code, response in refused.items():
        assert check(response, "POST", "/v1/events")["code"] == code

    async def complete(review_id: str, token: str) -> httpx.Response:
        return await stack.api.post(
            "/v1/review-completions",
            json={"reviewId": review_id},
            headers={"Authorization": f"Bearer {token}", "registry-recipient-binding": BINDING},
        )

    woke = await complete("rv-1", stack.completion_token)
    assert woke.status_code == 202
    check(woke, "POST", "/v1/review-completions")
    # Admission, not the gateway, holds reviewId to visible ASCII.
    spaced = await complete("rv 1", stack.completion_token)
    wrong = await complete("rv-1", "another-token")
    assert check(spaced, "POST", "/v1/review-completions")["code"] == "request.invalid"
    assert check(wrong, "POST", "/v1/review-completions")["code"] == "authentication.refused"
