"""Reconcile, retry-same and cancel against the real TLS PostgreSQL server, with a
development issuer and the Messaging stand-in in-process (CONTRACT §8.5, §10.1–§10.4).

Runs are admitted the way admission admits them; a dispatcher with its own store makes
calls uncertain through the stand-in's fault injection ("fail after processing" for a
command the product processed, "drop before processing" for one it never saw). Recovery
acts through ``run_action`` with its own store and role, exactly as its servicer calls it.
"""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from core.errors import CoordinatorError
from core.products.calls import ConnectionCalls
from core.products.tokens import ConnectionTokens
from core.runtime import Store
from devstack.postgres import DatabaseHandle
from recovery import reads
from recovery.actions import run_action
from recovery.env import RecoveryEnv
from tests.helpers.deployment import (
    migration_connection,
)
from tests.helpers.devstack_kit import FakeSleep
from tests.helpers.dispatching import (
    CLIENT,
    MESSAGING,
    DispatchKit,
    ScriptedProduct,
    dispatch_kit,
    notice_call,
)
from tests.helpers.pinned_clock import T0

pytestmark = pytest.mark.postgres

REASON = "INC-2027-0042"
DAY = 86_400

# ---------------------------------------------------------------------------------- workflows

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"applicantRef": {"type": "string", "maxLength": 64}},
}


def _workflow(
    workflow_id: str,
    connections: dict[str, str],
    outcomes: list[str],
    start: str,
    steps: dict[str, Any],
    on_cancel: str | None = None,
) -> bytes:
    document: dict[str, Any] = {
        "format": "registry-coordinator/workflow/v1",
        "id": workflow_id,
        "version": "1.0.0",
        "description": "A recovery test workflow.",
        "input": INPUT_SCHEMA,
        "connections": connections,
        "outcomes": outcomes,
        "start": start,
    }
    if on_cancel is not None:
        document["onCancel"] = on_cancel
    document["steps"] = steps
    return yaml.safe_dump(document, sort_keys=False).encode()


NOTICES = {"notices": "messaging"}
WORKFLOWS: dict[str, bytes] = {
    # call → finish; no onCancel
    "notice": _workflow(
        "notice",
        NOTICES,
        ["sent"],
        "send",
        {"send": {"call": notice_call(), "next": "sent"}, "sent": {"finish": {"outcome": "sent"}}},
    ),
    # call → timer → finish, with an onCancel path that sends a notice of its own
    "withdrawable": _workflow(
        "withdrawable",
        NOTICES,
        ["sent", "withdrawn"],
        "send",
        {
            "send": {"call": notice_call(), "next": "nap"},
            "nap": {"wait-until": {"afterSeconds": 3600}, "next": "sent"},
            "sent": {"finish": {"outcome": "sent"}},
            "tell": {"call": notice_call("withdrawn-notice"), "next": "told"},
            "told": {"finish": {"outcome": "withdrawn"}},
        },
        on_cancel="tell",
    ),
    # a timer only; no onCancel
    "pause": _workflow(
        "pause",
        {},
        ["woke"],
        "nap",
        {
            "nap": {"wait-until": {"afterSeconds": 3600}, "next": "woke"},
            "woke": {"finish": {"outcome": "woke"}},
        },
    ),
    "register": _workflow(
        "register",
        {"register": "breg-action"},
        ["done"],
        "submit",
        {
            "submit": {
                "call": {
                    "connection": "register",
                    "operation": "submit-action",
                    "input": {
                        "actionType": "test-action",
                        "subjectRef": "${input.applicantRef}",
                        "payload": {},
                    },
                    "output": {"actionId": "${response.actionId}"},
                },
                "next": "done",
            },
            "done": {"finish": {"outcome": "done"}},
        },
    ),
    "review": _workflow(
        "review",
        {"review": "casework-review-producer"},
        ["done"],
        "ask",
        {
            "ask": {
                "call": {
                    "connection": "review",
                    "operation": "create-review-request",
                    "input": {"subjectRef": "${input.applicantRef}", "summary": "Review"},
                    "output": {"reviewId": "${response.reviewId}"},
                },
                "next": "done",
            },
            "done": {"finish": {"outcome": "done"}},
        },
    ),
}


