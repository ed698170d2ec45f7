"""Admission against the real TLS PostgreSQL server: what a start writes and refuses."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from admission import start as start_module
from admission.start import canonical_input
from core.clock import ENV_VAR, write_test_clock
from core.crypto import Sealed, keyring_from_config, open_
from core.runs import RUN_STATES
from devstack.postgres import DatabaseHandle
from tests.helpers.admitting import admit, admitter, refused
from tests.helpers.deployment import migration_connection
from tests.helpers.serving import Caller, Served, served

pytestmark = pytest.mark.postgres

ALICE = Caller()
BOB = Caller(sub="bob")
WORKFLOW = "approval-notice"
# A value that must never be readable anywhere but in the sealed payload.
MARKER = "MARKER-7f3c91d2"


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Served]:
    async with served(tmp_path, database, components=("admission",)) as made:
        yield made


async def test_a_start_writes_run_bindings_sealed_input_identity_and_first_step(
    env: Served,
) -> None:
    value = {"subjectRef": MARKER}
    result = await admitter(env).start(ALICE, WORKFLOW, "key-1", value)

    assert result.created is True
    run = (await env.owner_fetch("SELECT * FROM {ns}.run"))[0]
    assert run["id"] == result.run_id
    assert (run["workflow_id"], run["state"], run["attention"]) == (WORKFLOW, "running", False)
    assert (run["principal_iss"], run["principal_sub"], run["client_id"]) == (
        ALICE.iss,
        ALICE.sub,
        ALICE.client_id,
    )
    assert run["package_digest"] == env.deployment.checked().packages[WORKFLOW].digest

    bindings = await env.owner_fetch("SELECT * FROM {ns}.binding")
    assert [dict(row) for row in bindings] == [
        {
            "run_id": result.run_id,
            "connection": "notices",
            "connection_type": "messaging",
            "base_url": "https://messaging.internal.example.org",
            "client_id": "coordinator-notices",
            "issuer": "https://issuer.example.org",
            "scopes": ["messages:send"],
            "audience": "https://messaging.internal.example.org",
            "profile": "applicant-notices",
            "producer": None,
        }
    ]

    payloads = await env.owner_fetch("SELECT * FROM {ns}.payload")
    assert len(payloads) == 1
    payload = payloads[0]
    assert (payload["run_id"], payload["step_id"], payload["purpose"], payload["key_version"]) == (
        result.run_id,
        None,
        "input",
        1,
    )
    keyring = keyring_from_config(env.runtime.config, env.runtime.resolver)
    sealed = Sealed(1, bytes(payload["nonce"]), bytes(payload["ciphertext"]))
    plaintext = open_(keyring, env.namespace, result.run_id, "input", sealed)
    assert plaintext == canonical_input(value)

    identity = (await env.owner_fetch("SELECT * FROM {ns}.start_identity"))[0]
    assert identity["run_id"] == result.run_id
    assert len(identity["identity"]) == 64 and len(identity["input_digest"]) == 64

    steps = await env.owner_fetch("SELECT * FROM {ns}.step")
    assert len(steps) == 1
    step = steps[0]
    assert (step["step_id"], step["seq"], step["step_type"], step["state"]) == (
        "call-notices",
        1,
        "call",
        "ready",
    )
    assert step["due_at"] is not None and step["lease_owner"] is None
    due = await env.owner_fetch(
        "SELECT count(*) AS n FROM {ns}.step WHERE due_at <= {ns}.now() AND lease_owner IS NULL"
    )
    assert due[0]["n"] == 1

    status = result.status
    assert status["runId"] == result.run_id
    assert status["workflow"] == {
        "id": WORKFLOW,
        "version": "1.0.0",
        "digest": run["package_digest"],
    }
    assert status["state"] == "running" and status["attention"] is False
    assert set(status) == {"runId", "workflow", "state", "attention", "createdAt", "updatedAt"}


async def test_a_failure_midway_leaves_nothing_behind(
    env: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_seal(*args: Any, **kwargs: Any) -> Sealed:
        raise RuntimeError("sealing failed")

    # The run and its bindings are inserted before the input is sealed.
    monkeypatch.setattr(start_module, "seal", broken_seal)
    with pytest.raises(RuntimeError):
        await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S-1"})

    for table in ("run", "binding", "payload", "start_identity", "step"):
        rows = await env.owner_fetch(f"SELECT count(*) AS n FROM {{ns}}.{table}")
        assert rows[0]["n"] == 0, table


async def test_the_same_key_and_input_answer_the_same_run(env: Served) -> None:
    first = await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S-1"})
    again = await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S-1"})

    assert (first.created, again.created) == (True, False)
    assert again.run_id == first.run_id
    assert again.status == first.status
    rows = await env.owner_fetch("SELECT count(*) AS n FROM {ns}.run")
    assert rows[0]["n"] == 1


async def test_another_principal_or_key_starts_another_run(env: Served) -> None:
    first = await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S-1"})
    other_key = await admitter(env).start(ALICE, WORKFLOW, "key-2", {"subjectRef": "S-1"})
    other_principal = await admitter(env).start(BOB, WORKFLOW, "key-1", {"subjectRef": "S-1"})

    ids = {first.run_id, other_key.run_id, other_principal.run_id}
    assert len(ids) == 3
    assert other_key.created and other_principal.created


async def test_the_same_key_with_another_input_conflicts(env: Served) -> None:
    await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S-1"})
    error = await refused(
        "start.conflict", admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": MARKER})
    )
    assert MARKER not in str(error) and MARKER not in json.dumps(error.extra)
    rows = await env.owner_fetch("SELECT count(*) AS n FROM {ns}.run")
    assert rows[0]["n"] == 1


async def _wait_for_lock_waiters(env: Served, expected: int) -> None:
    """Return once ``expected`` sessions wait for a lock on the run table (no sleeping:
    each round is a query; pg_locks shows other roles' waits, pg_stat_activity would not)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        rows = await env.owner_fetch(
            "SELECT count(*) AS n FROM pg_locks "
            "WHERE relation = '{ns}.run'::regclass AND NOT granted"
        )
        if rows[0]["n"] >= expected:
            return
    raise AssertionError(f"{expected} starts never queued on the run table")


