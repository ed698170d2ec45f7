"""coordinatorctl plan / apply / deployment-status / keys fingerprint, as real processes."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.keys import fingerprint
from devstack.postgres import DatabaseHandle
from tests.helpers.deployment import TestDeployment, drop_deployment

pytestmark = pytest.mark.postgres

CTL = Path(sys.executable).with_name("coordinatorctl")


@pytest.fixture
async def deployment(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[TestDeployment]:
    made = TestDeployment.create(tmp_path, database, workflows=("approval-notice", "slot-booking"))
    yield made
    await drop_deployment(database, made.namespace)


async def ctl(runtime_file: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(CTL),
        "--runtime-config",
        str(runtime_file),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def ctl_json(runtime_file: Path, *args: str) -> Any:
    code, out, err = await ctl(runtime_file, *args, "--output", "json")
    assert code == 0, err
    return json.loads(out)


async def test_the_deployment_commands_end_to_end(deployment: TestDeployment) -> None:
    checked = deployment.checked()
    runtime = deployment.runtime_file
    digests = {wid: pkg.digest for wid, pkg in checked.packages.items()}

    planned = await ctl_json(runtime, "plan")
    assert planned == {
        "workflows": [
            {"id": wid, "action": "install", "activeDigest": None, "plannedDigest": digests[wid]}
            for wid in sorted(digests)
        ]
    }
    applied = await ctl_json(runtime, "apply")
    assert applied == planned
    status = await ctl_json(runtime, "deployment-status")
    assert status == {
        "status": "checked",
        "schemaVersion": 4,
        "databaseId": deployment.doc["deployment"]["databaseId"],
        "workflows": [{"id": wid, "digest": digests[wid]} for wid in sorted(digests)],
    }

    prints = await ctl_json(runtime, "keys", "fingerprint")
    secrets_dir = deployment.secrets
    assert prints == {
        "stateKeys": [
            {"version": 1, "fingerprint": fingerprint((secrets_dir / "state-key-1").read_bytes())}
        ],
        "admissionKey": fingerprint((secrets_dir / "admission-key").read_bytes()),
        "auditKey": fingerprint((secrets_dir / "audit-key").read_bytes()),
    }

    # Text output names the same things.
    code, text, _ = await ctl(runtime, "deployment-status")
    assert code == 0
    assert "checked" in text and digests["slot-booking"] in text

    # A dropped entry: refused with the coded last line and exit 1, then removed.
    deployment.unpin("slot-booking")
    deployment.write()
    code, _, err = await ctl(runtime, "plan")
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "coordinator.deployment.workflow-unlisted: workflow 'slot-booking' is active but not listed"
    )
    removed = await ctl_json(runtime, "apply", "--remove-workflow", "slot-booking")
    assert {
        "id": "slot-booking",
        "action": "remove",
        "activeDigest": digests["slot-booking"],
        "plannedDigest": None,
    } in removed["workflows"]
    final = await ctl_json(runtime, "deployment-status")
    assert [item["id"] for item in final["workflows"]] == ["approval-notice"]