def _connection(kind: str, base_url: str, client_id: str, scopes: list[str]) -> dict[str, Any]:
    return {
        "type": kind,
        "baseUrl": base_url,
        "profile": "test-profile" if kind != "messaging" else "applicant-notices",
        "authorization": {
            "clientId": client_id,
            "signingKeyRef": "secret:file/notices-client.jwk",
            "scopes": scopes,
        },
    }


# ---------------------------------------------------------------------------------- the kit


@dataclass
class Kit(DispatchKit):
    """A deployment of :data:`WORKFLOWS` with the issuer and Messaging stand-in wired in,
    and recovery's own store."""

    recovery: Store

    def env(self, *, recovery_only: bool = False, sleep: Any = None) -> RecoveryEnv:
        config = self.runtime.config
        return RecoveryEnv(
            store=self.recovery,
            keyring=self.keyring,
            admission_key=self.admission_key,
            tokens=ConnectionTokens(config, self.runtime.resolver, self.http),
            http=self.http,
            calls=ConnectionCalls(config, self.runtime.resolver),
            recovery_only=recovery_only,
            sleep=sleep if sleep is not None else FakeSleep(),
        )

    async def start(self, workflow_id: str, run_input: dict[str, Any] | None = None) -> str:
        """Admit a run (of applicant-1 unless ``run_input`` says otherwise); answers its id."""
        return await super().start(workflow_id, run_input or {"applicantRef": "applicant-1"})

    async def actions(self, run_id: str) -> list[tuple[str, str | None]]:
        rows = await self.db.fetch(
            f"SELECT kind, reason FROM {self.ns}.operator_action WHERE run_id = $1 ORDER BY id",
            run_id,
        )
        return [(row["kind"], row["reason"]) for row in rows]

    async def held(self, workflow_id: str = "notice", *, processed: bool = True) -> str:
        """A run whose first call is uncertain: the product processed it (an answer lost
        after processing) or never saw it (the connection dropped before processing)."""
        await self.fault(mode="fail-after" if processed else "drop-before", count=1)
        run_id = await self.start(workflow_id)
        await (await self.dispatcher()).drain()
        assert (await self.step(run_id, "send"))["state"] == "uncertain"
        assert (await self.run(run_id))["state"] == "held"
        return run_id

    async def force_uncertain(self, run_id: str, step_id: str) -> None:
        """Make a step uncertain by hand, as a lost answer would have (no command payload)."""
        await self.db.execute(
            f"UPDATE {self.ns}.step SET state = 'uncertain', effect = 'unknown', due_at = NULL, "
            f"command_key = $3, attempts = 1, first_attempt_at = {self.ns}.now(), "
            f"deadline_at = {self.ns}.now() + interval '60 seconds' "
            "WHERE run_id = $1 AND step_id = $2",
            run_id,
            step_id,
            self.key(run_id, step_id),
        )
        await self.db.execute(
            f"UPDATE {self.ns}.run SET state = 'held', attention = true WHERE id = $1", run_id
        )

    async def snapshot(self, run_id: str, step_id: str, *, hold: bool = False) -> None:
        """Record a restore-hold snapshot of the step in a new epoch (holds set if asked)."""
        epoch = await self.db.fetchval(
            f"UPDATE {self.ns}.hold SET epoch = epoch + 1, execution_hold = $1, "
            "admission_hold = $1 RETURNING epoch",
            hold,
        )
        await self.db.execute(
            f"INSERT INTO {self.ns}.recovery_record (epoch, restore_reason) VALUES ($1, 'INC-1')",
            epoch,
        )
        await self.db.execute(
            f"INSERT INTO {self.ns}.restore_snapshot (epoch, run_id, step_id) VALUES ($1, $2, $3)",
            epoch,
            run_id,
            step_id,
        )

    async def resolution(self, run_id: str, step_id: str) -> str | None:
        value = await self.db.fetchval(
            f"SELECT resolution FROM {self.ns}.restore_snapshot WHERE run_id = $1 "
            "AND step_id = $2 ORDER BY epoch DESC LIMIT 1",
            run_id,
            step_id,
        )
        return None if value is None else str(value)

    async def attention_list(self) -> list[str]:
        listed = await reads.list_runs(
            self.recovery, reads.ListFilter.build(workflows=list(WORKFLOWS), attention="true")
        )
        return [run["runId"] for run in listed["runs"]]