async def test_concurrent_identical_starts_make_one_run(env: Served) -> None:

    # Hold the run table so both starts have read "no such identity" and queue on their
    # insert; releasing it lets one win while the other hits the primary key.
    blocker = await migration_connection(env.database)
    try:
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute(f'LOCK TABLE "{env.namespace}".run IN SHARE MODE')
        starts = [
            asyncio.ensure_future(
                admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S"})
            )
            for _ in range(2)
        ]
        await _wait_for_lock_waiters(env, 2)
        await transaction.rollback()
        results = await asyncio.gather(*starts)
    finally:
        await blocker.close()

    assert sorted(result.created for result in results) == [False, True]
    assert results[0].run_id == results[1].run_id
    rows = await env.owner_fetch("SELECT count(*) AS n FROM {ns}.run")
    assert rows[0]["n"] == 1


async def test_many_concurrent_identical_starts_make_one_run(env: Served) -> None:
    results = await asyncio.gather(
        *(admitter(env).start(ALICE, WORKFLOW, "key-9", {"subjectRef": "S"}) for _ in range(5))
    )
    assert sum(result.created for result in results) == 1
    assert len({result.run_id for result in results}) == 1


async def test_an_invalid_input_names_pointers_and_never_values(env: Served) -> None:
    value = {"subjectRef": MARKER * 10, "extra": MARKER}
    error = await refused("input.invalid", admitter(env).start(ALICE, WORKFLOW, "key-1", value))

    errors = error.extra["errors"]
    assert {entry["pointer"] for entry in errors} == {"/subjectRef", "/extra"}
    assert all(set(entry) == {"pointer", "reason"} for entry in errors)
    assert MARKER not in error.detail and MARKER not in json.dumps(error.extra)
    rows = await env.owner_fetch("SELECT count(*) AS n FROM {ns}.run")
    assert rows[0]["n"] == 0


