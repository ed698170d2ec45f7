"""Requests that answered 500 from outside, each now refused the way the contract says.

Every request goes through the real gateway app, the real gRPC channel and the real
refusal carrier (``core/rpc/errors.py``); the components behind it are the fakes of
:mod:`tests.helpers.gateway_kit`, except for the many-errors start, which reaches the real
admission component on PostgreSQL:

- a start input with more schema errors than the carrier's trailing metadata can hold is
  422 ``input.invalid`` with the first errors and ``errorsOmitted``, the count of the rest;
- a number beyond the double range or a lone surrogate anywhere in a JSON body is 400
  ``request.invalid`` naming the JSON pointer, never the value;
- a validly signed access token whose ``exp``, ``nbf`` or ``iat`` no double can hold (or
  whose claims are otherwise unusable) is 401 ``authentication.refused``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from jwt.api_jws import PyJWS

from admission.service import serve as serve_admission
from core.codes import Code
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.errors import (
    CODE_KEY,
    DETAIL_KEY,
    EXTRA_KEY,
    MAX_CARRIED_ERRORS,
    rebuild,
    refusals,
)
from core.rpc.transport import Endpoints, server, unix_endpoints
from devstack.postgres import DatabaseHandle
from gateway.app import create_app
from gateway.backend import GrpcBackend
from gateway.completions import AdmissionProducers, CompletionCredential, CompletionHandler
from gateway.events import EventHandler, EventSourceKey, sign
from gateway.routes import GatewayContext
from tests.helpers.gateway_kit import (
    AUDIENCE,
    ISSUER,
    KID,
    NOW,
    POLICIES,
    RUN_A,
    SIGNING_KEY,
    WORKFLOW,
    FakeAdmission,
    FakeAudit,
    FakeRecovery,
    bearer,
    client_for,
    mint,
    verifier,
)
from tests.helpers.serving import served, serving

EVENT_KEY = bytes(range(32))
EVENT_SOURCE = EventSourceKey(name="intake", source="urn:intake", key=EVENT_KEY)
COMPLETION = CompletionCredential(connection="review", binding=b"binding-1", token=b"token-1")


@pytest.fixture
def sockets() -> Iterator[Path]:
    # Socket paths must stay short: a short folder under /tmp, not pytest's tmp_path.
    folder = Path(tempfile.mkdtemp(prefix="rr-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Gateway:
    """The gateway app over gRPC, with the fake components it reaches."""

    client: httpx.AsyncClient
    audit: FakeAudit


@contextlib.asynccontextmanager
async def components(endpoints: Endpoints, **servicers: Any) -> AsyncIterator[None]:
    """Serve each servicer (by component name) on its socket for the length of the block."""
    adders: dict[str, Callable[[Any, grpc.aio.Server], None]] = {
        "admission": pb_grpc.add_AdmissionServicer_to_server,
        "recovery": pb_grpc.add_RecoveryServicer_to_server,
        "auditd": pb_grpc.add_AuditServicer_to_server,
    }
    started: list[grpc.aio.Server] = []
    try:
        for name, servicer in servicers.items():
            srv = server(endpoints, name)
            adders[name](servicer, srv)
            await srv.start()
            started.append(srv)
        yield
    finally:
        for srv in started:
            await srv.stop(None)


@contextlib.asynccontextmanager
async def gateway(endpoints: Endpoints) -> AsyncIterator[Gateway]:
    """The gateway app as the service builds it: GrpcBackend, producer routes over gRPC."""
    backend = GrpcBackend(endpoints, timeout=5.0)
    producers = AdmissionProducers(endpoints, timeout=5.0)
    ctx = GatewayContext(
        backend=backend,
        verifier=verifier(),
        policies=POLICIES,
        completions=CompletionHandler((COMPLETION,), producers.review_completion),
        events=EventHandler((EVENT_SOURCE,), producers.start_from_event, now=lambda: NOW),
    )
    await ctx.verifier.refresh()
    audit = FakeAudit()
    try:
        async with components(endpoints, auditd=audit), client_for(create_app(ctx)) as client:
            yield Gateway(client, audit)
    finally:
        await producers.close()
        await backend.close()


@pytest.fixture
async def fakes(sockets: Path) -> AsyncIterator[Gateway]:
    endpoints = unix_endpoints(sockets)
    async with (
        components(endpoints, admission=FakeAdmission(), recovery=FakeRecovery()),
        gateway(endpoints) as made,
    ):
        yield made


def problem(response: httpx.Response, status: int, code: Code) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    document: dict[str, Any] = response.json()
    assert document["code"] == code.value
    return document


# ------------------------------------------------------- 1. many errors across the carrier


def extra_fields(count: int, name: str = "extra") -> dict[str, Any]:
    return {f"{name}-{number:04d}": 1 for number in range(count)}


def start_body(value: dict[str, Any]) -> dict[str, Any]:
    return {"input": value}


async def start(gw: Gateway, body: dict[str, Any] | str, key: str = "k-1") -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return await gw.client.post(
        f"/v1/workflows/{WORKFLOW}/runs",
        content=content.encode(),
        headers={**bearer(mint()), "Idempotency-Key": key, "Content-Type": "application/json"},
    )


def bounded(document: dict[str, Any], found: int) -> list[dict[str, Any]]:
    """The carried ``errors``: the first ones found, and ``errorsOmitted`` counting the rest."""
    errors: list[dict[str, Any]] = document["errors"]
    assert len(errors) <= MAX_CARRIED_ERRORS
    assert document.get("errorsOmitted", 0) == found - len(errors)
    assert all(set(entry) == {"pointer", "reason"} for entry in errors)
    return errors


@pytest.mark.postgres
async def test_sixty_schema_errors_cross_into_a_problem_with_a_count_of_the_rest(
    tmp_path: Path, database: DatabaseHandle
) -> None:
    async with served(tmp_path, database, components=()) as env:
        runtime = env.runtime
        async with (
            serving(admission=lambda started: serve_admission(runtime, started)),
            gateway(runtime.endpoints) as gw,
        ):
            answer = await start(gw, start_body({"subjectRef": "S-1", **extra_fields(60)}))
            # 2,000 unknown members still fit in a 64 KiB body.
            many = await start(gw, start_body(extra_fields(2000, "x")), key="k-2")

    document = problem(answer, 422, Code.INPUT_INVALID)
    errors = bounded(document, 60)
    assert len(errors) == MAX_CARRIED_ERRORS
    assert [entry["pointer"] for entry in errors] == [
        f"/extra-{number:04d}" for number in range(MAX_CARRIED_ERRORS)
    ]
    assert "(and 59 more)" in document["detail"]
    # The subject is required and missing, then 2,000 members are not allowed.
    bounded(problem(many, 422, Code.INPUT_INVALID), 2001)
    assert [(r.action, r.outcome) for r in gw.audit.records] == [
        ("start", "invalid"),
        ("start", "invalid"),
    ]


class ManyErrorsAdmission(FakeAdmission):
    """Refuses every start with the errors it is given, as admission's validator would,
    under a detail that names the first pointer."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__()
        self.errors = errors

    @refusals
    async def Start(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        first = self.errors[0]
        raise CoordinatorError(
            Code.INPUT_INVALID,
            f"input{first['pointer']}: {first['reason']}",
            {"errors": self.errors},
        )


@pytest.mark.parametrize(
    ("errors", "carried"),
    [
        # One pointer longer than the whole budget: none carried, all counted.
        ([{"pointer": "/" + "k" * 20_000, "reason": "is not an allowed field"}], 0),
        # Long pointers: fewer than the count limit fit, the rest are counted.
        ([{"pointer": "/" + "k" * 1000 + str(n), "reason": "r"} for n in range(10)], 3),
        # As many entries as the count allows, each long enough that they just fit.
        ([{"pointer": "/" + "k" * 170 + f"{n:02d}", "reason": "r"} for n in range(30)], 20),
        # Member names outside printable ASCII travel escaped and arrive as sent.
        ([{"pointer": "/ключ\x7f\x00", "reason": "is not an allowed field"}], 1),
    ],
)
async def test_errors_larger_than_the_carrier_are_bounded_not_cut(
    sockets: Path, errors: list[dict[str, str]], carried: int
) -> None:
    endpoints = unix_endpoints(sockets)
    async with (
        components(endpoints, admission=ManyErrorsAdmission(errors), recovery=FakeRecovery()),
        gateway(endpoints) as gw,
    ):
        answer = await start(gw, start_body({"subjectRef": "S-1"}))

    document = problem(answer, 422, Code.INPUT_INVALID)
    assert bounded(document, len(errors)) == errors[:carried]


def failed_call(trailing: tuple[tuple[str, str], ...]) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*trailing),
        details="input.invalid",
    )