def _connections() -> dict[str, Any]:
    review = _connection(
        "casework-review-producer",
        "https://casework.internal.example.org",
        "coordinator-review",
        ["review-requests:write", "review-requests:read"],
    )
    review["producer"] = "coordinator"
    return {
        "notices": _connection("messaging", MESSAGING, CLIENT, ["messages:send", "receipts:read"]),
        "register": _connection(
            "breg-action", "https://breg.internal.example.org", "coordinator-breg", ["actions"]
        ),
        "review": review,
    }


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Kit]:
    async with dispatch_kit(
        tmp_path, database, workflows=WORKFLOWS, connections=_connections()
    ) as base:
        recovery = Store(base.runtime, "recovery")
        base.stores.append(recovery)
        await recovery.open()
        await recovery.verify()
        # The same kit, with recovery's store; the base kit closes it with its own.
        yield Kit(**{f.name: getattr(base, f.name) for f in fields(base)}, recovery=recovery)


async def refused(code: str, action: Awaitable[Any]) -> CoordinatorError:
    with pytest.raises(CoordinatorError) as caught:
        await action
    assert caught.value.code == code, caught.value
    return caught.value


def act(kit: Kit, run_id: str, action: str, **env: Any) -> Coroutine[Any, Any, dict[str, Any]]:
    return run_action(kit.env(**env), run_id, action, REASON)


def receipt_reads(kit: Kit) -> list[httpx.Request]:
    return [r for r in kit.router.requests if "/receipts/" in r.url.path]


# ----------------------------------------------------------------------------------- reconcile


async def test_a_found_receipt_accepts_the_call_and_the_run_goes_on(kit: Kit) -> None:
    run_id = await kit.held(processed=True)
    await kit.snapshot(run_id, "send")

    answer = await act(kit, run_id, "reconcile")

    assert answer["result"] == "accepted"
    assert (answer["runId"], answer["state"], answer["attention"]) == (run_id, "running", False)
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["ended_at"] is not None) == (
        "completed",
        "accepted",
        True,
    )
    [message_id] = kit.messaging.messages
    assert await kit.payload(run_id, "send", "output") == {"messageId": message_id}
    assert (await kit.payload(run_id, "send", "response"))["messageId"] == message_id
    # The next step is due now, numbered after the call.
    sent = await kit.step(run_id, "sent")
    assert (sent["seq"], sent["state"], sent["due_at"] is not None) == (2, "ready", True)
    assert await kit.resolution(run_id, "send") == "reconciled"
    assert await kit.actions(run_id) == [("reconcile", REASON)]
    # The receipt was read with the connection's token and never resent the command.
    [read] = receipt_reads(kit)
    assert read.url.path == f"/v1/profiles/applicant-notices/receipts/{kit.key(run_id)}"
    assert read.headers["authorization"].startswith("Bearer ")
    assert read.headers["accept"] == "application/json"

    await (await kit.dispatcher()).drain()
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("succeeded", "sent")
    assert (await kit.stats())["processed"] == {kit.key(run_id): 1}


async def test_reconcile_is_allowed_under_the_execution_hold_and_in_recovery_only(
    kit: Kit,
) -> None:
    run_id = await kit.held(processed=True)
    await kit.snapshot(run_id, "send", hold=True)

    answer = await act(kit, run_id, "reconcile", recovery_only=True)

    assert (answer["result"], answer["state"]) == ("accepted", "running")
    assert await kit.resolution(run_id, "send") == "reconciled"
    # Nothing dispatches under the hold: the next step waits for the release.
    assert await (await kit.dispatcher()).drain() == 0
    assert (await kit.step(run_id, "sent"))["state"] == "ready"


