"""The approval-notice workflow against real PostgreSQL with Casework, Messaging, the issuer
and the coordinator's producer routes all wired in-process.

``review_kit(tmp_path, database)`` applies a namespace holding the example approval-notice
package, with a ``review`` Casework connection (a completion block unless
``completion=False``), the ``notices`` Messaging connection and the ``intake`` event source.
A :class:`~tests.helpers.devstack_kit.HostRouter` carries every request: the dispatcher's
calls and reads go to the stand-ins, and the Casework stand-in's completion events go to the
coordinator's gateway app (the real routes with the real completion and event handlers),
whose hooks reach an in-process admission (:class:`CompletionWaker`, :class:`EventAdmitter`)
on a real admission store. Tests drive a dispatcher with ``run_once``/``drain`` or run its
loop.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from admission.completions import CompletionWaker
from admission.events import EventAdmitter
from admission.start import Admitter
from core.crypto import keyring_from_config
from core.runs import StartResult
from core.runtime import Store
from core.workflow.package import build_package
from devstack.issuer import generate_private_jwk
from devstack.postgres import DatabaseHandle
from devstack.products.casework import CaseworkStandIn, CompletionDestination, TrustedProducer
from devstack.products.common import StandInSettings
from devstack.products.messaging import MessagingStandIn
from gateway.app import create_app
from gateway.auth import StaticJwksSource, TokenVerifier
from gateway.backend import AuditRecord
from gateway.completions import CompletionHandler, load_credentials
from gateway.events import EventHandler, load_sources
from gateway.routes import GatewayContext
from tests.helpers.asgi_http import AsgiHttp
from tests.helpers.base_kit import ISSUER, BaseKit, applied, dev_issuer
from tests.helpers.deployment import (
    TestDeployment,
    drop_deployment,
    migration_connection,
    write_secret,
)
from tests.helpers.devstack_kit import HostRouter, client_for
from tests.helpers.runs import insert_started_run

ROOT = Path(__file__).resolve().parents[2]
CASEWORK = "https://casework.internal.example.org"
MESSAGING = "https://messaging.internal.example.org"
COORDINATOR = "https://coordinator.example.org"
REVIEW_CLIENT = "coordinator-review"
NOTICES_CLIENT = "coordinator-notices"
PROJECT = "licensing-reviews"
PRODUCER = "coordinator"
BINDING = "coordinator-v1"
EVENT_SOURCE = "https://intake.example.org/applications"
WORKFLOW = "approval-notice"
WAIT = "await-decision"
REVIEW_SCOPES = ("review-requests:write", "review-requests:read")
INPUT = {"applicationId": "APP-2041", "applicantRef": "person-17"}


class AuditLog:
    """The part of the gateway backend the producer routes use: the audit journal."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    async def append_audit(self, records: Sequence[AuditRecord]) -> None:
        self.records.extend(records)


class CountingWaker:
    """Admission's completion waker, counting the events that reached it."""

    def __init__(self, waker: CompletionWaker) -> None:
        self.waker = waker
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, connection: str, review_id: str) -> None:
        self.calls.append((connection, review_id))
        await self.waker.wake(connection, review_id)


class CountingStarter:
    """Admission's event starter, counting the events that reached it."""

    def __init__(self, events: EventAdmitter) -> None:
        self.events = events
        self.calls = 0

    async def __call__(self, source_key: str, event_id: str, data_json: str) -> StartResult:
        self.calls += 1
        result = await self.events.start(source_key, event_id, data_json)
        return StartResult(result.created, result.run_id, result.status)


@dataclass
class ReviewKit(BaseKit):
    """Everything a review-wait test needs; see the module docstring."""

    casework: CaseworkStandIn
    messaging: MessagingStandIn
    completion_token: str
    event_key: bytes
    waker: CountingWaker
    starter: CountingStarter
    audits: AuditLog
    coordinator: httpx.AsyncClient

    async def start(self, run_input: dict[str, Any] | None = None) -> str:
        """Admit an approval-notice run; answers its id."""
        return await insert_started_run(self.admission, self.checked, WORKFLOW, run_input or INPUT)

    async def step(self, run_id: str, step_id: str = WAIT) -> asyncpg.Record | None:
        """One step row (the wait's unless named); ``None`` when not reached."""
        return await self.find_step(run_id, step_id)

    async def steps_snapshot(self) -> list[tuple[Any, ...]]:
        """Every step's scheduling columns, to show that nothing changed."""
        rows = await self.db.fetch(
            f"SELECT run_id, step_id, state, due_at, next_check_at, updated_at, checks "
            f"FROM {self.ns}.step ORDER BY run_id, seq"
        )
        return [tuple(row) for row in rows]

    async def review_id(self, run_id: str) -> str:
        """The review the run asked Casework for (its kept ``reviewId``)."""
        kept = await self.payload(run_id, "request-review", "output")
        assert kept is not None, "the review request was not accepted yet"
        return str(kept["reviewId"])

    async def decide(self, review_id: str, outcome: str = "approved") -> None:
        """Record a reviewer's decision in the Casework stand-in (its dev route)."""
        answer = await self.casework.http.post(
            f"{CASEWORK}/dev/projects/{PROJECT}/review-requests/{review_id}/decision",
            json={"outcome": outcome},
        )
        assert answer.status_code == 200, answer.text

    def reads(self) -> list[httpx.Request]:
        """Every result read the coordinator sent to Casework."""
        return [
            r
            for r in self.router.requests
            if r.url.host == "casework.internal.example.org"
            and r.method == "GET"
            and r.url.path.startswith("/v1/")
        ]

    def notices(self) -> list[dict[str, Any]]:
        """Every notice Messaging accepted, as answered (with its messageId)."""
        return [
            json.loads(r.content)
            for r in self.router.requests
            if r.url.host == "messaging.internal.example.org" and r.method == "POST"
        ]

    async def complete(
        self, review_id: str, *, token: str | None = None, binding: str | None = BINDING
    ) -> httpx.Response:
        """POST a completion event to the coordinator's gateway."""
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if binding is not None:
            headers["registry-recipient-binding"] = binding
        return await self.coordinator.post(
            "/v1/review-completions", json={"reviewId": review_id}, headers=headers
        )


