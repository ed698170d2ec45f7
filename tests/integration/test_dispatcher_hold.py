"""Restore holds and an operator's retry-same as the dispatcher meets them (CONTRACT §10.2,
§10.5), against the real PostgreSQL server with the issuer and Messaging in-process.

A lease taken before a restore-hold raised the hold epoch can neither prepare nor settle:
whatever its execution learnt is left unwritten, and one log line with the code
``restore.lease-incompatible`` says so. Recovery's writes are simulated as the schema
owner, exactly as the design gives them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from core import clock
from core.payloads import seal_json
from devstack.postgres import DatabaseHandle
from tests.helpers.base_kit import ISSUER
from tests.helpers.dispatching import DispatchKit, ScriptedProduct, dispatch_kit
from tests.helpers.pinned_clock import T0

pytestmark = pytest.mark.postgres

ACCEPTED_BODY = {"messageId": "msg-resent", "acceptedAt": "2027-03-01T08:00:00.000Z"}
LOGGER = "coordinator.dispatcher"
CODE = "restore.lease-incompatible"


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


class TokenGate:
    """The issuer, holding token requests until opened: the step is claimed, not prepared."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/token":
            self.entered.set()
            await self.opened.wait()
        await self.app(scope, receive, send)


async def restore_hold(kit: DispatchKit, run_id: str | None = None) -> None:
    """Both holds set and a new epoch; with ``run_id``, that run's leased call step is
    snapshotted as restore-hold does it: uncertain, effect unknown, lease cleared, run held."""
    async with kit.db.transaction():
        await clock.apply_to(kit.db)
        await kit.db.execute(
            f"UPDATE {kit.ns}.hold SET execution_hold = true, admission_hold = true, "
            "epoch = epoch + 1"
        )
        if run_id is not None:
            await kit.db.execute(
                f"UPDATE {kit.ns}.step SET state = 'uncertain', effect = 'unknown', "
                "due_at = NULL, lease_owner = NULL, lease_expires_at = NULL, "
                f"lease_epoch = NULL, updated_at = {kit.ns}.now() "
                "WHERE run_id = $1 AND lease_owner IS NOT NULL",
                run_id,
            )
            await kit.db.execute(
                f"UPDATE {kit.ns}.run SET state = 'held', attention = true, "
                f"updated_at = {kit.ns}.now() WHERE id = $1",
                run_id,
            )


async def rows(kit: DispatchKit, run_id: str) -> tuple[Any, ...]:
    """Everything the dispatcher could have written for a run: run, steps and payloads."""
    run = dict(await kit.run(run_id))
    steps = [
        dict(row)
        for row in await kit.db.fetch(
            f"SELECT * FROM {kit.ns}.step WHERE run_id = $1 ORDER BY seq", run_id
        )
    ]
    payloads = [
        (row["step_id"], row["purpose"])
        for row in await kit.db.fetch(
            f"SELECT step_id, purpose FROM {kit.ns}.payload WHERE run_id = $1 ORDER BY id", run_id
        )
    ]
    return run, steps, payloads


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == LOGGER and record.levelno >= logging.WARNING
    ]


# ------------------------------------------------------------------- leases and epochs


@pytest.mark.parametrize("snapshotted", [True, False], ids=["restore-hold", "epoch-only"])
async def test_an_answer_to_a_lease_from_before_a_restore_hold_writes_nothing(
    kit: DispatchKit, caplog: pytest.LogCaptureFixture, snapshotted: bool
) -> None:
    await kit.fault(mode="hang-after", count=1)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-h"})
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await kit.messaging.faults.wait_hanging(1)
    await restore_hold(kit, run_id if snapshotted else None)
    held = await rows(kit, run_id)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        kit.messaging.faults.release()  # the product accepted it; the answer comes now
        assert await working == 1

    # The step does not advance: it stays exactly as the restore-hold left it.
    assert await rows(kit, run_id) == held
    send = await kit.step(run_id, "send")
    if snapshotted:
        assert (send["state"], send["effect"], send["lease_owner"]) == (
            "uncertain",
            "unknown",
            None,
        )
    else:
        assert (send["state"], send["effect"]) == ("prepared", None)
    assert await kit.step_ids(run_id) == ["send"]
    [line] = warnings_of(caplog)
    assert line.startswith(f"{CODE}: ")
    assert run_id in line and "send" in line
    assert "applicant-h" not in line and "msg-" not in line


async def test_a_lease_from_before_a_restore_hold_cannot_prepare(
    kit: DispatchKit, caplog: pytest.LogCaptureFixture
) -> None:
    gate = TokenGate(kit.issuer.app)
    kit.router.add(ISSUER, gate)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-q"})
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await gate.entered.wait()
    await restore_hold(kit)
    held = await rows(kit, run_id)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        gate.opened.set()
        assert await working == 1

    assert await rows(kit, run_id) == held  # no command, no key, not even the lease given up
    assert (await kit.stats())["received"] == {}
    [line] = warnings_of(caplog)
    assert line.startswith(f"{CODE}: ") and run_id in line


async def test_an_ordinary_lost_lease_is_not_called_a_restore_hold(
    kit: DispatchKit, caplog: pytest.LogCaptureFixture
) -> None:
    await kit.fault(mode="hang-after", count=1)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-o"})
    working = asyncio.create_task(dispatcher.run_once())
    async with asyncio.timeout(10):
        await kit.messaging.faults.wait_hanging(1)
    # Another replica found the lease expired and took the step over, in the same epoch.
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET lease_owner = 'another-replica' WHERE run_id = $1", run_id
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        kit.messaging.faults.release()
        assert await working == 1

    send = await kit.step(run_id, "send")
    assert (send["state"], send["lease_owner"]) == ("prepared", "another-replica")
    [line] = warnings_of(caplog)
    assert CODE not in line and "lease was lost" in line