async def test_a_receipt_whose_output_does_not_map_fails_the_run_mapping_invalid(
    kit: Kit,
) -> None:
    run_id = await kit.start("notice")
    await kit.force_uncertain(run_id, "send")
    # The receipt's messageId is a number where the catalogue promises a string.
    product = ScriptedProduct((200, {"messageId": 17, "acceptedAt": "2027-03-01T08:00:00Z"}))
    kit.router.add(MESSAGING, product)

    answer = await act(kit, run_id, "reconcile")

    assert answer["result"] == "mapping-invalid"
    assert answer["state"] == "failed" and answer["attention"] is False
    assert answer["failure"] == {
        "kind": "mapping-invalid",
        "failurePath": "/messageId",
        "step": "send",
    }
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("failed", "accepted")
    assert await kit.payload(run_id, "send", "output") is None
    assert await kit.step_ids(run_id) == ["send"]
    [request] = product.requests
    assert request["method"] == "GET"


async def test_a_key_the_product_never_saw_returns_the_step_to_not_sent(kit: Kit) -> None:
    run_id = await kit.held(processed=False)
    await kit.snapshot(run_id, "send")

    answer = await act(kit, run_id, "reconcile")

    assert answer["result"] == "not-sent"
    assert (answer["state"], answer["attention"]) == ("held", True)
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["due_at"]) == ("not-sent", None, None)
    assert send["command_key"] == kit.key(run_id)
    assert await kit.resolution(run_id, "send") == "reconciled"
    assert run_id in await kit.attention_list()
    # Not uncertain any more: a second reconcile is refused.
    await refused("reconcile.refused", act(kit, run_id, "reconcile"))


async def test_an_expired_receipt_changes_nothing_and_the_run_stays_held(kit: Kit) -> None:
    run_id = await kit.held(processed=True)
    await kit.snapshot(run_id, "send")
    before = await kit.step(run_id, "send")
    answer = await kit.messaging.http.post(
        f"{MESSAGING}/dev/clock", json={"advanceSeconds": 8 * DAY}
    )
    assert answer.status_code == 200

    error = await refused("receipt.expired", act(kit, run_id, "reconcile"))

    assert "stays held" in error.detail
    assert dict(await kit.step(run_id, "send")) == dict(before)
    run = await kit.run(run_id)
    assert (run["state"], run["attention"]) == ("held", True)
    # The operator has looked: the snapshot row is left for retry-same or cancel.
    assert await kit.resolution(run_id, "send") == "retry"
    assert await kit.actions(run_id) == []


@pytest.mark.parametrize("answer", [(500, {"code": "internal-error"}), (404, {"code": "x"})])
async def test_an_unreadable_receipt_is_service_unavailable_and_changes_nothing(
    kit: Kit, answer: tuple[int, dict[str, str]]
) -> None:
    run_id = await kit.start("notice")
    await kit.force_uncertain(run_id, "send")
    kit.router.add(MESSAGING, ScriptedProduct(answer))

    await refused("service.unavailable", act(kit, run_id, "reconcile"))

    assert (await kit.step(run_id, "send"))["state"] == "uncertain"
    kit.router.remove(MESSAGING)
    await refused("service.unavailable", act(kit, run_id, "reconcile"))
    assert (await kit.run(run_id))["state"] == "held"


@pytest.mark.parametrize(("workflow", "step"), [("register", "submit"), ("review", "ask")])
async def test_calls_without_receipts_cannot_be_reconciled(
    kit: Kit, workflow: str, step: str
) -> None:
    run_id = await kit.start(workflow)
    await kit.force_uncertain(run_id, step)
    await kit.snapshot(run_id, step)

    await refused("reconcile.unsupported", act(kit, run_id, "reconcile"))

    assert (await kit.step(run_id, step))["state"] == "uncertain"
    assert await kit.resolution(run_id, step) == "retry"
    assert receipt_reads(kit) == []


