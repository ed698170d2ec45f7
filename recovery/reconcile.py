"""reconcile: settle an uncertain call from the product's receipt (CONTRACT §10.1).

The order of things:

1. Look (read-only): the run exists, still holds its payloads, depends on unchanged
   connection settings, and has an uncertain call step (else ``reconcile.refused``) whose
   operation keeps receipts (else ``reconcile.unsupported``: BReg Actions and Casework).
2. Read the receipt of the step's command key, outside any transaction, with the
   connection's own token. A receipt too old for the product (``receipt.expired``) or no
   readable answer (``service.unavailable``) changes nothing: the run stays held.
3. In one transaction: lock the step and refuse with ``reconcile.raced`` if it is no longer
   the version step 1 read (another operator, a concurrent reconcile). Then lock the run and
   write what the receipt proves:
   - found: keep the receipt as the step's response and map the output exactly as the
     dispatcher maps a live answer. The step completes with effect ``accepted`` and the run
     goes on at the step's ``next`` — or, when the mapping fails, the step fails (effect
     still accepted) and the run fails ``mapping-invalid``. On an ended run, or for a step a
     cancel abandoned, only the step is settled.
   - not seen: the command never arrived. The step is ``not-sent`` and the run stays held
     for an operator to retry the same command or cancel; for a step a cancel abandoned
     there is nothing left to decide, so it ends ``cancelled`` as the cancel would have
     ended it.
   The step's snapshot rows of the current hold epoch are marked ``reconciled`` and the
   action is logged.

A refusal that means "nothing more can be learnt from the product" (``reconcile.unsupported``,
``receipt.expired``) marks the step's unresolved snapshot rows ``retry`` in a small
transaction of its own before it is raised: the operator has reviewed the step, and what
remains is to retry it or cancel the run after the release.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from core.bindings import Binding
from core.codes import Code
from core.errors import CoordinatorError
from core.payloads import build_scope, seal_json
from core.products.receipts import EXPIRED, FOUND, UNAVAILABLE, Receipt, read_receipt, receipt_url
from core.states import Effect, RunState, StepState
from core.workflow.catalogue import connection_type
from core.workflow.mapping import map_output
from core.workflow.model import step_kind
from recovery.env import RECEIPT_TIMEOUT_SECONDS, RecoveryEnv
from recovery.targets import (
    UNCERTAIN,
    HeldCall,
    abandoned,
    answer,
    held_call,
    in_transaction,
    log_action,
    looking,
    read_action_run,
    read_held_step,
    resolve_snapshot,
)

log = logging.getLogger("coordinator.recovery")


def _product(call: HeldCall) -> str:
    kind = connection_type(call.connection_type)
    return kind.product if kind is not None else call.connection_type


async def _leave_for_retry(env: RecoveryEnv, run_id: str, step_id: str) -> None:
    async def mark(conn: asyncpg.Connection) -> None:
        await resolve_snapshot(conn, env, run_id, step_id, "retry", overwrite=False)

    await in_transaction(env, mark)


async def _read(env: RecoveryEnv, call: HeldCall, binding: Binding, key: str) -> Receipt:
    try:
        url = receipt_url(binding.base_url, call.operation, binding.profile, key)
    except ValueError:
        return Receipt(UNAVAILABLE, "the connection's profile is unfit for a URL path")
    connection = call.definition.connection
    return await read_receipt(
        env.http,
        env.tokens,
        connection,
        url,
        timeout=env.calls.timeout(connection, RECEIPT_TIMEOUT_SECONDS),
        tls=env.calls.tls(connection),
    )


async def reconcile(env: RecoveryEnv, run_id: str, reason: str) -> dict[str, Any]:
    """Settle the run's uncertain call from its receipt; see the module docstring."""
    queries = env.store.queries
    async with looking(env) as conn:
        run = await read_action_run(conn, env, run_id, refuse_erased=True)
        step = await read_held_step(conn, env, run_id, UNCERTAIN)
        if step is None:
            raise CoordinatorError(Code.RECONCILE_REFUSED, "the run has no uncertain call")
        call = await held_call(conn, env, run, step)
        binding_row = await queries.recovery_binding_read(
            conn, run_id=run_id, connection=call.definition.connection
        )
    if not call.operation.has_receipts:
        await _leave_for_retry(env, run_id, step.step_id)
        raise CoordinatorError(
            Code.RECONCILE_UNSUPPORTED,
            f"{_product(call)} keeps no receipts of {call.operation.name}; "
            "retry the same command or cancel the run",
        )
    if binding_row is None:
        raise CoordinatorError(
            Code.SERVICE_UNAVAILABLE,
            f"the run has no binding for connection '{call.definition.connection}'",
        )

    receipt = await _read(env, call, Binding.from_row(binding_row), step.key(env, run_id))
    log.info("reconcile of step %s of run %s: receipt %s", step.step_id, run_id, receipt.reason)
    if receipt.kind == EXPIRED:
        await _leave_for_retry(env, run_id, step.step_id)
        raise CoordinatorError(
            Code.RECEIPT_EXPIRED,
            f"{_product(call)} no longer holds receipts that old; that does not show the "
            "command was never sent, and the run stays held",
        )
    if receipt.kind == UNAVAILABLE:
        raise CoordinatorError(
            Code.SERVICE_UNAVAILABLE, "the product's receipt could not be read; the run stays held"
        )

    async def settle(conn: asyncpg.Connection) -> dict[str, Any]:
        locked = await queries.recovery_step_lock(conn, run_id=run_id, step_id=step.step_id)
        if not step.unchanged(locked):
            raise CoordinatorError(
                Code.RECONCILE_RACED, "the step changed while the receipt was read; look again"
            )
        run_row = await queries.recovery_run_lock(conn, run_id=run_id)
        assert run_row is not None  # run rows are never deleted
        leads_on = not run_row["ended"] and not abandoned(
            bool(run_row["cancelling"]), run_row["cancel_seq"], step.seq
        )
        if receipt.kind == FOUND:
            result = await _accepted(
                conn, env, run_id, call, run_row, receipt.body, leads_on=leads_on
            )
        else:
            result = await _not_sent(conn, env, run_id, step.step_id, leads_on=leads_on)
        await resolve_snapshot(conn, env, run_id, step.step_id, "reconciled", overwrite=True)
        await log_action(conn, env, run_id, "reconcile", reason)
        return await answer(conn, env, run_id, result)

    return await in_transaction(env, settle)