def test_unreadable_extra_members_keep_the_code_and_detail() -> None:
    # What a peer of the version before this carrier sent: the JSON cut at 2,000 characters.
    cut = json.dumps({"errors": [{"pointer": "/a", "reason": "r"}] * 60})[:2000]
    error = rebuild(
        failed_call(((CODE_KEY, "input.invalid"), (DETAIL_KEY, "input/a: r"), (EXTRA_KEY, cut))),
        "admission",
    )
    assert (error.code, error.detail, error.extra) == (Code.INPUT_INVALID, "input/a: r", {})


# ------------------------------------------- 2. numbers beyond a double, lone surrogates

UNKEPT_INPUTS = [
    ('{"subjectRef": "S-1", "amount": 1e999}', "/input/amount"),
    ('{"subjectRef": "S-1", "amount": -1e999}', "/input/amount"),
    ('{"subjectRef": "S-1", "list": [1, {"deep": 1e400}]}', "/input/list/1/deep"),
    ('{"subjectRef": "S-1", "a/b~c": 1e400}', "/input/a~1b~0c"),
    ('{"subjectRef": "\\ud800"}', "/input/subjectRef"),
    ('{"subjectRef": "S-\\udfff-1"}', "/input/subjectRef"),
    ('{"subjectRef": "S-1", "\\ud800": 1}', "/input"),
    ('{"subjectRef": "S-1", "list": ["ok", "\\udc00"]}', "/input/list/1"),
]


