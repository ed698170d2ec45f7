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
from core.execution.call import answered, direct
from core.execution.classify import ACCEPTED, Classified
from core.execution.operator import reconcile_unsupported
from core.payloads import build_scope
from core.products.receipts import EXPIRED, FOUND, UNAVAILABLE, Receipt, read_receipt, receipt_url
from core.states import Transition
from core.workflow.catalogue import connection_type
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
        call = await held_call(conn, env, run, step, Code.RECONCILE_REFUSED)
        binding_row = await queries.recovery_binding_read(
            conn, run_id=run_id, connection=call.definition.connection
        )
    unsupported = reconcile_unsupported(call.operation, _product(call))
    if unsupported is not None:
        await _leave_for_retry(env, run_id, step.step_id)
        raise CoordinatorError(Code.RECONCILE_UNSUPPORTED, unsupported)
    if binding_row is None:
        # The stored run disagrees with itself; asking again later would not change that.
        raise CoordinatorError(
            Code.RECONCILE_REFUSED,
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
            _refuse_changed(row.outcome)
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


async def _accepted(
    conn: asyncpg.Connection,
    env: RecoveryEnv,
    run: ActionRun,
    call: HeldCall,
    receipt: dict[str, Any] | None,
) -> str:
    """The receipt proves the command was accepted: the step ends as a live accepted answer
    ends it (:func:`core.execution.call.answered`), except that the run goes straight on to
    the call's next step, made due for a dispatcher (an operator's action executes no step
    itself). Settled through step_settle in operator mode, which decides whether the run
    goes on from it."""
    queries = env.store.queries
    step = call.step
    scope = build_scope(
        env.keyring,
        env.namespace,
        run.id,
        run.created_at,
        await queries.recovery_scope_payloads(conn, run_id=run.id),
    )
    found = Classified(ACCEPTED, "a receipt", response=receipt)
    settlement = answered(call.workflow, scope, call.definition, call.operation, found, direct)
    assert settlement is not None  # an accepted answer always ends the step
    row = await queries.recovery_step_settle(
        conn,
        run_id=run.id,
        step_id=step.step_id,
        row_version=step.row_version,
        settle=settlement.arguments(env.keyring, env.namespace, run.id),
    )
    assert row is not None  # one call: always one row
    _refuse_changed(row.outcome)
    return "mapping-invalid" if settlement.failure is not None else "accepted"
