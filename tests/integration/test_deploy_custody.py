"""Key custody in apply and deployment-status (CONTRACT §7.4)."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core import deploy
from core.errors import CoordinatorError
from core.keys import fingerprint
from devstack.postgres import DatabaseHandle
from tests.helpers.deployment import (
    TestDeployment,
    drop_deployment,
    insert_run,
    migration_connection,
    write_secret,
)

pytestmark = pytest.mark.postgres

CUSTODY = "command.state-key-custody"


@pytest.fixture
async def deployment(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[TestDeployment]:
    made = TestDeployment.create(tmp_path, database)
    yield made
    await drop_deployment(database, made.namespace)


async def _custody_rows(d: TestDeployment) -> dict[tuple[str, int], str]:
    conn = await migration_connection(d.database)
    try:
        rows = await conn.fetch(
            f'SELECT key_kind, key_version, fingerprint FROM "{d.namespace}".key_custody'
        )
    finally:
        await conn.close()
    return {(row[0], row[1]): row[2] for row in rows}


async def test_apply_records_the_fingerprints_once(deployment: TestDeployment) -> None:
    await deploy.apply(deployment.checked(), [])
    state_key = (deployment.secrets / "state-key-1").read_bytes()
    admission_key = (deployment.secrets / "admission-key").read_bytes()
    assert await _custody_rows(deployment) == {
        ("admission", 0): fingerprint(admission_key),
        ("state", 1): fingerprint(state_key),
    }


async def test_a_changed_state_key_file_is_refused(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    write_secret(deployment.secrets, "state-key-1", secrets.token_bytes(32))
    with pytest.raises(CoordinatorError) as refused:
        await deploy.status(checked)
    assert refused.value.code == CUSTODY
    assert refused.value.cli_line().startswith("coordinator.command.state-key-custody: ")
    assert "deployment.stateKeys[0]" in refused.value.detail
    with pytest.raises(CoordinatorError) as apply_refused:
        await deploy.apply(checked, [])
    assert apply_refused.value.code == CUSTODY


async def test_a_changed_admission_key_is_refused(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    write_secret(deployment.secrets, "admission-key", secrets.token_bytes(32))
    with pytest.raises(CoordinatorError) as refused:
        await deploy.status(checked)
    assert refused.value.code == CUSTODY
    assert "deployment.admissionKeyRef" in refused.value.detail


async def test_a_referenced_version_must_stay_configured(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    await deploy.apply(checked, [])
    # Rotate: add version 2, make it active, apply; then write a payload under version 1.
    write_secret(deployment.secrets, "state-key-2", secrets.token_bytes(32))
    deployment.doc["deployment"]["stateKeys"].append(
        {"version": 2, "ref": "secret:file/state-key-2"}
    )
    deployment.doc["deployment"]["activeStateKey"] = 2
    rotated = deployment.checked()
    with pytest.raises(CoordinatorError) as unrecorded:
        await deploy.status(rotated)
    assert unrecorded.value.code == CUSTODY
    assert "run apply" in unrecorded.value.detail
    await deploy.apply(rotated, [])
    assert (await deploy.status(rotated)).to_json()["status"] == "checked"

    run_id = await insert_run(
        deployment.database,
        deployment.namespace,
        "approval-notice",
        checked.packages["approval-notice"].digest,
    )
    conn = await migration_connection(deployment.database)
    try:
        await conn.execute(
            f'INSERT INTO "{deployment.namespace}".payload '
            "(run_id, purpose, key_version, nonce, ciphertext) VALUES ($1, 'input', 1, $2, $3)",
            run_id,
            bytes(12),
            b"\x00",
        )
    finally:
        await conn.close()

    deployment.doc["deployment"]["stateKeys"] = [{"version": 2, "ref": "secret:file/state-key-2"}]
    dropped = deployment.checked()
    with pytest.raises(CoordinatorError) as refused:
        await deploy.status(dropped)
    assert refused.value.code == CUSTODY
    assert "version 1 is used by stored payloads" in refused.value.detail
    with pytest.raises(CoordinatorError) as apply_refused:
        await deploy.apply(dropped, [])
    assert apply_refused.value.code == CUSTODY
