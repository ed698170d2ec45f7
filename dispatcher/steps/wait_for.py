"""``wait-for``: waiting for a product result (CONTRACT §9.5).

The one result a workflow can wait for today is Casework's ``review-decision``. The step
reads it from the catalogued route with the connection's token — at once when the step is
reached, then every ``resultCheckSeconds`` — and continues at ``next`` with the decision's
``outcome`` and ``decidedAt`` kept (sealed, purpose ``wait-result``) for later steps to
read as ``${steps.<id>.outcome}``. After ``timeoutSeconds`` without a decision it continues
at ``onTimeout`` instead.

Between checks the step is an ordinary row with a due time (the earlier of its next check
and its timeout): no process keeps anything for it, and the claim loop finds it through
the same partial index as every other due step. Each check is one request, planned a
randomly spread interval ahead (±10 %) so that runs which started together do not keep
reading together.

A Casework completion event brings the next check forward to now (admission does that,
through the step's keyed ``wait_match`` digest). The planned check is stored *before* the
read and the step is scheduled from whatever is stored *after* it, so an event that arrives
while a read is on its way is not lost: the step is due again at once (see
``core/db/queries/waits.sql``). The first read, right after the digest is stored, covers a
decision made before the step started waiting.

Reads change nothing at the product and are safe to repeat, so a stopping dispatcher may cut
one off and give the step back at once (it stays due and is read again). What the answers
mean:

- a decision → the wait ends;
- pending → the next check is scheduled;
- no answer, 408, 429 or 5xx, or an unreadable body → the next check is scheduled, nothing
  else (the next read will tell);
- 401 (after one fresh token), 403, 404 or another 4xx → Casework will not show this run
  the result. The run keeps waiting and polling at its usual pace, but is marked
  ``attention: true`` and a warning is logged, so an operator can fix the product's policy
  (the next answered read clears the mark) or cancel the run. Failing the run instead would
  throw away a review that may well be decided once the policy is repaired.
- Casework or the issuer failed TLS verification (an untrusted, expired or misnamed
  certificate) → nothing was sent, as with no answer, but no later read will tell until
  someone mends the certificate or the trust, and a wait with a timeout would meanwhile run
  out towards ``onTimeout`` unseen. So it is treated as a refusal: the run keeps waiting and
  polling, marked ``attention: true`` with a warning, until a read is answered (CONTRACT
  §9.3, "Untrusted endpoints are visible"). The step shows no cause: inspection's causes
  belong to calls.

A cancel ends an unleased wait itself. A wait it finds leased (a read on its way) ends
cancelled when the dispatcher next records anything for it — before the read, or with the
read's answer, whatever that answer is: a decision that arrives for an abandoned wait is
not kept and leads nowhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core import derive
from core.config.model import DEFAULT_RESULT_CHECK_SECONDS
from core.execution.settlement import Failure, Settlement
from core.execution.steps import Reached, Watch, binding_of, reached
from core.execution.wait_for import (
    DECIDED,
    FAILED,
    PENDING,
    REFUSED,
    UNTRUSTED,
    Read,
    check_delay,
    decided,
    interpret,
    timed_out,
)
from core.products.http import ExchangeFailure
from core.states import SentNothing, StepState, Transition
from core.workflow import catalogue
from core.workflow.model import WaitForStep
from dispatcher.claim import Claimed
from dispatcher.run_view import Loaded
from dispatcher.steps.base import Flight, StepEnv, TokenWithheld, call_token

log = logging.getLogger("coordinator.dispatcher")


def result_check_seconds(env: StepEnv, connection: str) -> int:
    """The connection's ``resultCheckSeconds`` in the runtime file this dispatcher runs with.

    Not part of a run's binding: a changed value applies from each wait's next check.
    """
    settings = env.store.runtime.config.connections.get(connection)
    if settings is None or settings.result_check_seconds is None:
        return DEFAULT_RESULT_CHECK_SECONDS
    return settings.result_check_seconds


@dataclass(frozen=True)
class _Target:
    """Where and what to read, and the digest completion events carry."""

    url: str
    match: bytes


def _target(env: StepEnv, at: Reached, watch: Watch) -> _Target | Failure:
    """The read's URL and the wait's digest, or the failure that ends the run."""
    step, field, identity = watch.step, watch.field, watch.identity
    binding = binding_of(step, at)
    try:
        path = catalogue.fill_path(watch.result.path, {"profile": binding.profile, field: identity})
    except ValueError:
        return Failure("mapping-invalid", f"/{field}")
    return _Target(
        url=binding.base_url.rstrip("/") + path,
        match=derive.wait_match(env.admission_key, step.connection, step.result, identity),
    )


async def _get(env: StepEnv, connection: str, url: str, token: str) -> Read:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    try:
        answer = await env.http.exchange(
            "GET",
            url,
            headers=headers,
            timeout=env.calls.timeout(connection),
            tls=env.calls.tls(connection),
        )
    except ExchangeFailure as failure:
        if failure.cause == SentNothing.TLS_REFUSED:
            return Read(UNTRUSTED, f"not sent ({failure.cause})")
        # Any other failure to get an answer only postpones the read.
        return Read(FAILED, f"no answer ({failure.cause})")
    return interpret(answer.status, answer.body)


async def _token(env: StepEnv, connection: str, failed: str) -> str | Read:
    """The connection's access token, or the read it makes when there is none: untrusted
    when the issuer failed TLS verification, else failed with the reason ``failed``."""
    token = await call_token(env, connection)
    if isinstance(token, str):
        return token
    if isinstance(token, TokenWithheld) and token.cause == SentNothing.TLS_REFUSED:
        return Read(UNTRUSTED, f"{failed} (the issuer's tls-refused)")
    return Read(FAILED, failed)


async def read_result(env: StepEnv, connection: str, url: str) -> Read:
    """One read of a result (a second one after a 401, with a fresh token)."""
    token = await _token(env, connection, "no access token")
    if isinstance(token, Read):
        return token
    read = await _get(env, connection, url, token)
    if read.status != 401:
        return read
    env.tokens.invalidate(connection)
    fresh = await _token(env, connection, "401, and no fresh token")
    if isinstance(fresh, Read):
        return fresh
    return await _get(env, connection, url, fresh)


async def execute(
    env: StepEnv, claimed: Claimed, loaded: Loaded, step: WaitForStep, flight: Flight, at: Reached
) -> None:
    """Plan the next check, read the result once, and record what it said."""
    run = loaded.run
    decision = reached(step, at)
    target = _target(env, at, decision) if isinstance(decision, Watch) else None
    if isinstance(target, Failure):
        decision = Settlement.failing(target)
    if not isinstance(target, _Target):
        # A value the read needs cannot be made: the step ends here (step_settle ends it
        # cancelled instead if a cancel abandoned it).
        assert isinstance(decision, Settlement)
        await env.settler.conclude(claimed, decision)
        return

    delay = check_delay(result_check_seconds(env, step.connection), env.jitter)
    entering = claimed.state == StepState.READY

    timeout_seconds = step.timeout_seconds if step.on_timeout is not None else None
    planned = await env.settler.plan_check(
        claimed,
        match=target.match,
        timeout_seconds=timeout_seconds,
        delay=delay,
        entering=entering,
    )
    if planned is not Transition.WRITTEN:
        return
    if env.stopping():
        await env.settler.release(claimed)
        return

    read = await read_result(env, step.connection, target.url)
    if read.kind == REFUSED:
        log.warning(
            "wait %s of run %s: the product refused to show the result (%s); "
            "the run keeps waiting and needs attention",
            step.id,
            run.id,
            read.reason,
        )
    elif read.kind == UNTRUSTED:
        log.warning(
            "wait %s of run %s: TLS verification failed (%s); "
            "the run keeps waiting and needs attention",
            step.id,
            run.id,
            read.reason,
        )
    elif read.kind == FAILED:
        log.info("wait %s of run %s: the read failed (%s)", step.id, run.id, read.reason)

    ends = (
        decided(run.workflow, step, read.result)
        if read.kind == DECIDED and read.result is not None
        else None
    )
    on_timeout = timed_out(run.workflow, step) if step.on_timeout is not None else None
    # A refused or untrusted read asks for attention, an answered one clears it; a failed
    # read leaves it. A read that ends the wait clears it in any case.
    attention = read.kind != PENDING if read.kind in (REFUSED, UNTRUSTED, PENDING) else None
    # A lost lease is logged by the settler.
    await env.settler.record_read(claimed, ends=ends, on_timeout=on_timeout, attention=attention)
