"""Startup refusals: one raw code line on standard error and a non-zero exit."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.config.check import check_runtime_file
from core.deploy import apply
from core.workflow.package import build_package
from devstack.postgres import DatabaseHandle
from devstack.stack import LocalStack, wait_until

ROOT = Path(__file__).resolve().parents[2]
COORDINATOR = str(Path(sys.executable).with_name("coordinator"))


@pytest.fixture
def applied(database: DatabaseHandle, tmp_path: Path) -> LocalStack:
    built = build_package(ROOT / "examples" / "appointment-booking", tmp_path / "packages")
    stack = LocalStack.prepare(
        tmp_path / "stack", packages=[(built.path, built.digest)], database=database
    )
    asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
    return stack


def edit_runtime(stack: LocalStack, change: Callable[[dict[str, object]], None]) -> None:
    document = yaml.safe_load(stack.runtime_file.read_text())
    change(document)
    stack.runtime_file.write_text(yaml.safe_dump(document, sort_keys=False))


def start_and_fail(stack: LocalStack) -> tuple[int, list[str]]:
    result = subprocess.run(
        [COORDINATOR, "--runtime-config", str(stack.runtime_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.returncode, result.stderr.strip().splitlines()


def test_a_changed_state_key_refuses_with_state_key_custody(applied: LocalStack) -> None:
    key = applied.runtime_file.parent / "secrets" / "state-key-1"
    key.write_bytes(secrets.token_bytes(32))
    code, lines = start_and_fail(applied)
    assert code != 0
    assert len(lines) == 1
    assert lines[0].startswith("state-key-custody:")


def test_a_changed_database_id_refuses_with_deployment_refused(applied: LocalStack) -> None:
    def change(document: dict[str, object]) -> None:
        deployment = document["deployment"]
        assert isinstance(deployment, dict)
        deployment["databaseId"] = str(uuid.uuid4())

    edit_runtime(applied, change)
    code, lines = start_and_fail(applied)
    assert code != 0
    assert len(lines) == 1
    assert lines[0].startswith("deployment.refused:")
    assert "databaseId" in lines[0]


def test_an_invalid_runtime_file_refuses_naming_the_key(applied: LocalStack) -> None:
    def change(document: dict[str, object]) -> None:
        deployment = document["deployment"]
        assert isinstance(deployment, dict)
        deployment["listener"] = {
            "bind": "0.0.0.0:8108",
            "tlsTermination": "operator-controlled-upstream",
        }

    edit_runtime(applied, change)
    code, lines = start_and_fail(applied)
    assert code != 0
    assert lines == [lines[0]] and lines[0].startswith("deployment.refused:")
    assert "deployment.listener.bind" in lines[0]


def test_a_wrong_key_size_refuses_without_showing_the_key(applied: LocalStack) -> None:
    key = applied.runtime_file.parent / "secrets" / "admission-key"
    key.write_bytes(b"short-key-material")
    code, lines = start_and_fail(applied)
    assert code != 0
    assert "short-key-material" not in "\n".join(lines)
    assert lines[-1].split(":")[0] in ("deployment.refused", "state-key-custody")


def test_the_json_log_format_is_one_object_per_line(applied: LocalStack) -> None:
    def json_info(document: dict[str, Any]) -> None:
        deployment = document["deployment"]
        assert isinstance(deployment, dict)
        deployment["logging"] = {"level": "info", "format": "json"}

    edit_runtime(applied, json_info)
    log_file = applied.root / "json.log"
    with open(log_file, "wb") as log:
        process = subprocess.Popen(
            [COORDINATOR, "--runtime-config", str(applied.runtime_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def serving() -> set[str]:
            lines = log_file.read_text().splitlines()
            records = [json.loads(line) for line in lines if line.startswith("{")]
            return {r["component"] for r in records if " serving on " in r["message"]}

        try:
            wait_until(lambda: len(serving()) == 5, "five serving lines", process=process)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0

    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert serving() == {"gateway", "admission", "dispatcher", "recovery", "auditd"}
    for record in records:
        assert {"time", "level", "logger", "component", "message"} <= set(record)
        assert datetime.fromisoformat(record["time"]).utcoffset() == timedelta(0)
    assert {record["level"] for record in records} >= {"NOTICE"}