async def test_reconcile_refuses_a_run_without_an_uncertain_step(kit: Kit) -> None:
    run_id = await kit.start("notice")
    await refused("reconcile.refused", act(kit, run_id, "reconcile"))
    assert (await kit.step(run_id, "send"))["state"] == "ready"


@pytest.mark.parametrize(
    "change",
    [
        # another operator's reconcile settled it
        "state = 'not-sent', effect = NULL",
        # a write that leaves every value as it was: only the row version tells
        "state = state",
    ],
)
async def test_a_step_that_changes_while_reconcile_waits_for_its_lock_is_raced(
    kit: Kit, database: DatabaseHandle, change: str
) -> None:
    run_id = await kit.start("notice")
    await kit.force_uncertain(run_id, "send")
    holder = await migration_connection(database)
    try:
        locking = holder.transaction()
        await locking.start()
        await holder.execute(
            f"SELECT 1 FROM {kit.ns}.step WHERE run_id = $1 AND step_id = 'send' FOR UPDATE",
            run_id,
        )
        holder_pid = await holder.fetchval("SELECT pg_backend_pid()")
        reconciling = asyncio.create_task(act(kit, run_id, "reconcile"))
        # Wait until the reconcile's backend is blocked by exactly this lock.
        async with asyncio.timeout(10):
            while not await kit.db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
                holder_pid,
            ):
                assert not reconciling.done(), "reconcile did not wait for the step lock"
                await asyncio.sleep(0.01)
        await holder.execute(
            f"UPDATE {kit.ns}.step SET {change} WHERE run_id = $1 AND step_id = 'send'", run_id
        )
        await locking.commit()
        await refused("reconcile.raced", reconciling)
    finally:
        await holder.close()
    assert await kit.actions(run_id) == []
    assert len(receipt_reads(kit)) == 1


# ------------------------------------------------------------------------- shared refusals


async def test_actions_refuse_a_missing_run_a_changed_binding_and_bad_requests(
    kit: Kit,
) -> None:
    for action in ("reconcile", "retry-same", "cancel"):
        await refused("run.not-found", act(kit, "no-such-run", action))
    run_id = await kit.held(processed=True)
    await kit.db.execute(
        f"UPDATE {kit.ns}.binding SET base_url = 'https://elsewhere.example.org' WHERE run_id = $1",
        run_id,
    )
    for action in ("reconcile", "retry-same", "cancel"):
        await refused("binding.live-conflict", act(kit, run_id, action))
    await refused("request.invalid", run_action(kit.env(), run_id, "undo", REASON))
    for reason in ("", "has space", "x" * 129, "naïve"):
        await refused("request.invalid", run_action(kit.env(), run_id, "cancel", reason))
    assert await kit.actions(run_id) == []
    assert receipt_reads(kit) == []


async def test_stored_rows_that_disagree_are_a_refusal_of_the_action_not_a_503(kit: Kit) -> None:
    # Asking again later cannot mend a run whose rows contradict each other, so the answer
    # is the action's own 409, never "service unavailable, retry later".
    run_id = await kit.start("notice")
    await kit.force_uncertain(run_id, "send")
    await kit.db.execute(f"DELETE FROM {kit.ns}.binding WHERE run_id = $1", run_id)
    error = await refused("reconcile.refused", act(kit, run_id, "reconcile"))
    assert "no binding for connection 'notices'" in error.detail

    # An uncertain step that is not a call of the run's workflow (its finish step, here).
    other = await kit.start("notice")
    await kit.force_uncertain(other, "send")
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET step_id = 'sent' WHERE run_id = $1 AND step_id = 'send'",
        other,
    )
    for action, code in (("reconcile", "reconcile.refused"), ("retry-same", "retry.refused")):
        error = await refused(code, act(kit, other, action))
        assert "step sent is not a call of the run's workflow" in error.detail
    assert await kit.actions(run_id) == [] and await kit.actions(other) == []
    assert receipt_reads(kit) == []


