"""A deployment with the dispatcher's test workflows, a development issuer and a Messaging
stand-in wired in-process, for the dispatcher's integration tests.

``dispatch_kit(tmp_path, database)`` applies a fresh namespace holding every workflow of
:data:`WORKFLOWS`, opens an admission store (to insert runs the way admission does) and a
migration connection (to inspect and force state), and routes the connection's base URL
and the issuer through a :class:`HostRouter`. ``kit.dispatcher()`` makes a dispatcher with
its own store; tests drive it with ``run_once``/``drain`` or run its loop as a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml

from core import deploy
from core.config.model import CheckedDeployment
from core.crypto import Keyring, keyring_from_config
from core.derive import command_key
from core.keys import resolver_for
from core.rpc.transport import Endpoints
from core.runtime import Runtime, Store
from core.workflow.package import MANIFEST, SOURCE, build_manifest, digest_of
from devstack.issuer import DevIssuer, IssuerState, generate_private_jwk
from devstack.postgres import DatabaseHandle
from devstack.products.common import StandInSettings
from devstack.products.messaging import MessagingStandIn
from dispatcher.context import DispatchSettings, open_json
from dispatcher.engine import Dispatcher, product_client
from tests.helpers.deployment import (
    TestDeployment,
    drop_deployment,
    migration_connection,
    write_secret,
)
from tests.helpers.devstack_kit import HostRouter, client_for
from tests.helpers.runs import insert_started_run

ISSUER = "https://issuer.example.org"
MESSAGING = "https://messaging.internal.example.org"
CLIENT = "coordinator-notices"
FORMAT = "registry-coordinator/workflow/v1"

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "applicantRef": {"type": "string", "maxLength": 64},
        "optionalRef": {"type": "string", "maxLength": 64},
        "kind": {"type": "string"},
        "when": {"type": "string", "format": "date-time"},
    },
}


def _send(recipient: str = "${input.applicantRef}") -> dict[str, Any]:
    return {
        "connection": "notices",
        "operation": "send-notice",
        "input": {
            "template": "test-notice",
            "recipientRef": recipient,
            "parameters": {"run": "${run.id}"},
        },
        "output": {"messageId": "${response.messageId}"},
        "deadlineSeconds": 60,
    }


def _workflow(workflow_id: str, outcomes: list[str], start: str, steps: dict[str, Any]) -> bytes:
    uses_notices = any("call" in body for body in steps.values())
    document = {
        "format": FORMAT,
        "id": workflow_id,
        "version": "1.0.0",
        "description": "A dispatcher test workflow.",
        "input": INPUT_SCHEMA,
        "connections": {"notices": "messaging"} if uses_notices else {},
        "outcomes": outcomes,
        "start": start,
        "steps": steps,
    }
    return yaml.safe_dump(document, sort_keys=False).encode()


WORKFLOWS: dict[str, bytes] = {
    # call → finish
    "notice": _workflow(
        "notice",
        ["sent"],
        "send",
        {"send": {"call": _send(), "next": "sent"}, "sent": {"finish": {"outcome": "sent"}}},
    ),
    # call with onRefused
    "notice-refusable": _workflow(
        "notice-refusable",
        ["sent", "turned-down"],
        "send",
        {
            "send": {"call": _send(), "next": "sent", "onRefused": "turned-down"},
            "sent": {"finish": {"outcome": "sent"}},
            "turned-down": {"finish": {"outcome": "turned-down"}},
        },
    ),
    # the recipient comes from an optional input field
    "notice-optional": _workflow(
        "notice-optional",
        ["sent"],
        "send",
        {
            "send": {"call": _send("${input.optionalRef}"), "next": "sent"},
            "sent": {"finish": {"outcome": "sent"}},
        },
    ),
    # call, then a choice on the value it kept
    "notice-checked": _workflow(
        "notice-checked",
        ["kept", "lost"],
        "send",
        {
            "send": {"call": _send(), "next": "check"},
            "check": {
                "choose": [{"when": {"exists": "${steps.send.messageId}"}, "next": "kept"}],
                "otherwise": "lost",
            },
            "kept": {"finish": {"outcome": "kept"}},
            "lost": {"finish": {"outcome": "lost"}},
        },
    ),
    "route": _workflow(
        "route",
        ["a", "b-or-c", "other"],
        "decide",
        {
            "decide": {
                "choose": [
                    {"when": {"equals": ["${input.kind}", "a"]}, "next": "went-a"},
                    {"when": {"in": ["${input.kind}", ["b", "c"]]}, "next": "went-bc"},
                ],
                "otherwise": "went-other",
            },
            "went-a": {"finish": {"outcome": "a"}},
            "went-bc": {"finish": {"outcome": "b-or-c"}},
            "went-other": {"finish": {"outcome": "other"}},
        },
    ),
    "pause": _workflow(
        "pause",
        ["woke"],
        "nap",
        {
            "nap": {"wait-until": {"afterSeconds": 3600}, "next": "woke"},
            "woke": {"finish": {"outcome": "woke"}},
        },
    ),
    "pause-at": _workflow(
        "pause-at",
        ["woke"],
        "nap",
        {
            "nap": {"wait-until": {"at": "${input.when}"}, "next": "woke"},
            "woke": {"finish": {"outcome": "woke"}},
        },
    ),
}


def write_package(directory: Path, source: bytes) -> tuple[Path, str]:
    """Write a package of ``source`` under ``directory``; answers its root and digest."""
    document = yaml.safe_load(source)
    workflow_id, version = document["id"], document["version"]
    manifest = build_manifest(workflow_id, version, document["connections"], source)
    root = directory / f"{workflow_id}-{version}"
    root.mkdir(parents=True)
    (root / SOURCE).write_bytes(source)
    (root / MANIFEST).write_bytes(manifest)
    return root, digest_of(manifest)


class ScriptedProduct:
    """A product that answers from a script: one (status, body) per request, the last one
    repeated. It records every request (method, path, headers, body)."""

    def __init__(self, *answers: tuple[int, bytes | dict[str, Any]]) -> None:
        self.answers = deque(answers)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append(
            {
                "method": scope["method"],
                "path": scope["path"],
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "body": body,
            }
        )
        status, content = self.answers.popleft() if len(self.answers) > 1 else self.answers[0]
        raw = content if isinstance(content, bytes) else json.dumps(content).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": raw})


@dataclass
class DispatchKit:
    """Everything a dispatcher test needs; see the module docstring."""

    deployment: TestDeployment
    checked: CheckedDeployment
    runtime: Runtime
    admission: Store
    db: asyncpg.Connection
    router: HostRouter
    issuer: DevIssuer
    messaging: MessagingStandIn
    http: httpx.AsyncClient
    keyring: Keyring
    admission_key: bytes
    stores: list[Store] = field(default_factory=list)

    @property
    def ns(self) -> str:
        """The quoted namespace, for test SQL."""
        return f'"{self.deployment.namespace}"'

    async def dispatcher(
        self, settings: DispatchSettings | None = None, owner: str | None = None
    ) -> Dispatcher:
        """A dispatcher with its own verified store and this kit's HTTP routing."""
        store = Store(self.runtime, "dispatcher")
        self.stores.append(store)
        await store.open()
        await store.verify()
        return Dispatcher.from_store(store, self.http, settings=settings, owner=owner)

    async def start(self, workflow_id: str, run_input: dict[str, Any]) -> str:
        """Admit a run; answers its id."""
        return await insert_started_run(self.admission, self.checked, workflow_id, run_input)

    async def run(self, run_id: str) -> asyncpg.Record:
        """The run's row."""
        row = await self.db.fetchrow(f"SELECT * FROM {self.ns}.run WHERE id = $1", run_id)
        assert row is not None
        return row

    async def step(self, run_id: str, step_id: str) -> asyncpg.Record:
        """One step row."""
        row = await self.db.fetchrow(
            f"SELECT * FROM {self.ns}.step WHERE run_id = $1 AND step_id = $2", run_id, step_id
        )
        assert row is not None
        return row

    async def step_ids(self, run_id: str) -> list[str]:
        """The steps the run reached, in order."""
        rows = await self.db.fetch(
            f"SELECT step_id FROM {self.ns}.step WHERE run_id = $1 ORDER BY seq", run_id
        )
        return [row["step_id"] for row in rows]

    async def payload(self, run_id: str, step_id: str, purpose: str) -> Any:
        """A step's payload, decrypted; ``None`` when there is none."""
        row = await self.db.fetchrow(
            f"SELECT * FROM {self.ns}.payload WHERE run_id = $1 AND step_id = $2 AND purpose = $3",
            run_id,
            step_id,
            purpose,
        )
        if row is None:
            return None
        return open_json(self.keyring, self.deployment.namespace, run_id, purpose, row)

    def key(self, run_id: str, step_id: str = "send") -> str:
        """The command key of a step."""
        return command_key(self.admission_key, run_id, step_id)

    async def stats(self) -> dict[str, Any]:
        """The Messaging stand-in's ``/dev/stats``."""
        answer = await self.http.get(f"{MESSAGING}/dev/stats")
        document: dict[str, Any] = answer.json()
        return document

    async def fault(self, **body: Any) -> None:
        """Inject a Messaging stand-in fault."""
        answer = await self.http.post(f"{MESSAGING}/dev/faults", json=body)
        assert answer.status_code == 200, answer.text

    def product(self, app: Callable[..., Any]) -> None:
        """Serve the Messaging base URL with another ASGI app."""
        self.router.add(MESSAGING, app)