async def _keep(
    conn: asyncpg.Connection, env: RecoveryEnv, run_id: str, step_id: str, purpose: str, value: Any
) -> None:
    sealed = seal_json(env.keyring, env.namespace, run_id, purpose, value)
    await env.store.queries.recovery_payload_insert(
        conn,
        run_id=run_id,
        step_id=step_id,
        purpose=purpose,
        key_version=sealed.key_version,
        nonce=sealed.nonce,
        ciphertext=sealed.ciphertext,
    )


async def _settled_aside(conn: asyncpg.Connection, env: RecoveryEnv, run_id: str) -> None:
    """After settling a step the run does not go on from: recompute its attention, and end
    a cancelling run without an onCancel path once nothing of it is left to work on."""
    await env.store.queries.recovery_run_attention(conn, run_id=run_id)
    await env.store.queries.recovery_run_cancel_end(conn, run_id=run_id)


async def _accepted(
    conn: asyncpg.Connection,
    env: RecoveryEnv,
    run_id: str,
    call: HeldCall,
    run_row: asyncpg.Record,
    receipt: dict[str, Any] | None,
    *,
    leads_on: bool,
) -> str:
    queries = env.store.queries
    step_id = call.step.step_id
    await _keep(conn, env, run_id, step_id, "response", receipt)
    scope = build_scope(
        env.keyring,
        env.namespace,
        run_id,
        run_row["created_at"],
        await queries.recovery_scope_payloads(conn, run_id=run_id),
    )
    mapped = map_output(call.operation, call.definition.output, scope, receipt)
    if not mapped.ok:
        await queries.recovery_step_end(
            conn, run_id=run_id, step_id=step_id, state=StepState.FAILED, effect=Effect.ACCEPTED
        )
        if leads_on:
            await queries.recovery_run_end(
                conn,
                run_id=run_id,
                state=RunState.FAILED,
                failure_kind="mapping-invalid",
                failure_path=mapped.failure_path,
                failure_step=step_id,
            )
        else:
            await _settled_aside(conn, env, run_id)
        return "mapping-invalid"
    await _keep(conn, env, run_id, step_id, "output", mapped.value)
    await queries.recovery_step_end(
        conn, run_id=run_id, step_id=step_id, state=StepState.COMPLETED, effect=Effect.ACCEPTED
    )
    if leads_on:
        following = call.definition.next
        await queries.recovery_step_insert_next(
            conn,
            run_id=run_id,
            step_id=following,
            step_type=step_kind(call.workflow.step(following)),
        )
        await queries.recovery_run_continue(conn, run_id=run_id)
    else:
        await _settled_aside(conn, env, run_id)
    return "accepted"


async def _not_sent(
    conn: asyncpg.Connection, env: RecoveryEnv, run_id: str, step_id: str, *, leads_on: bool
) -> str:
    queries = env.store.queries
    if leads_on:
        # Still held, with attention: an operator retries the same command or cancels.
        await queries.recovery_step_not_sent(conn, run_id=run_id, step_id=step_id)
        await queries.recovery_run_attention(conn, run_id=run_id)
    else:
        # A cancel would have ended a not-sent step; no one is to resend it now.
        await queries.recovery_step_end(
            conn, run_id=run_id, step_id=step_id, state=StepState.CANCELLED, effect=None
        )
        await _settled_aside(conn, env, run_id)
    return "not-sent"