def refused_at(response: httpx.Response, pointer: str, *values: str) -> None:
    document = problem(response, 400, Code.REQUEST_INVALID)
    assert document["detail"].startswith(f"{pointer}: "), document["detail"]
    for value in ("1e999", "1e400", "inf", "Infinity", "\\ud", "\\udc", *values):
        assert value not in document["detail"], document["detail"]


@pytest.mark.parametrize(("text", "pointer"), UNKEPT_INPUTS)
async def test_a_start_input_with_an_unkept_value_is_400(
    fakes: Gateway, text: str, pointer: str
) -> None:
    answer = await start(fakes, '{"input": ' + text + "}")
    refused_at(answer, pointer)
    assert [(r.action, r.outcome) for r in fakes.audit.records] == [("start", "invalid")]


def event_body(data: str, event_id: str = '"evt-1"') -> bytes:
    text = (
        '{"specversion": "1.0", "id": ' + event_id + ', "source": "urn:intake", '
        '"type": "org.example.submitted", "data": ' + data + "}"
    )
    return text.encode("utf-8")


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        (event_body('{"amount": 1e999}'), "/data/amount"),
        (event_body("[1e400, 1, -1e999]"), "/data/0"),
        (event_body('{"name": "\\ud800"}'), "/data/name"),
        (event_body("{}", event_id='"evt-\\udbff"'), "/id"),
    ],
)
async def test_a_signed_event_with_an_unkept_value_is_400(
    fakes: Gateway, body: bytes, pointer: str
) -> None:
    answer = await fakes.client.post(
        "/v1/events",
        content=body,
        headers={"registry-event-signature": sign(EVENT_KEY, body, int(NOW))},
    )
    refused_at(answer, pointer)
    records = [(r.action, r.outcome, r.principal_sub) for r in fakes.audit.records]
    assert records == [("event-start", "invalid", "urn:intake")]


async def test_an_unsigned_event_with_an_unkept_value_is_still_401(fakes: Gateway) -> None:
    body = event_body('{"amount": 1e999}')
    answer = await fakes.client.post(
        "/v1/events", content=body, headers={"registry-event-signature": sign(bytes(32), body, 1)}
    )
    problem(answer, 401, Code.AUTHENTICATION_REFUSED)
    assert fakes.audit.records == []