@asynccontextmanager
async def dispatch_kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    """An applied deployment of :data:`WORKFLOWS` with issuer and Messaging stand-in."""
    deployment = TestDeployment.create(tmp_path, database, workflows=())
    packages = []
    for source in WORKFLOWS.values():
        root, digest = write_package(deployment.packages_dir, source)
        packages.append({"root": str(root), "expectedDigest": digest})
    deployment.doc["deployment"]["packages"] = packages
    jwk = generate_private_jwk("ES256")
    write_secret(deployment.secrets, "notices-client.jwk", json.dumps(jwk).encode())
    checked = deployment.checked()
    await deploy.apply(checked, [])
    resolver = resolver_for(checked.config)
    runtime = Runtime(checked, resolver, Endpoints({}), recovery_only=False)

    router = HostRouter()
    http = product_client(router)
    issuer = DevIssuer(
        IssuerState.create(tmp_path / "issuer", ISSUER),
        [client_for(CLIENT, jwk, {"messages:send", "receipts:read"})],
        clock=time.time,
    )
    messaging = MessagingStandIn(
        StandInSettings(base_url=MESSAGING, issuer=ISSUER, allowed_clients=frozenset({CLIENT})),
        http=httpx.AsyncClient(transport=router),
    )
    router.add(ISSUER, issuer.app)
    router.add(MESSAGING, messaging)

    admission = Store(runtime, "admission")
    await admission.open()
    db = await migration_connection(database)
    kit = DispatchKit(
        deployment=deployment,
        checked=checked,
        runtime=runtime,
        admission=admission,
        db=db,
        router=router,
        issuer=issuer,
        messaging=messaging,
        http=http,
        keyring=keyring_from_config(checked.config, resolver),
        admission_key=resolver.read_key(checked.config.deployment.admission_key_ref),
    )
    try:
        yield kit
    finally:
        for store in kit.stores:
            await store.close()
        await admission.close()
        await db.close()
        await http.aclose()
        await messaging.aclose()
        await messaging.http.aclose()
        await drop_deployment(database, deployment.namespace)


async def until(check: Callable[[], Awaitable[bool]], *dispatchers: Dispatcher) -> None:
    """Wait (without sleeping) until ``check`` holds, re-checking whenever a step ends."""
    async with asyncio.timeout(10):
        while True:
            seen = [d.executed for d in dispatchers]
            if await check():
                return
            waits = [
                asyncio.ensure_future(_progressed(d, before))
                for d, before in zip(dispatchers, seen, strict=True)
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()


async def _progressed(dispatcher: Dispatcher, before: int) -> None:
    async with dispatcher.progress:
        await dispatcher.progress.wait_for(lambda: dispatcher.executed > before)


@contextlib.asynccontextmanager
async def running(dispatcher: Dispatcher) -> AsyncIterator[asyncio.Task[None]]:
    """Run the dispatcher's loop as a task (listening before the body runs); stop after."""
    task = asyncio.create_task(dispatcher.run())
    try:
        async with asyncio.timeout(10):
            await dispatcher.listener.listening.wait()
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
