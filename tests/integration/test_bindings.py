"""Live bindings (CONTRACT §9.7): startup refuses a runtime file that changed the endpoint,
identity, scopes or task authority of a connection a run in flight uses — and only that."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from admission.service import serve as serve_admission
from core.bindings import verify_live_bindings
from core.documents import inspection_document, status_document
from core.errors import CoordinatorError
from core.keys import resolver_for
from core.rpc import coordinator_pb2 as pb
from core.rpc import coordinator_pb2_grpc as pb_grpc
from core.rpc.transport import call, channel, unix_endpoints
from core.runtime import Runtime, Store
from devstack.postgres import DatabaseHandle
from dispatcher.service import serve as serve_dispatcher
from recovery.service import serve as serve_recovery
from tests.helpers.deployment import write_secret
from tests.helpers.review_kit import ReviewKit, review_kit
from tests.helpers.serving import serving

pytestmark = pytest.mark.postgres

Change = Callable[[dict[str, Any]], None]


def review(doc: dict[str, Any]) -> dict[str, Any]:
    connection: dict[str, Any] = doc["connections"]["review"]
    return connection


def authorization(doc: dict[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = review(doc)["authorization"]
    return block


def _issuer(doc: dict[str, Any]) -> None:
    authentication = doc["deployment"]["authentication"]
    authentication["issuer"] = "https://issuer2.example.org"
    authentication["signingKeys"] = {"jwksUrl": "https://issuer2.example.org/jwks"}


REFUSED: dict[str, tuple[Change, str]] = {
    "baseUrl": (
        lambda doc: review(doc).update(baseUrl="https://casework2.internal.example.org"),
        "baseUrl",
    ),
    "clientId": (
        lambda doc: authorization(doc).update(clientId="coordinator-review-2"),
        "authorization.clientId",
    ),
    "scopes": (
        lambda doc: authorization(doc).update(scopes=["review-requests:read"]),
        "authorization.scopes",
    ),
    "profile": (lambda doc: review(doc).update(profile="other-reviews"), "profile"),
    "producer": (lambda doc: review(doc).update(producer="coordinator-2"), "producer"),
    "issuer": (_issuer, "deployment.authentication.issuer"),
}

ALLOWED: dict[str, Change] = {
    "resultCheckSeconds": lambda doc: review(doc).update(resultCheckSeconds=60),
    "completion token": lambda doc: review(doc)["completion"].update(
        bearerTokenRef="secret:file/review-completion-token-2"
    ),
    "completion binding": lambda doc: review(doc)["completion"].update(
        recipientBinding="coordinator-v2"
    ),
    "no completion block": lambda doc: review(doc).pop("completion"),
    "scopes reordered": lambda doc: authorization(doc).update(
        scopes=["review-requests:read", "review-requests:write"]
    ),
}


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[ReviewKit]:
    async with review_kit(tmp_path, database) as made:
        write_secret(made.deployment.secrets, "review-completion-token-2", b"a-rotated-token")
        yield made


@pytest.fixture
def sockets() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rcb-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def runtime_with(
    kit: ReviewKit, change: Change, sockets: Path, *, recovery_only: bool = False
) -> Runtime:
    """The deployment's runtime file with ``change`` applied, as the service would load it."""
    original = kit.deployment.doc
    changed = copy.deepcopy(original)
    change(changed)
    changed["deployment"]["internal"] = {"socketDir": str(sockets)}
    kit.deployment.doc = changed
    try:
        checked = kit.deployment.checked()
    finally:
        kit.deployment.doc = original
    return Runtime(checked, resolver_for(checked.config), unix_endpoints(sockets), recovery_only)


@contextlib.asynccontextmanager
async def opened(runtime: Runtime, component: str = "dispatcher") -> AsyncIterator[Store]:
    store = Store(runtime, component)
    try:
        await store.open()
        await store.verify()
        yield store
    finally:
        await store.close()


async def test_startup_is_refused_when_a_live_runs_binding_changed(
    kit: ReviewKit, sockets: Path
) -> None:
    run_id = await kit.start()
    for name, (change, words) in REFUSED.items():
        async with opened(runtime_with(kit, change, sockets)) as store:
            with pytest.raises(CoordinatorError) as refused:
                await verify_live_bindings(store)
        assert refused.value.code == "command.live-binding-conflict", name
        assert f"connection 'review': {words}" in refused.value.detail, name
        assert run_id not in refused.value.detail


async def test_completion_and_result_check_changes_are_no_conflict(
    kit: ReviewKit, sockets: Path
) -> None:
    await kit.start()
    for name, change in ALLOWED.items():
        async with opened(runtime_with(kit, change, sockets)) as store:
            assert await verify_live_bindings(store) == [], name


async def test_runs_that_ended_bind_nothing(kit: ReviewKit, sockets: Path) -> None:
    run_id = await kit.start()
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'succeeded', outcome = 'approved', "
        f"ended_at = {kit.ns}.now() WHERE id = $1",
        run_id,
    )
    change, _words = REFUSED["baseUrl"]
    async with opened(runtime_with(kit, change, sockets)) as store:
        assert await verify_live_bindings(store) == []


async def test_admission_dispatcher_and_recovery_each_refuse_to_start(
    kit: ReviewKit, sockets: Path
) -> None:
    await kit.start()
    runtime = runtime_with(kit, REFUSED["producer"][0], sockets)

    async def ready() -> bool:
        return True

    serving: dict[str, Any] = {
        "admission": serve_admission(runtime),
        "dispatcher": serve_dispatcher(runtime),
        "recovery": serve_recovery(runtime, audit_ready=ready),
    }
    for component, starting in serving.items():
        with pytest.raises(CoordinatorError) as refused:
            await asyncio.wait_for(starting, timeout=30)
        assert refused.value.code == "command.live-binding-conflict", component


async def test_recovery_only_starts_anyway_and_inspection_shows_the_conflict(
    kit: ReviewKit, sockets: Path
) -> None:
    run_id = await kit.start()
    runtime = runtime_with(kit, REFUSED["baseUrl"][0], sockets, recovery_only=True)

    async def ready() -> bool:
        return True

    async with (
        serving(recovery=lambda started: serve_recovery(runtime, started, audit_ready=ready)),
        channel(runtime.endpoints, "recovery") as ch,
    ):
        stub = pb_grpc.RecoveryStub(ch)
        inspection = await call("recovery", stub.Inspect, pb.RunRef(run_id=run_id))
        status = await call("recovery", stub.Status, pb.RunRef(run_id=run_id))

    document = inspection_document(inspection)
    assert document["bindingConflict"] is True
    assert document["conflictingConnections"] == ["review"]
    assert "bindingConflict" not in status_document(status)


async def test_the_service_prints_the_raw_code_and_exits_1(kit: ReviewKit, sockets: Path) -> None:
    run_id = await kit.start()
    runtime = runtime_with(kit, REFUSED["profile"][0], sockets)
    command = [
        sys.executable,
        "-m",
        "core.launcher",
        "--runtime-config",
        str(runtime.config.path),
        "--component",
        "dispatcher",
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _out, err = await asyncio.wait_for(process.communicate(), timeout=60)

    assert process.returncode == 1
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("live-binding-conflict: ")
    assert "connection 'review': profile" in lines[-1]
    assert run_id not in err.decode()
