"""Test doubles for the gateway: access tokens, policies, a fake backend, fake servicers.

Tokens are real: an EC key made here signs RFC 9068 access tokens, and the gateway's real
:class:`gateway.auth.TokenVerifier` checks them against a static JWKS. The fake backend
records every call in order (``log``), so tests can see that the audit record was appended
after the action and before the answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from core.actions import DEPLOYMENT_ACTIONS
from core.codes import Code
from core.config.model import Policy
from core.documents import status_message
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.errors import refusals
from core.runs import StartResult
from gateway.app import create_app
from gateway.auth import StaticJwksSource, TokenVerifier
from gateway.backend import (
    AuditRecord,
    BackendCaller,
    ComponentHealth,
    Document,
    ListQuery,
)
from gateway.policies import RunOwner
from gateway.routes import GatewayContext
from tests.helpers.runtime_files import write_runtime

ISSUER = "https://issuer.example.org"
AUDIENCE = "https://coordinator.example.org"
NOW = 1_800_000_000.0
KID = "gateway-test-1"
WORKFLOW = "approval-notice"

SIGNING_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_KEY = ec.generate_private_key(ec.SECP256R1())

RUN_A = "0b9d4c3e-5f6a-8b7c-9d8e-1f2a3b4c5d6e"
"""A run started by ``alice`` through the intake portal."""
RUN_B = "1c0e5d4f-6a7b-8c8d-ae9f-2a3b4c5d6e7f"
"""A run started by ``bob``."""
RUN_MISSING = "2d1f6e5a-7b8c-8d9e-bfa0-3b4c5d6e7f80"

POLICIES: dict[str, Policy] = {
    "intake-portal": Policy(
        "intake-portal", False, (WORKFLOW,), ("start", "status", "inspect", "cancel")
    ),
    "reader": Policy("reader", False, (WORKFLOW,), ("status",)),
    "case-operators": Policy(
        "case-operators",
        True,
        (WORKFLOW,),
        ("inspect", "status", "retry-same", "cancel", "reconcile"),
    ),
    "platform-operators": Policy("platform-operators", True, None, DEPLOYMENT_ACTIONS),
}


def jwks_document() -> dict[str, Any]:
    jwk = ECAlgorithm.to_jwk(SIGNING_KEY.public_key(), as_dict=True)
    return {"keys": [{**jwk, "kid": KID, "alg": "ES256", "use": "sig"}]}


def gateway_runtime_file(
    directory: Path, document: dict[str, Any], sockets_dir: Path, metrics_port: int
) -> Path:
    """Write runtime file ``document`` for a gateway served in-process: its metrics listener
    on ``metrics_port``, internal sockets in ``sockets_dir``, and this kit's signing key as the
    issuer's JWKS (a secret file, ES256 only)."""
    deployment = document["deployment"]
    deployment["metricsListener"] = {"bind": f"127.0.0.1:{metrics_port}"}
    deployment["internal"] = {"socketDir": str(sockets_dir)}
    deployment["authentication"]["signingKeys"] = {"jwksRef": "secret:file/issuer-jwks.json"}
    deployment["authentication"]["algorithms"] = ["ES256"]
    secrets = directory / "secrets"
    secrets.mkdir(mode=0o700)
    jwks_file = secrets / "issuer-jwks.json"
    jwks_file.write_text(json.dumps(jwks_document()))
    jwks_file.chmod(0o600)
    return write_runtime(directory / "runtime.yaml", document)


def mint(
    sub: str = "alice",
    client_id: str = "intake-portal",
    *,
    key: Any = SIGNING_KEY,
    **claims: Any,
) -> str:
    """A signed access token (ES256, ``typ: at+jwt``) valid at :data:`NOW`."""
    body: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": sub,
        "client_id": client_id,
        "iat": int(NOW) - 5,
        "exp": int(NOW) + 300,
        "jti": f"{sub}-{client_id}",
    }
    body.update(claims)
    return jwt.encode(body, key, algorithm="ES256", headers={"kid": KID, "typ": "at+jwt"})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def verifier(source: Any | None = None) -> TokenVerifier:
    """The real verifier over the static test JWKS, with the clock at :data:`NOW`."""
    return TokenVerifier(
        issuer=ISSUER,
        audience=AUDIENCE,
        algorithms=("ES256",),
        clock_skew_seconds=60,
        source=source or StaticJwksSource(jwks_document()),
        clock=lambda: NOW,
    )