@pytest.mark.parametrize(
    ("text", "pointer"),
    [('{"reviewId": "\\ud800"}', "/reviewId"), ('{"reviewId": "r-1", "at": 1e999}', "/at")],
)
async def test_a_review_completion_with_an_unkept_value_is_400(
    fakes: Gateway, text: str, pointer: str
) -> None:
    answer = await fakes.client.post(
        "/v1/review-completions",
        content=text.encode(),
        headers={"Authorization": "Bearer token-1", "registry-recipient-binding": "binding-1"},
    )
    refused_at(answer, pointer)
    assert [(r.action, r.outcome) for r in fakes.audit.records] == [
        ("review-completion", "invalid")
    ]


@pytest.mark.parametrize(
    ("path", "client_id", "text", "pointer"),
    [
        (f"/v1/runs/{RUN_A}/cancel", "case-operators", '{"reason": 1e999}', "/reason"),
        (f"/v1/runs/{RUN_A}/reconcile", "case-operators", '{"reason": "\\ud800"}', "/reason"),
        ("/v1/operator/restore-hold", "platform-operators", '{"reason": "\\udfff"}', "/reason"),
        (
            "/v1/operator/retain",
            "platform-operators",
            '{"before": "2027-01-01T00:00:00Z", "limit": 1e400}',
            "/limit",
        ),
        (
            "/v1/operator/release-admission-hold",
            "platform-operators",
            '{"recoveryReference": "inc-1", "admissionHistoryComplete": true, '
            '"priorDeploymentFenced": -1e999}',
            "/priorDeploymentFenced",
        ),
    ],
)
async def test_an_action_body_with_an_unkept_value_is_400(
    fakes: Gateway, path: str, client_id: str, text: str, pointer: str
) -> None:
    answer = await fakes.client.post(
        path,
        content=text.encode(),
        headers={**bearer(mint("ops", client_id)), "Content-Type": "application/json"},
    )
    refused_at(answer, pointer)
    assert [r.outcome for r in fakes.audit.records] == ["invalid"]


# ----------------------------------------------------- 3. claims no double can hold


def signed(payload: bytes) -> str:
    """A token over exactly ``payload``, signed with the issuer's key."""
    return PyJWS().encode(
        payload, SIGNING_KEY, algorithm="ES256", headers={"kid": KID, "typ": "at+jwt"}
    )


def claims_text(**changes: str) -> bytes:
    """The claims of a token good at NOW, each member given as JSON text."""
    members = {
        "iss": json.dumps(ISSUER),
        "aud": json.dumps(AUDIENCE),
        "sub": '"alice"',
        "client_id": '"intake-portal"',
        "iat": str(int(NOW) - 5),
        "exp": str(int(NOW) + 300),
        **changes,
    }
    return ("{" + ",".join(f'"{name}":{text}' for name, text in members.items()) + "}").encode()


HUGE = "9" * 400

UNUSABLE_CLAIMS = {
    "exp-400-digits": claims_text(exp=HUGE),
    "exp-negative-400-digits": claims_text(exp="-" + HUGE),
    "iat-400-digits": claims_text(iat=HUGE),
    "nbf-400-digits": claims_text(nbf=HUGE),
    "nbf-negative-400-digits": claims_text(nbf="-" + HUGE),
    "exp-beyond-a-double": claims_text(exp="1e999"),
    "sub-lone-surrogate": claims_text(sub='"\\ud800"'),
    "client-id-lone-surrogate": claims_text(client_id='"intake-\\udc00"'),
    "claims-nested-past-the-parser": claims_text(x="[" * 2000 + "]" * 2000),
}


@pytest.mark.parametrize("payload", UNUSABLE_CLAIMS.values(), ids=list(UNUSABLE_CLAIMS))
async def test_a_signed_token_with_unusable_claims_is_401(fakes: Gateway, payload: bytes) -> None:
    token = signed(payload)
    answer = await fakes.client.get(f"/v1/runs/{RUN_A}", headers=bearer(token))
    problem(answer, 401, Code.AUTHENTICATION_REFUSED)
    assert answer.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert token not in answer.text and HUGE not in answer.text
    assert fakes.audit.records == []


async def test_the_same_claims_with_ordinary_numbers_are_accepted(fakes: Gateway) -> None:
    # The claims builder itself makes a usable token: the refusals above are the values'.
    answer = await fakes.client.get(f"/v1/runs/{RUN_A}", headers=bearer(signed(claims_text())))
    assert answer.status_code == 200, answer.text