async def test_an_erased_run_cannot_be_reconciled_retried_or_cancelled(kit: Kit) -> None:
    run_id = await kit.held(processed=True)
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'cancelled', ended_at = {kit.ns}.now(), "
        f"erased_at = {kit.ns}.now() WHERE id = $1",
        run_id,
    )
    await refused("run.payload-erased", act(kit, run_id, "reconcile"))
    await refused("run.payload-erased", act(kit, run_id, "retry-same"))
    await refused("cancel.refused", act(kit, run_id, "cancel"))


# --------------------------------------------------------------------------------- retry-same


async def test_retry_same_refuses_in_order(
    kit: Kit, fake_clock: Callable[[datetime], None]
) -> None:
    run_id = await kit.held(processed=True)

    error = await refused("retry.refused", act(kit, run_id, "retry-same", recovery_only=True))
    assert "--recovery-only" in error.detail
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true")
    await refused("execution.held", act(kit, run_id, "retry-same"))
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = false")

    fake_clock(T0 + timedelta(seconds=60))
    error = await refused("retry.refused", act(kit, run_id, "retry-same"))
    assert "deadline" in error.detail
    fake_clock(T0 + timedelta(days=7, seconds=1))
    error = await refused("retry.refused", act(kit, run_id, "retry-same"))
    assert "Messaging keeps idempotency keys for 7 days" in error.detail

    fresh = await kit.start("notice")
    error = await refused("retry.refused", act(kit, fresh, "retry-same"))
    assert "no held call" in error.detail
    await kit.db.execute(
        f"UPDATE {kit.ns}.run SET state = 'cancelled', ended_at = {kit.ns}.now() WHERE id = $1",
        run_id,
    )
    error = await refused("retry.refused", act(kit, run_id, "retry-same"))
    assert "ended" in error.detail
    send = await kit.step(run_id, "send")
    assert (send["state"], send["attempts"]) == ("uncertain", 1)
    assert await kit.actions(run_id) == []


async def test_retry_same_of_a_not_sent_call_sends_the_same_command_under_the_same_key(
    kit: Kit,
) -> None:
    run_id = await kit.held(processed=False)
    assert (await act(kit, run_id, "reconcile"))["result"] == "not-sent"
    before = await kit.step(run_id, "send")
    dispatcher = await kit.dispatcher()

    async def dispatch(seconds: float) -> None:
        # Stands in for the wait between polls: the dispatcher gets its turn.
        await dispatcher.run_once()

    answer = await act(kit, run_id, "retry-same", sleep=dispatch)

    assert answer["result"] == "accepted"
    # The call's settling statement ran the finish after it: the run is over.
    assert (answer["state"], answer["attention"]) == ("succeeded", False)
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["attempts"]) == ("completed", "accepted", 2)
    assert (send["command_payload_id"], send["command_key"]) == (
        before["command_payload_id"],
        before["command_key"],
    )
    posts = [r for r in kit.router.requests if r.method == "POST" and "/messages" in r.url.path]
    assert [r.headers["idempotency-key"] for r in posts] == [kit.key(run_id)] * 2
    assert posts[0].content == posts[1].content
    assert (await kit.stats())["processed"] == {kit.key(run_id): 1}
    assert [kind for kind, _ in await kit.actions(run_id)] == ["reconcile", "retry-same"]

    await dispatcher.drain()
    assert (await kit.run(run_id))["state"] == "succeeded"


async def test_retry_same_of_a_processed_call_is_answered_idempotently(kit: Kit) -> None:
    run_id = await kit.held(processed=True)
    await kit.snapshot(run_id, "send")
    dispatcher = await kit.dispatcher()

    async def dispatch(seconds: float) -> None:
        await dispatcher.run_once()

    answer = await act(kit, run_id, "retry-same", sleep=dispatch)

    assert answer["result"] == "accepted"
    stats = await kit.stats()
    assert stats["processed"] == {kit.key(run_id): 1}
    assert stats["received"] == {kit.key(run_id): 2}
    assert await kit.resolution(run_id, "send") == "retry"
    [message_id] = kit.messaging.messages
    assert await kit.payload(run_id, "send", "output") == {"messageId": message_id}


