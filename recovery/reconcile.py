"""reconcile: settle an uncertain call from the product's receipt (CONTRACT §10.1).

The order of things:

1. Look (read-only): the run exists, still holds its payloads, depends on unchanged
   connection settings, and has an uncertain call step (else ``reconcile.refused``) whose
   operation keeps receipts (else ``reconcile.unsupported``: BReg Actions and Casework).
2. Read the receipt of the step's command key, outside any transaction, with the
   connection's own token. A receipt too old for the product (``receipt.expired``) or no
   readable answer (``service.unavailable``) changes nothing: the run stays held.
3. In one transaction, one call of a step transition in operator mode
   (``core/db/transitions.sql``), which locks the run and the step and refuses with
   ``reconcile.raced`` if the step is no longer the row version step 1 read (another
   operator, a concurrent reconcile), then writes what the receipt proves:
   - found: keep the receipt as the step's response and map the output exactly as the
     dispatcher maps a live answer. The step completes with effect ``accepted`` and the run
     goes on at the step's ``next`` — or, when the mapping fails, the step fails (effect
     still accepted) and the run fails ``mapping-invalid``: ``step_operator_settle``, which
     is ``step_settle`` itself, so on an ended run, or for a step a cancel abandoned, only
     the step is settled, exactly as when a dispatcher settles it.
   - not seen: the command never arrived (``step_operator_not_sent``). The step is
     ``not-sent`` and the run stays held for an operator to retry the same command or
     cancel; for a step a cancel abandoned, or of a run that ended, there is nothing left to
     decide, so it ends ``cancelled`` as the cancel would have ended it.
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
from core.states import Effect, RunState, StepState, Transition
from core.workflow.catalogue import connection_type
from core.workflow.mapping import map_output
from core.workflow.model import step_kind
from recovery.env import RECEIPT_TIMEOUT_SECONDS, RecoveryEnv
from recovery.targets import (
    UNCERTAIN,
    ActionRun,
    HeldCall,
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
        if receipt.kind == FOUND:
            result = await _accepted(conn, env, run, call, receipt.body)
        else:
            row = await queries.recovery_step_not_sent(
                conn, run_id=run_id, step_id=step.step_id, row_version=step.row_version
            )
            assert row is not None  # one call: always one row
            _refuse_changed(row["outcome"])
            result = "not-sent"
        await resolve_snapshot(conn, env, run_id, step.step_id, "reconciled", overwrite=True)
        await log_action(conn, env, run_id, "reconcile", reason)
        return await answer(conn, env, run_id, result)

    return await in_transaction(env, settle)


def _refuse_changed(outcome: str) -> None:
    if outcome == Transition.CHANGED:
        raise CoordinatorError(
            Code.RECONCILE_RACED, "the step changed while the receipt was read; look again"
        )


def _sealed(env: RecoveryEnv, run_id: str, kept: dict[str, Any]) -> dict[str, list[Any]]:
    """The values ``kept`` (by purpose) sealed for the run, as step_settle's parallel arrays."""
    sealed = [seal_json(env.keyring, env.namespace, run_id, p, v) for p, v in kept.items()]
    return {
        "purposes": list(kept),
        "key_versions": [s.key_version for s in sealed],
        "nonces": [s.nonce for s in sealed],
        "ciphertexts": [s.ciphertext for s in sealed],
    }


async def _accepted(
    conn: asyncpg.Connection,
    env: RecoveryEnv,
    run: ActionRun,
    call: HeldCall,
    receipt: dict[str, Any] | None,
) -> str:
    """The receipt proves the command was accepted: the step completes as a live answer
    would have completed it (step_settle in operator mode decides whether the run goes on
    from it), or fails with the run when the answer does not map."""
    queries = env.store.queries
    step = call.step
    scope = build_scope(
        env.keyring,
        env.namespace,
        run.id,
        run.created_at,
        await queries.recovery_scope_payloads(conn, run_id=run.id),
    )
    mapped = map_output(call.operation, call.definition.output, scope, receipt)
    if mapped.ok:
        following = call.definition.next
        row = await queries.recovery_step_settle(
            conn,
            run_id=run.id,
            step_id=step.step_id,
            row_version=step.row_version,
            state=StepState.COMPLETED,
            effect=Effect.ACCEPTED,
            **_sealed(env, run.id, {"response": receipt, "output": mapped.value}),
            next_step=following,
            next_type=step_kind(call.workflow.step(following)),
            run_state=None,
            failure_kind=None,
            failure_path=None,
        )
    else:
        row = await queries.recovery_step_settle(
            conn,
            run_id=run.id,
            step_id=step.step_id,
            row_version=step.row_version,
            state=StepState.FAILED,
            effect=Effect.ACCEPTED,
            **_sealed(env, run.id, {"response": receipt}),
            next_step=None,
            next_type=None,
            run_state=RunState.FAILED,
            failure_kind="mapping-invalid",
            failure_path=mapped.failure_path,
        )
    assert row is not None  # one call: always one row
    _refuse_changed(row["outcome"])
    return "accepted" if mapped.ok else "mapping-invalid"