def _document(deployment: TestDeployment, completion: bool, result_check_seconds: int) -> None:
    doc = deployment.doc
    review: dict[str, Any] = {
        "type": "casework-review-producer",
        "baseUrl": CASEWORK,
        "profile": PROJECT,
        "producer": PRODUCER,
        "authorization": {
            "clientId": REVIEW_CLIENT,
            "signingKeyRef": "secret:file/review-client.jwk",
            "scopes": list(REVIEW_SCOPES),
        },
        "resultCheckSeconds": result_check_seconds,
    }
    if completion:
        review["completion"] = {
            "recipientBinding": BINDING,
            "bearerTokenRef": "secret:file/review-completion-token",
        }
    doc["connections"]["review"] = review
    doc["connections"]["notices"]["authorization"]["scopes"] = ["messages:send", "receipts:read"]
    doc["eventSources"] = {
        "intake": {
            "source": EVENT_SOURCE,
            "signingKeyRef": "secret:file/intake-event-hmac",
            "workflow": WORKFLOW,
        }
    }


@asynccontextmanager
async def review_kit(
    tmp_path: Path,
    database: DatabaseHandle,
    *,
    completion: bool = True,
    result_check_seconds: int = 86_400,
) -> AsyncIterator[ReviewKit]:
    """An applied approval-notice deployment with everything around it (module docstring)."""
    deployment = TestDeployment.create(tmp_path, database, workflows=())
    built = build_package(ROOT / "examples" / WORKFLOW, deployment.packages_dir)
    deployment.doc["deployment"]["packages"] = [
        {"root": str(built.path), "expectedDigest": built.digest}
    ]
    _document(deployment, completion, result_check_seconds)
    review_jwk, notices_jwk = generate_private_jwk("ES256"), generate_private_jwk("ES256")
    write_secret(deployment.secrets, "review-client.jwk", json.dumps(review_jwk).encode())
    write_secret(deployment.secrets, "notices-client.jwk", json.dumps(notices_jwk).encode())
    token = secrets.token_hex(32)
    write_secret(deployment.secrets, "review-completion-token", token.encode())
    event_key = secrets.token_bytes(32)
    write_secret(deployment.secrets, "intake-event-hmac", event_key)
    checked, resolver, runtime = await applied(deployment)

    router = HostRouter()
    http = AsgiHttp(router)
    issuer = dev_issuer(
        tmp_path,
        [
            client_for(
                REVIEW_CLIENT, review_jwk, {"review-requests:write", "review-requests:read"}
            ),
            client_for(NOTICES_CLIENT, notices_jwk, {"messages:send", "receipts:read"}),
        ],
    )
    destination = CompletionDestination(
        url=f"{COORDINATOR}/v1/review-completions", token=token, recipient_binding=BINDING
    )
    stand_in_http = httpx.AsyncClient(transport=router)
    casework = CaseworkStandIn(
        StandInSettings(
            base_url=CASEWORK, issuer=ISSUER, allowed_clients=frozenset({REVIEW_CLIENT})
        ),
        http=stand_in_http,
        trusted_producers={
            PRODUCER: TrustedProducer(
                client_id=REVIEW_CLIENT, completion=destination if completion else None
            )
        },
    )
    messaging = MessagingStandIn(
        StandInSettings(
            base_url=MESSAGING, issuer=ISSUER, allowed_clients=frozenset({NOTICES_CLIENT})
        ),
        http=stand_in_http,
    )

    admission = Store(runtime, "admission")
    await admission.open()
    await admission.verify()
    admitter = Admitter.from_runtime(runtime, admission)
    waker = CountingWaker(CompletionWaker.from_runtime(runtime, admission))
    starter = CountingStarter(EventAdmitter.from_admitter(admitter))
    audits = AuditLog()
    verifier = TokenVerifier(
        issuer=ISSUER,
        audience=COORDINATOR,
        algorithms=("ES256",),
        clock_skew_seconds=60,
        source=StaticJwksSource({"keys": []}),
    )
    ctx = GatewayContext(
        backend=audits,  # type: ignore[arg-type]  # the producer routes only audit
        verifier=verifier,
        policies={},
        completions=CompletionHandler(load_credentials(checked.config, resolver), waker),
        events=EventHandler(load_sources(checked.config, resolver), starter),
    )
    router.add(ISSUER, issuer.app)
    router.add(CASEWORK, casework)
    router.add(MESSAGING, messaging)
    router.add(COORDINATOR, create_app(ctx))
    coordinator = httpx.AsyncClient(transport=router, base_url=COORDINATOR)
    db = await migration_connection(database)
    kit = ReviewKit(
        deployment=deployment,
        checked=checked,
        runtime=runtime,
        admission=admission,
        db=db,
        router=router,
        http=http,
        keyring=keyring_from_config(checked.config, resolver),
        casework=casework,
        messaging=messaging,
        completion_token=token,
        event_key=event_key,
        waker=waker,
        starter=starter,
        audits=audits,
        coordinator=coordinator,
    )
    try:
        yield kit
    finally:
        await casework.aclose()
        await messaging.aclose()
        await kit.close()
        await coordinator.aclose()
        await stand_in_http.aclose()
        await drop_deployment(database, deployment.namespace)