async def test_an_unknown_workflow_is_not_found(env: Served) -> None:
    await refused(
        "workflow.not-found",
        admitter(env).start(ALICE, "no-such-flow", "key-1", {"subjectRef": "S"}),
    )


async def test_the_admission_hold_refuses_starts(env: Served) -> None:
    await env.owner_execute("UPDATE {ns}.hold SET admission_hold = true")
    await refused("admission.held", admitter(env).start(ALICE, WORKFLOW, "k", {"subjectRef": "S"}))


async def test_a_recovery_only_instance_admits_nothing(
    tmp_path: Path, database: DatabaseHandle
) -> None:
    async with served(tmp_path, database, components=("admission",), recovery_only=True) as env:
        await refused(
            "admission.recovery-only",
            admitter(env).start(ALICE, WORKFLOW, "k", {"subjectRef": "S"}),
        )
        rows = await env.owner_fetch("SELECT count(*) AS n FROM {ns}.run")
        assert rows[0]["n"] == 0


async def test_an_erased_run_refuses_its_key(env: Served) -> None:
    first = await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S"})
    # What retention leaves: the identity moved to a tombstone, the payloads gone.
    await env.owner_execute(
        "WITH gone AS (DELETE FROM {ns}.start_identity RETURNING identity, run_id) "
        "INSERT INTO {ns}.tombstone (kind, value, run_id) "
        "SELECT 'start-identity', identity, run_id FROM gone"
    )
    await env.owner_execute("DELETE FROM {ns}.payload WHERE run_id = $1", first.run_id)
    await refused(
        "run.payload-erased", admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S"})
    )


async def test_a_newer_activation_refuses_starts(env: Served) -> None:
    await env.owner_execute("UPDATE {ns}.deployment SET activation_serial = activation_serial + 1")
    await refused(
        "deployment.activation-changed",
        admitter(env).start(ALICE, WORKFLOW, "k", {"subjectRef": "S"}),
    )


async def test_a_malformed_idempotency_key_is_refused(env: Served) -> None:
    for key in ("", "has space", "x" * 256, "é"):
        await refused(
            "request.invalid", admitter(env).start(ALICE, WORKFLOW, key, {"subjectRef": "S"})
        )


async def test_the_stored_input_is_ciphertext(env: Served) -> None:
    await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": MARKER})
    rows = await env.owner_fetch("SELECT nonce, ciphertext FROM {ns}.payload")
    stored = b"".join(bytes(row["nonce"]) + bytes(row["ciphertext"]) for row in rows)
    assert stored and MARKER.encode() not in stored
    # Nor anywhere else a start wrote.
    for table in ("run", "binding", "start_identity", "step"):
        dump = await env.owner_fetch(f"SELECT t::text AS row FROM {{ns}}.{table} t")
        assert all(MARKER not in row["row"] for row in dump), table


async def test_admit_helper_answers_created_and_run_id(env: Served) -> None:
    created, run_id = await admit(
        env.store("admission"), env.runtime, ALICE, WORKFLOW, "key-1", {"subjectRef": "S"}
    )
    again = await admit(
        env.store("admission"), env.runtime, ALICE, WORKFLOW, "key-1", {"subjectRef": "S"}
    )
    assert created is True and again == (False, run_id)
    states = await env.owner_fetch("SELECT state FROM {ns}.run WHERE id = $1", run_id)
    assert states[0]["state"] in RUN_STATES


async def test_a_start_takes_its_times_from_the_test_clock(
    env: Served, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    instant = datetime(2027, 1, 15, 8, 0, 0, 250000, tzinfo=UTC)
    clock_file = tmp_path / "clock"
    write_test_clock(clock_file, instant)
    monkeypatch.setenv(ENV_VAR, str(clock_file))

    result = await admitter(env).start(ALICE, WORKFLOW, "key-1", {"subjectRef": "S"})

    assert result.status["createdAt"] == "2027-01-15T08:00:00.250Z"
    assert result.status["updatedAt"] == "2027-01-15T08:00:00.250Z"
    steps = await env.owner_fetch("SELECT due_at, started_at FROM {ns}.step")
    assert steps[0]["due_at"] == instant and steps[0]["started_at"] == instant