async def test_retry_same_answers_uncertain_when_the_resend_is_lost_again(kit: Kit) -> None:
    run_id = await kit.held(processed=True)
    await kit.fault(mode="fail-after", count=1)
    dispatcher = await kit.dispatcher()

    async def dispatch(seconds: float) -> None:
        await dispatcher.run_once()

    answer = await act(kit, run_id, "retry-same", sleep=dispatch)

    assert answer["result"] == "uncertain"
    assert (answer["state"], answer["attention"]) == ("held", True)
    assert (await kit.step(run_id, "send"))["attempts"] == 2


async def test_retry_same_answers_pending_while_no_dispatcher_answers(kit: Kit) -> None:
    run_id = await kit.held(processed=True)
    await kit.snapshot(run_id, "send")
    before = await kit.step(run_id, "send")
    sleep = FakeSleep()

    answer = await act(kit, run_id, "retry-same", sleep=sleep)

    assert answer["result"] == "pending"
    assert (answer["state"], answer["attention"]) == ("running", False)
    assert len(sleep.calls) == 200 and set(sleep.calls) == {0.05}
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"], send["lease_owner"]) == ("ready", "unknown", None)
    assert send["due_at"] is not None
    assert (send["command_payload_id"], send["command_key"], send["attempts"]) == (
        before["command_payload_id"],
        before["command_key"],
        1,
    )
    assert await kit.resolution(run_id, "send") == "retry"
    assert await kit.actions(run_id) == [("retry-same", REASON)]
    assert run_id not in await kit.attention_list()


# ------------------------------------------------------------------------------------- cancel


async def test_cancel_without_on_cancel_ends_a_waiting_run_at_once(kit: Kit) -> None:
    run_id = await kit.start("pause")
    await (await kit.dispatcher()).drain()
    assert (await kit.step(run_id, "nap"))["state"] == "waiting"

    answer = await act(kit, run_id, "cancel")

    assert answer["result"] == "cancelled"
    assert answer["state"] == "cancelled" and "outcome" not in answer
    assert "endedAt" in answer and "cancelling" not in answer
    nap = await kit.step(run_id, "nap")
    assert (nap["state"], nap["due_at"], nap["ended_at"] is not None) == ("cancelled", None, True)
    assert await kit.actions(run_id) == [("cancel", REASON)]
    # An ended run cannot be cancelled again.
    await refused("cancel.refused", act(kit, run_id, "cancel"))
    assert await kit.actions(run_id) == [("cancel", REASON)]


async def test_cancel_with_on_cancel_takes_its_path_and_ends_cancelled_with_its_outcome(
    kit: Kit,
) -> None:
    run_id = await kit.start("withdrawable")
    dispatcher = await kit.dispatcher()
    await dispatcher.drain()
    assert (await kit.step(run_id, "nap"))["state"] == "waiting"

    answer = await act(kit, run_id, "cancel")

    assert answer["result"] == "cancelling"
    assert (answer["state"], answer["cancelling"]) == ("running", True)
    assert (await kit.step(run_id, "nap"))["state"] == "cancelled"
    tell = await kit.step(run_id, "tell")
    assert (tell["seq"], tell["state"]) == (3, "ready")
    run = await kit.run(run_id)
    assert (run["cancelling"], run["cancel_seq"]) == (True, 3)
    # Cancelling again answers the same, and is logged again.
    again = await act(kit, run_id, "cancel")
    assert again["result"] == "cancelling"
    assert await kit.actions(run_id) == [("cancel", REASON), ("cancel", REASON)]

    await dispatcher.drain()
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("cancelled", "withdrawn")
    assert await kit.step_ids(run_id) == ["send", "nap", "tell", "told"]


