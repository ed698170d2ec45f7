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
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml

from core.crypto import keyring_from_config
from core.derive import command_key
from core.products.http import Exchanger
from core.runtime import Store
from devstack.issuer import DevIssuer, generate_private_jwk
from devstack.postgres import DatabaseHandle
from devstack.products.common import StandInSettings
from devstack.products.messaging import MessagingStandIn
from dispatcher.engine import Dispatcher
from dispatcher.metrics import DispatchMetrics
from tests.helpers.asgi_http import AsgiHttp
from tests.helpers.base_kit import (
    ISSUER,
    BaseKit,
    applied,
    dev_issuer,
    write_packages,
)
from tests.helpers.deployment import (
    TestDeployment,
    drop_deployment,
    migration_connection,
    write_secret,
)
from tests.helpers.devstack_kit import HostRouter, client_for
from tests.helpers.loopback import LoopbackHttp
from tests.helpers.runs import insert_started_run

MESSAGING = "https://messaging.internal.example.org"
IN_PROCESS = "in-process"
"""The dispatcher calls the router's stand-ins directly (no sockets)."""
LOOPBACK = "loopback"
"""The dispatcher's real client, over 127.0.0.1, to a server in front of the router."""
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


def notice_call(
    template: str = "test-notice", recipient: str = "${input.applicantRef}"
) -> dict[str, Any]:
    """The body of a Messaging ``send-notice`` call step (kept: ``messageId``)."""
    return {
        "connection": "notices",
        "operation": "send-notice",
        "input": {
            "template": template,
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
        {"send": {"call": notice_call(), "next": "sent"}, "sent": {"finish": {"outcome": "sent"}}},
    ),
    # call with onRefused
    "notice-refusable": _workflow(
        "notice-refusable",
        ["sent", "turned-down"],
        "send",
        {
            "send": {"call": notice_call(), "next": "sent", "onRefused": "turned-down"},
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
            "send": {"call": notice_call(recipient="${input.optionalRef}"), "next": "sent"},
            "sent": {"finish": {"outcome": "sent"}},
        },
    ),
    # call, then a choice on the value it kept
    "notice-checked": _workflow(
        "notice-checked",
        ["kept", "lost"],
        "send",
        {
            "send": {"call": notice_call(), "next": "check"},
            "check": {
                "choose": [{"when": {"exists": "${steps.send.messageId}"}, "next": "kept"}],
                "otherwise": "lost",
            },
            "kept": {"finish": {"outcome": "kept"}},
            "lost": {"finish": {"outcome": "lost"}},
        },
    ),
    # call, a choice on its value, then a second call sending that value: the second is
    # prepared by the settle of the first (issue 43)
    "notice-twice": _workflow(
        "notice-twice",
        ["sent-twice", "lost"],
        "send",
        {
            "send": {"call": notice_call(), "next": "check"},
            "check": {
                "choose": [{"when": {"exists": "${steps.send.messageId}"}, "next": "again"}],
                "otherwise": "lost",
            },
            "again": {
                "call": notice_call("test-notice-again", "${steps.send.messageId}"),
                "next": "sent-twice",
            },
            "sent-twice": {"finish": {"outcome": "sent-twice"}},
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


class ScriptedProduct:
    """A product that answers from a script: one (status, body) per request, or (status,
    body, headers), the last one repeated. It records every request (method, path, headers,
    body)."""

    def __init__(
        self,
        *answers: tuple[int, bytes | dict[str, Any]]
        | tuple[int, bytes | dict[str, Any], dict[str, str]],
    ) -> None:
        self.answers = deque(answers)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        self.requests.append(
            {
                "method": scope["method"],
                "path": scope["path"],
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "body": body,
            }
        )
        answer = self.answers.popleft() if len(self.answers) > 1 else self.answers[0]
        headers = answer[2] if len(answer) > 2 else {}
        await send_answer(send, answer[0], answer[1], headers)


async def read_body(receive: Any) -> bytes:
    """The whole body of an ASGI HTTP request."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def send_answer(
    send: Any,
    status: int,
    content: bytes | dict[str, Any],
    headers: dict[str, str] | None = None,
) -> None:
    """Answer an ASGI HTTP request with ``status`` and a JSON body (bytes sent as they are),
    and any more ``headers``."""
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    more = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *more],
        }
    )
    await send({"type": "http.response.body", "body": raw})


@dataclass
class DispatchKit(BaseKit):
    """Everything a dispatcher test needs; see the module docstring."""

    issuer: DevIssuer
    messaging: MessagingStandIn
    admission_key: bytes

    async def start(self, workflow_id: str, run_input: dict[str, Any]) -> str:
        """Admit a run; answers its id."""
        return await insert_started_run(self.admission, self.checked, workflow_id, run_input)

    async def step(self, run_id: str, step_id: str) -> asyncpg.Record:
        """One step row."""
        row = await self.find_step(run_id, step_id)
        assert row is not None
        return row

    def key(self, run_id: str, step_id: str = "send") -> str:
        """The command key of a step."""
        return command_key(self.admission_key, run_id, step_id)

    async def stats(self) -> dict[str, Any]:
        """The Messaging stand-in's ``/dev/stats``."""
        answer = await self.messaging.http.get(f"{MESSAGING}/dev/stats")
        document: dict[str, Any] = answer.json()
        return document

    async def fault(self, **body: Any) -> None:
        """Inject a Messaging stand-in fault."""
        answer = await self.messaging.http.post(f"{MESSAGING}/dev/faults", json=body)
        assert answer.status_code == 200, answer.text

    def product(self, app: Callable[..., Any]) -> None:
        """Serve the Messaging base URL with another ASGI app."""
        self.router.add(MESSAGING, app)


@asynccontextmanager
async def dispatch_kit(
    tmp_path: Path,
    database: DatabaseHandle,
    *,
    workflows: Mapping[str, bytes] | None = None,
    connections: dict[str, Any] | None = None,
    wire: str = IN_PROCESS,
) -> AsyncIterator[DispatchKit]:
    """An applied deployment of ``workflows`` (:data:`WORKFLOWS` unless given) with issuer
    and Messaging stand-in; ``connections`` replaces the deployment's connections (each
    signing with ``secret:file/notices-client.jwk``). ``wire`` is how the dispatcher reaches
    them: :data:`IN_PROCESS` (the router called directly) or :data:`LOOPBACK` (the real client
    over real sockets to a server in front of the same router)."""
    deployment = TestDeployment.create(tmp_path, database, workflows=())
    write_packages(deployment, (WORKFLOWS if workflows is None else workflows).values())
    if connections is not None:
        deployment.doc["connections"] = connections
    jwk = generate_private_jwk("ES256")
    write_secret(deployment.secrets, "notices-client.jwk", json.dumps(jwk).encode())
    checked, resolver, runtime = await applied(deployment)

    router = HostRouter()
    http: Exchanger
    if wire == LOOPBACK:
        http = LoopbackHttp(router)
        await http.start()
    else:
        http = AsgiHttp(router)
    issuer = dev_issuer(tmp_path, [client_for(CLIENT, jwk, {"messages:send", "receipts:read"})])
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
        http=http,
        keyring=keyring_from_config(checked.config, resolver),
        issuer=issuer,
        messaging=messaging,
        admission_key=resolver.read_key(checked.config.deployment.admission_key_ref),
    )
    try:
        yield kit
    finally:
        await kit.close()
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


def token_refusals(metrics: DispatchMetrics, connection_type: str) -> int:
    """How many token requests of ``connection_type`` the dispatcher counted as refused."""
    labels = {"connection_type": connection_type}
    value = metrics.registry.get_sample_value("coordinator_token_refusals_total", labels)
    return int(value or 0)


def first_dispatches(metrics: DispatchMetrics) -> int:
    """How many runs' first commands the dispatcher timed."""
    value = metrics.registry.get_sample_value("coordinator_admission_to_dispatch_seconds_count")
    return int(value or 0)