async def test_nothing_is_claimed_under_the_hold_and_later_leases_carry_the_new_epoch(
    kit: DispatchKit,
) -> None:
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-e"})
    await restore_hold(kit)
    assert await dispatcher.claimer.claim(10) == []

    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = false")
    [claimed] = await dispatcher.claimer.claim(10)
    assert claimed.lease_epoch == 1
    assert (await kit.step(run_id, "send"))["lease_epoch"] == 1
    await dispatcher.settler.unprepare(claimed)
    await dispatcher.drain()
    assert (await kit.run(run_id))["state"] == "succeeded"


# -------------------------------------------------------------------- retry-same


async def held_after_an_uncertain_answer(kit: DispatchKit, product: ScriptedProduct) -> str:
    """A run whose call got an uncertain first answer: its step is uncertain, run held."""
    kit.product(product)
    dispatcher = await kit.dispatcher()
    run_id = await kit.start("notice", {"applicantRef": "applicant-s"})
    await dispatcher.drain()
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["command_key"]) == (
        "uncertain",
        "unknown",
        kit.key(run_id),
    )
    assert send["command_payload_id"] is not None
    return run_id


async def retry_same(kit: DispatchKit, run_id: str) -> None:
    """Recovery's retry-same writes: the step ready and due now, command and key kept,
    effect unchanged; the run running without attention."""
    async with kit.db.transaction():
        await clock.apply_to(kit.db)
        await kit.db.execute(
            f"UPDATE {kit.ns}.step SET state = 'ready', due_at = {kit.ns}.now(), "
            "lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL, "
            f"updated_at = {kit.ns}.now() WHERE run_id = $1 AND step_id = 'send'",
            run_id,
        )
        await kit.db.execute(
            f"UPDATE {kit.ns}.run SET state = 'running', attention = false, "
            f"updated_at = {kit.ns}.now() WHERE id = $1",
            run_id,
        )


async def replace_stored_command(kit: DispatchKit, run_id: str, command: Any) -> None:
    """Seal ``command`` into the step's stored command payload (no mapping could make it)."""
    sealed = seal_json(kit.keyring, kit.deployment.namespace, run_id, "command", command)
    await kit.db.execute(
        f"UPDATE {kit.ns}.payload SET key_version = $2, nonce = $3, ciphertext = $4 "
        f"WHERE id = (SELECT command_payload_id FROM {kit.ns}.step "
        "WHERE run_id = $1 AND step_id = 'send')",
        run_id,
        sealed.key_version,
        sealed.nonce,
        sealed.ciphertext,
    )


def sent(product: ScriptedProduct) -> list[tuple[str, Any]]:
    return [
        (request["headers"]["idempotency-key"], json.loads(request["body"]))
        for request in product.requests
    ]


async def test_a_retry_same_sends_the_stored_command_under_its_key(kit: DispatchKit) -> None:
    product = ScriptedProduct((500, {"code": "internal-error"}), (202, ACCEPTED_BODY))
    run_id = await held_after_an_uncertain_answer(kit, product)
    stored = {"template": "test-notice", "recipientRef": "stored-only", "parameters": {}}
    await replace_stored_command(kit, run_id, stored)
    await retry_same(kit, run_id)
    await (await kit.dispatcher()).drain()

    key = kit.key(run_id)
    [(first_key, _), resent] = sent(product)
    assert first_key == key
    assert resent == (key, stored)  # exactly the stored command: nothing was mapped anew
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["attempts"], send["command_key"]) == (
        "completed",
        "accepted",
        2,
        key,
    )
    assert await kit.payload(run_id, "send", "response") == ACCEPTED_BODY
    assert await kit.payload(run_id, "send", "output") == {"messageId": "msg-resent"}
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"], run["attention"]) == ("succeeded", "sent", False)


async def test_an_uncertain_answer_to_a_retry_same_holds_the_run_again(kit: DispatchKit) -> None:
    product = ScriptedProduct((500, {"code": "internal-error"}))
    run_id = await held_after_an_uncertain_answer(kit, product)
    await retry_same(kit, run_id)
    await (await kit.dispatcher()).drain()

    assert len(product.requests) == 2
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["attempts"], send["due_at"]) == (
        "uncertain",
        "unknown",
        2,
        None,
    )
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("held", True)
    assert await kit.step_ids(run_id) == ["send"]


async def test_a_retryable_answer_to_a_retry_same_retries_with_the_same_command_and_key(
    kit: DispatchKit, fake_clock: Callable[[datetime], None]
) -> None:
    product = ScriptedProduct(
        (500, {"code": "internal-error"}),
        (503, {"code": "service.unavailable"}),
        (202, ACCEPTED_BODY),
    )
    run_id = await held_after_an_uncertain_answer(kit, product)
    await retry_same(kit, run_id)
    dispatcher = await kit.dispatcher()
    await dispatcher.drain()

    send = await kit.step(run_id, "send")
    # Whether the first send took effect is still unknown; the step is simply due again.
    assert (send["state"], send["effect"], send["attempts"]) == ("ready", "unknown", 2)
    assert send["due_at"] > T0
    fake_clock(send["due_at"])
    await dispatcher.drain()

    keys_and_bodies = sent(product)
    assert len(keys_and_bodies) == 3 and len(set(map(json.dumps, keys_and_bodies))) == 1
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["attempts"]) == ("completed", "accepted", 3)
    assert (await kit.run(run_id))["state"] == "succeeded"