def status_document(run_id: str, state: str = "running") -> Document:
    return {
        "runId": run_id,
        "workflow": {"id": WORKFLOW, "version": "1.0.0", "digest": "sha256:" + "a" * 64},
        "state": state,
        "attention": False,
        "createdAt": "2027-01-15T08:00:00.000Z",
        "updatedAt": "2027-01-15T08:00:00.000Z",
    }


def healthy() -> tuple[ComponentHealth, ...]:
    return tuple(
        ComponentHealth(name, True, True, True, ())
        for name in ("admission", "dispatcher", "recovery", "auditd")
    )


class FakeBackend:
    """Records calls in order; answers from small in-memory tables."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.audits: list[AuditRecord] = []
        self.owners: dict[str, RunOwner] = {
            RUN_A: RunOwner(WORKFLOW, ISSUER, "alice"),
            RUN_B: RunOwner(WORKFLOW, ISSUER, "bob"),
        }
        self.starts: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        self.refusal: BaseException | None = None
        self.audit_refusal: BaseException | None = None
        self.audit_gate: asyncio.Event | None = None
        self.audit_called = asyncio.Event()
        self.health: tuple[ComponentHealth, ...] = healthy()
        self.metric_texts: tuple[str, ...] = ()
        self.listed: list[str] | None = None
        """The run ids :meth:`list` pages through (one run, RUN_A, when unset)."""
        self.run_refusals: dict[str, CoordinatorError] = {}
        """What :meth:`run_action` refuses, by run id."""
        self.verdict_waits: list[float | None] = []

    def _act(self, name: str, detail: Any) -> None:
        self.log.append((name, detail))
        if self.refusal is not None:
            raise self.refusal

    def names(self) -> list[str]:
        return [name for name, _ in self.log]

    async def start(
        self, caller: BackendCaller, workflow_id: str, idempotency_key: str, input_json: str
    ) -> StartResult:
        self._act("start", (caller, workflow_id, idempotency_key, input_json))
        identity = (caller.iss, caller.sub, workflow_id, idempotency_key)
        if identity in self.starts:
            run_id, known_input = self.starts[identity]
            if known_input != input_json:
                raise CoordinatorError(Code.START_CONFLICT, "the key was used with another input")
            return StartResult(False, run_id, status_document(run_id))
        self.starts[identity] = (RUN_A, input_json)
        return StartResult(True, RUN_A, status_document(RUN_A))

    async def status(self, run_id: str) -> Document:
        self._act("status", run_id)
        return status_document(run_id)

    async def inspect(self, run_id: str) -> Document:
        self._act("inspect", run_id)
        return {"runId": run_id, "steps": [], "holds": {}, "operatorActions": []}

    async def list(self, query: ListQuery) -> Document:
        self._act("list", query)
        if self.listed is None:
            return {
                "runs": [status_document(RUN_A)],
                "nextCursor": None,
                "total": 1,
                "totalIsEstimate": False,
            }
        # Pages of the listed ids; the cursor is the position of the next page.
        first = int(query.cursor or 0)
        page = self.listed[first : first + query.limit]
        following = first + len(page)
        return {
            "runs": [status_document(run_id, "held") for run_id in page],
            "nextCursor": str(following) if following < len(self.listed) else None,
            "total": len(self.listed),
            "totalIsEstimate": False,
        }

    async def doctor(self) -> Document:
        self._act("doctor", None)
        return {"activationReady": True, "schemaVersion": 4, "mode": "ordinary"}

    async def run_owner(self, run_id: str) -> RunOwner | None:
        self.log.append(("run_owner", run_id))
        return self.owners.get(run_id)

    async def run_action(
        self,
        caller: BackendCaller,
        run_id: str,
        action: str,
        reason: str,
        verdict_wait: float | None = None,
    ) -> Document:
        self._act("run_action", (caller, run_id, action, reason))
        self.verdict_waits.append(verdict_wait)
        refusal = self.run_refusals.get(run_id)
        if refusal is not None:
            raise refusal
        return {**status_document(run_id), "result": {"action": action}}

    async def operator_action(
        self, caller: BackendCaller, action: str, body: Mapping[str, Any]
    ) -> Document:
        self._act("operator_action", (caller, action, dict(body)))
        return {"action": action, "done": True}

    async def append_audit(self, records: Sequence[AuditRecord]) -> None:
        self.log.append(("audit", tuple(records)))
        self.audit_called.set()
        if self.audit_gate is not None:
            await self.audit_gate.wait()
        if self.audit_refusal is not None:
            raise self.audit_refusal
        self.audits.extend(records)

    async def checks(self) -> tuple[ComponentHealth, ...]:
        return self.health

    async def metrics(self) -> tuple[str, ...]:
        return self.metric_texts


def context(
    backend: FakeBackend | None = None,
    *,
    token_verifier: TokenVerifier | None = None,
    public_url: str | None = None,
) -> GatewayContext:
    return GatewayContext(
        backend=backend or FakeBackend(),
        verifier=token_verifier or verifier(),
        policies=POLICIES,
        public_url=public_url,
    )


def client_for(app: Any) -> httpx.AsyncClient:
    """An httpx client that calls ``app`` in-process; app exceptions become answers."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url="http://gateway.test",
    )


