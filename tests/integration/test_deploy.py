"""plan, apply and deployment-status against the real TLS PostgreSQL server."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core import deploy
from core.errors import CoordinatorError
from devstack.postgres import DatabaseHandle, postgres_url
from tests.helpers.deployment import (
    TestDeployment,
    drop_deployment,
    insert_run,
    migration_connection,
    write_secret,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
async def deployment(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[TestDeployment]:
    made = TestDeployment.create(tmp_path, database, workflows=("approval-notice", "slot-booking"))
    yield made
    await drop_deployment(database, made.namespace)


async def _serial(d: TestDeployment) -> int:
    conn = await migration_connection(d.database)
    try:
        value = await conn.fetchval(f'SELECT activation_serial FROM "{d.namespace}".deployment')
    finally:
        await conn.close()
    return int(value)


def _actions(entries: list[deploy.PlanEntry]) -> dict[str, str]:
    return {entry.id: entry.action for entry in entries}


async def test_plan_apply_status_on_an_empty_namespace(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    digests = {wid: pkg.digest for wid, pkg in checked.packages.items()}

    planned = await deploy.plan(checked, [])
    assert [entry.to_json() for entry in planned] == [
        {"id": wid, "action": "install", "activeDigest": None, "plannedDigest": digests[wid]}
        for wid in sorted(digests)
    ]

    applied = await deploy.apply(checked, [])
    assert applied == planned
    assert await _serial(deployment) == 1

    report = await deploy.status(checked)
    assert report.to_json() == {
        "status": "checked",
        "schemaVersion": 4,
        "databaseId": deployment.doc["deployment"]["databaseId"],
        "workflows": [{"id": wid, "digest": digests[wid]} for wid in sorted(digests)],
    }


async def test_a_second_apply_changes_nothing(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    again = await deploy.apply(deployment.checked(), [])
    assert set(_actions(again).values()) == {"unchanged"}
    assert await _serial(deployment) == 1
    assert _actions(await deploy.plan(checked, [])) == _actions(again)


async def test_a_changed_package_is_planned_as_replace_and_applied(
    deployment: TestDeployment,
) -> None:
    first = deployment.checked()
    await deploy.apply(first, [])
    old_digest = first.packages["slot-booking"].digest
    new_digest = deployment.pin("slot-booking", "1.1.0")
    assert new_digest != old_digest
    checked = deployment.checked()

    planned = {entry.id: entry for entry in await deploy.plan(checked, [])}
    assert planned["slot-booking"].to_json() == {
        "id": "slot-booking",
        "action": "replace",
        "activeDigest": old_digest,
        "plannedDigest": new_digest,
    }
    assert planned["approval-notice"].action == "unchanged"
    with pytest.raises(CoordinatorError) as stale:
        await deploy.status(checked)
    assert stale.value.code == "deployment.refused"
    assert "slot-booking" in stale.value.detail

    await deploy.apply(checked, [])
    assert await _serial(deployment) == 2
    report = (await deploy.status(checked)).to_json()
    assert {"id": "slot-booking", "digest": new_digest} in report["workflows"]

    # Runs admitted under the old package keep its bytes.
    conn = await migration_connection(deployment.database)
    try:
        kept = await conn.fetchval(
            f'SELECT count(*) FROM "{deployment.namespace}".package WHERE digest = $1', old_digest
        )
    finally:
        await conn.close()
    assert kept == 1


async def test_an_unlisted_workflow_is_refused_and_its_removal_waits_for_live_runs(
    deployment: TestDeployment,
) -> None:
    applied = deployment.checked()
    await deploy.apply(applied, [])
    digest = applied.packages["slot-booking"].digest
    deployment.unpin("slot-booking")
    checked = deployment.checked()

    for command in (deploy.plan, deploy.apply):
        with pytest.raises(CoordinatorError) as refused:
            await command(checked, [])
        assert refused.value.code == "deployment.workflow-unlisted"
        assert refused.value.detail == "workflow 'slot-booking' is active but not listed"

    run_id = await insert_run(deployment.database, deployment.namespace, "slot-booking", digest)
    for command in (deploy.plan, deploy.apply):
        with pytest.raises(CoordinatorError) as live:
            await command(checked, ["slot-booking"])
        assert live.value.code == "deployment.workflow-live-runs"
    assert await _serial(deployment) == 1

    conn = await migration_connection(deployment.database)
    try:
        await conn.execute(
            f"UPDATE \"{deployment.namespace}\".run SET state = 'cancelled', "
            f'ended_at = "{deployment.namespace}".now() WHERE id = $1',
            run_id,
        )
    finally:
        await conn.close()
    planned = await deploy.plan(checked, ["slot-booking"])
    assert [entry.to_json() for entry in planned if entry.id == "slot-booking"] == [
        {"id": "slot-booking", "action": "remove", "activeDigest": digest, "plannedDigest": None}
    ]
    await deploy.apply(checked, ["slot-booking"])
    report = (await deploy.status(checked)).to_json()
    assert [item["id"] for item in report["workflows"]] == ["approval-notice"]
    assert await _serial(deployment) == 2


async def test_removing_a_listed_workflow_is_refused(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    with pytest.raises(CoordinatorError) as refused:
        await deploy.plan(checked, ["slot-booking"])
    assert refused.value.code == "deployment.refused"
    with pytest.raises(CoordinatorError) as odd:
        await deploy.plan(checked, ["Not An Id"])
    assert odd.value.code == "deployment.refused"
    assert "Not An Id" not in odd.value.detail


async def test_a_different_database_id_is_refused(deployment: TestDeployment) -> None:
    await deploy.apply(deployment.checked(), [])
    deployment.doc["deployment"]["databaseId"] = "00000000-0000-4000-8000-000000000000"
    checked = deployment.checked()
    for command in (deploy.plan, deploy.apply):
        with pytest.raises(CoordinatorError) as refused:
            await command(checked, [])
        assert refused.value.code == "deployment.refused"
        assert "databaseId" in refused.value.detail
    with pytest.raises(CoordinatorError) as status_refused:
        await deploy.status(checked)
    assert status_refused.value.code == "deployment.refused"
    assert "databaseId" in status_refused.value.detail


async def test_two_concurrent_applies_end_in_one_result(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    first, second = await asyncio.gather(deploy.apply(checked, []), deploy.apply(checked, []))
    # One of them installed; the other, serialized behind the lock, found nothing to do.
    outcomes = sorted([set(_actions(first).values()), set(_actions(second).values())], key=str)
    assert outcomes == [{"install"}, {"unchanged"}]
    assert await _serial(deployment) == 1
    report = (await deploy.status(checked)).to_json()
    assert len(report["workflows"]) == 2


async def test_status_before_apply_is_refused(deployment: TestDeployment) -> None:
    with pytest.raises(CoordinatorError) as refused:
        await deploy.status(deployment.checked())
    assert refused.value.code == "deployment.refused"
    assert "run apply" in refused.value.detail


async def test_an_unreachable_database_is_store_unavailable(deployment: TestDeployment) -> None:
    db = deployment.database
    password = "p@ss:w/rd?#secret"
    # A loopback port that nothing listens on: bind one and release it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = postgres_url(db.runtime_role, password, "127.0.0.1", port, db.database)
    write_secret(deployment.secrets, "runtime-db-url", url.encode())
    with pytest.raises(CoordinatorError) as refused:
        await deploy.status(deployment.checked())
    assert refused.value.code == "store.unavailable"
    assert "database.runtimeUrlRef" in refused.value.detail
    assert password not in str(refused.value)
    assert "p%40ss" not in str(refused.value)


async def test_a_wrong_password_is_refused_without_echo(deployment: TestDeployment) -> None:
    db = deployment.database
    url = postgres_url(db.runtime_role, "not-the-password", db.host, db.port, db.database)
    write_secret(deployment.secrets, "runtime-db-url", url.encode())
    with pytest.raises(CoordinatorError) as refused:
        await deploy.plan(deployment.checked(), [])
    assert refused.value.code == "deployment.refused"
    assert "not-the-password" not in str(refused.value)