async def test_cancel_keeps_an_uncertain_step_and_attention_until_it_is_reconciled(
    kit: Kit,
) -> None:
    run_id = await kit.held(processed=True)
    await kit.snapshot(run_id, "send")

    answer = await act(kit, run_id, "cancel", recovery_only=True)

    assert (answer["result"], answer["state"], answer["attention"]) == (
        "cancelled",
        "cancelled",
        True,
    )
    send = await kit.step(run_id, "send")
    assert (send["state"], send["effect"]) == ("uncertain", "unknown")
    assert await kit.resolution(run_id, "send") == "cancel"
    assert run_id in await kit.attention_list()
    await refused("retry.refused", act(kit, run_id, "retry-same"))

    # Reconcile settles the step of the ended run without going on from it.
    settled = await act(kit, run_id, "reconcile")
    assert (settled["result"], settled["state"], settled["attention"]) == (
        "accepted",
        "cancelled",
        False,
    )
    assert (await kit.step(run_id, "send"))["effect"] == "accepted"
    assert await kit.step_ids(run_id) == ["send"]
    assert run_id not in await kit.attention_list()


async def test_an_abandoned_uncertain_step_is_settled_aside_while_the_cancel_path_runs(
    kit: Kit,
) -> None:
    run_id = await kit.held("withdrawable", processed=False)

    answer = await act(kit, run_id, "cancel")

    assert (answer["result"], answer["state"], answer["attention"]) == (
        "cancelling",
        "running",
        True,
    )
    assert (await kit.step(run_id, "tell"))["seq"] == 2
    await refused("retry.refused", act(kit, run_id, "retry-same"))
    settled = await act(kit, run_id, "reconcile")
    # The product never saw it, and the run no longer wants it sent.
    assert (settled["result"], settled["attention"]) == ("not-sent", False)
    assert (await kit.step(run_id, "send"))["state"] == "cancelled"
    assert await kit.step_ids(run_id) == ["send", "tell"]


async def test_cancel_leaves_a_leased_step_to_its_dispatcher(kit: Kit) -> None:
    run_id = await kit.start("notice")
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET lease_owner = 'dispatcher-x', "
        f"lease_expires_at = {kit.ns}.now() + interval '30 seconds', lease_epoch = 0 "
        "WHERE run_id = $1",
        run_id,
    )

    answer = await act(kit, run_id, "cancel")

    assert (answer["result"], answer["state"], answer["cancelling"]) == (
        "cancelling",
        "running",
        True,
    )
    send = await kit.step(run_id, "send")
    assert (send["state"], send["lease_owner"]) == ("ready", "dispatcher-x")
    # Once the held step is settled and nothing is left, a repeated cancel ends the run.
    await kit.db.execute(
        f"UPDATE {kit.ns}.step SET state = 'completed', effect = 'accepted', due_at = NULL, "
        f"ended_at = {kit.ns}.now(), lease_owner = NULL, lease_expires_at = NULL, "
        "lease_epoch = NULL WHERE run_id = $1",
        run_id,
    )
    again = await act(kit, run_id, "cancel")
    assert (again["result"], again["state"]) == ("cancelled", "cancelled")


async def test_cancel_is_allowed_under_the_execution_hold(kit: Kit) -> None:
    run_id = await kit.start("withdrawable")
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = true")

    answer = await act(kit, run_id, "cancel")

    assert answer["result"] == "cancelling"
    assert (await kit.step(run_id, "send"))["state"] == "cancelled"
    assert (await kit.step(run_id, "tell"))["state"] == "ready"
    # The cancel path dispatches only after the release.
    dispatcher = await kit.dispatcher()
    assert await dispatcher.drain() == 0
    await kit.db.execute(f"UPDATE {kit.ns}.hold SET execution_hold = false")
    await dispatcher.drain()
    run = await kit.run(run_id)
    assert (run["state"], run["outcome"]) == ("cancelled", "withdrawn")