def main_client(ctx: GatewayContext) -> httpx.AsyncClient:
    return client_for(create_app(ctx))


async def primed(ctx: GatewayContext) -> GatewayContext:
    """``ctx`` after its verifier fetched the key set, as the service does at startup."""
    await ctx.verifier.refresh()
    return ctx


# ------------------------------------------------------------------ fake gRPC servicers


class FakeAdmission(pb_grpc.AdmissionServicer):
    """Answers Start with a fixed status document; records requests."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    @refusals
    async def Start(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.requests.append(request)
        if request.workflow_id == "missing":
            raise CoordinatorError(Code.WORKFLOW_NOT_FOUND, "no such workflow")
        return pb.StartReply(
            created=True, run_id=RUN_A, status=status_message(status_document(RUN_A))
        )

    @refusals
    async def StartFromEvent(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise CoordinatorError(Code.AUTHENTICATION_REFUSED, "not in this test")

    @refusals
    async def ReviewCompletion(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise CoordinatorError(Code.AUTHENTICATION_REFUSED, "not in this test")

    @refusals
    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.Health(store_ready=False, activation_ready=True, reasons=["store-unavailable"])

    @refusals
    async def Metrics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.MetricsText(text="# TYPE coordinator_admitted_total counter\n")


class FakeRecovery(pb_grpc.RecoveryServicer):
    """Owner table and documents; ``run.not-found`` for unknown runs."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    @refusals
    async def GetRunOwner(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.run_id == RUN_A:
            return pb.RunOwner(found=True, workflow_id=WORKFLOW, iss=ISSUER, sub="alice")
        return pb.RunOwner(found=False)

    @refusals
    async def Status(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.run_id != RUN_A:
            raise CoordinatorError(Code.RUN_NOT_FOUND, "no such run")
        return status_message(status_document(RUN_A))

    @refusals
    async def Inspect(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.Inspection()  # no run status: a broken component

    @refusals
    async def List(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.requests.append(request)
        return pb.RunList()

    @refusals
    async def Doctor(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.DoctorReport(schema_version=4, state=pb.DoctorReport.State())

    @refusals
    async def RunAction(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.requests.append(request)
        raise CoordinatorError(Code.RECONCILE_UNSUPPORTED, "this product keeps no receipts")

    @refusals
    async def OperatorAction(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.requests.append(request)
        return pb.OperatorActionReply(retain=pb.RetainAnswer(erased=0))

    @refusals
    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.Health(store_ready=True, activation_ready=True, reasons=["Bad Reason!", "x-y"])

    @refusals
    async def Metrics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.MetricsText(
            text='# TYPE coordinator_runs gauge\ncoordinator_runs{state="held"} 2\n'
        )


class FakeAudit(pb_grpc.AuditServicer):
    """Appends to a list, or refuses while ``broken``."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.broken = False

    @refusals
    async def Append(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self.broken:
            raise CoordinatorError(Code.AUDIT_RESPONSE_UNAVAILABLE, "the journal cannot be written")
        self.records.extend(request.records)
        return pb.AppendReply(seqs=list(range(1, len(request.records) + 1)))

    @refusals
    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        reasons = ["audit-unavailable"] if self.broken else []
        return pb.Health(store_ready=True, activation_ready=True, reasons=reasons)

    @refusals
    async def Metrics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.MetricsText(text="coordinator_audit_ready 1\n")
