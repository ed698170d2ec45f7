"""``call``: one product operation, sent at most once unless the product proves otherwise
(CONTRACT §9.3).

The order is the whole point:

1. Map the command from the run's values and check it against the operation's command
   schema, then build its request (route, body, key) once. A broken command, or one the
   binding cannot make a request of, fails the run with ``invalid-command`` and its JSON
   pointer; nothing is sent and no token is asked for.
2. Obtain the connection's access token (a failure here sends nothing; try again later).
   A definite refusal by the issuer, or a grant narrower than the connection's scopes, is
   made visible: the step shows ``token-refused``, its run ``attention``, doctor the
   connection, until a token comes or the step's deadline passes. So is an issuer whose TLS
   certificate fails verification: the step shows ``tls-refused`` and its run
   ``attention``.
3. Commit the sealed command and its command key as *prepared* — before a byte leaves.
4. Send it, outside any transaction, with ``Idempotency-Key: <command key>``.
5. Classify the answer (:mod:`core.execution.classify`, over what :mod:`core.products.http`
   reports) and commit the outcome together with the next step:
   accepted → keep the response and the mapped output, continue (a mapping that fails is
   ``mapping-invalid``, the effect staying accepted); definitely not processed → the same
   command and key again after a growing delay, until the deadline (a product that failed
   TLS verification also shows ``tls-refused`` and its run ``attention`` meanwhile: nothing
   left, and nothing will until someone mends the certificate or the trust); refused →
   ``onRefused`` or the run fails ``refused`` (a 401 first gets one resend with a fresh
   token); anything else → uncertain: effect unknown, the run held for an operator, never
   resent here.

A retry finds the command already stored and sends exactly those bytes' worth of meaning
again under the same key; it never maps anew. So does an operator's retry-same, which makes
an uncertain (or not-sent) step ready again with its command and key kept: its effect stays
``unknown`` until an answer settles it (accepted sets it, uncertain keeps it).

When the answer is accepted and the run goes on (through any local steps) to another call,
the settle of this one prepares that call too (``step_settle`` given the next call): its
command is made from the values the answer kept, and it is leased to this dispatcher and
committed as prepared in the same transaction, then sent by the same execution — the state a
claim and step 3 would have left it in, without their round trips (nor a notification of due
work: the row is made prepared, never ready). It happens only when nothing stands in the
way: a token in hand (the settle never waits for the issuer), usable TLS trust, a command
that can be made, no stop under way, no execution hold; otherwise the next call is made due
and claimed as usual. One execution goes on like this for at most
:data:`~dispatcher.steps.base.MAX_CHAINED_CALLS` calls.

A cancel that committed before step 3 stops the command there (the step ends cancelled in
the transaction that would have prepared it). An answer that arrives after a cancel is still
the step's own outcome and is recorded as above, but leads nowhere: no next step, no
``onRefused``, no retry (see :mod:`core.execution.settlement`).
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
import time
from dataclasses import dataclass
from typing import Any

from core import clock
from core.derive import command_key
from core.errors import CoordinatorError
from core.execution.adapters import (
    AuthorizedRequest,
)
from core.execution.call import Built, answered
from core.execution.classify import (
    ACCEPTED,
    LEASE_EXPIRED,
    NOT_SENDABLE,
    REFUSED,
    RETRYABLE,
    UNCERTAIN,
    Classified,
    classify_answer,
    classify_failure,
    retry_cause,
    retry_wait,
)
from core.execution.settlement import Failure, Settlement
from core.execution.steps import Reached, Send, reached
from core.payloads import seal_json
from core.products.http import UNREADABLE_ANSWER, ExchangeFailure, retry_after_seconds
from core.products.token_client import UNRECOGNISED
from core.states import SentNothing, StepState
from core.workflow.catalogue import Operation
from core.workflow.model import CallStep
from dispatcher.claim import Claimed
from dispatcher.crash_points import AFTER_ANSWER, AFTER_PREPARE
from dispatcher.run_view import Loaded, RunView
from dispatcher.settle import NextCall, Prepared
from dispatcher.steps.base import (
    MAX_CHAINED_CALLS,
    SENDING,
    SETTLING,
    WORKING,
    Flight,
    StepEnv,
    TokenWithheld,
    access_token,
    call_token,
)

log = logging.getLogger("coordinator.dispatcher")


async def _fail(env: StepEnv, claimed: Claimed, failure: Failure) -> None:
    await env.settler.conclude(claimed, Settlement.failing(failure))


async def _send(
    env: StepEnv,
    request: AuthorizedRequest,
    step: CallStep,
    deadline_in: float | None,
    tls: ssl.SSLContext | None,
    connection_type: str,
    flight: Flight,
) -> Classified:
    """Send one request and classify what came back (or did not)."""
    flight.phase = SENDING
    started = time.monotonic()
    try:
        answer = await env.http.exchange(
            request.method,
            request.url,
            headers=request.headers,
            body=request.body,
            # (The step's deadline bounds the exchange too: it never runs past it.)
            timeout=env.calls.timeout(
                step.connection, step.deadline_seconds if deadline_in is None else deadline_in
            ),
            tls=tls,
        )
        result = classify_answer(
            answer.status, answer.body, retry_after_seconds(answer.retry_after, clock.now())
        )
    except ExchangeFailure as failure:
        result = classify_failure(failure)
    if result.result != NOT_SENDABLE:
        env.metrics.record_call(connection_type, result.result, time.monotonic() - started)
    return result


async def execute(
    env: StepEnv,
    claimed: Claimed,
    loaded: Loaded,
    step: CallStep,
    flight: Flight,
    at: Reached,
) -> None:
    """Work on a claimed call step; see the module docstring for the order of things."""
    if claimed.state == StepState.PREPARED:
        # Claimed with a prepared command and no record of its sending: whoever prepared
        # it may have sent it. Only an operator can settle that.
        await env.settler.uncertain(claimed, LEASE_EXPIRED)
        return
    if claimed.past_deadline:
        await _fail(env, claimed, Failure("deadline-exceeded"))
        return

    # The command of an earlier attempt was read with the claim: no read of its own.
    stored: Any = None
    if claimed.command_payload_id is not None:
        stored = loaded.command(env.keyring, env.store.runtime.config.namespace)
    key = claimed.command_key or command_key(env.admission_key, loaded.run.id, step.id)
    decision = reached(step, dataclasses.replace(at, key=key, stored=stored))
    if isinstance(decision, Settlement):
        await env.settler.conclude(claimed, decision)
        return
    assert isinstance(decision, Send)
    command = decision.built.command
    connection_type = at.workflow.connections[step.connection]

    try:
        # (A private root is read the first time its connection calls: before anything is
        # committed, so a root that cannot be read leaves nothing prepared behind.)
        tls = env.calls.tls(step.connection)
    except CoordinatorError as exc:
        log.warning("connection %s cannot call: %s", step.connection, exc.detail)
        await env.settler.unprepare(claimed, env.settings.error_retry_seconds)
        return

    # Without a token nothing is sent: the step stays ready and is tried again.
    token = await call_token(env, step.connection)
    if isinstance(token, TokenWithheld):
        await _withheld(env, claimed, step, connection_type, token)
        return
    if token is not None and step.connection not in env.tokens.confirmed:
        # The issuer gives this connection tokens (again): no refusal to show any more.
        await env.settler.clear_token_refusal(step.connection)
        env.tokens.confirmed.add(step.connection)
    if token is None or env.stopping():
        await env.settler.unprepare(
            claimed, 0.0 if token is not None else env.settings.error_retry_seconds
        )
        return
    prepared = await env.settler.prepare(
        claimed,
        command=command,
        command_payload_id=claimed.command_payload_id,
        command_key=key,
        deadline_seconds=step.deadline_seconds,
    )
    if prepared is None:
        # Lost lease, execution hold or cancel: send nothing (the settler wrote what
        # each of those calls for).
        return
    await _send_prepared(
        env, claimed, loaded.run, step, decision.built, token, tls, prepared, flight
    )


async def _send_prepared(
    env: StepEnv,
    claimed: Claimed,
    run: RunView,
    step: CallStep,
    built: Built,
    token: str,
    tls: ssl.SSLContext | None,
    prepared: Prepared,
    flight: Flight,
) -> None:
    """Send a prepared command (steps 4 and 5 of the module docstring), unless the
    dispatcher is stopping (then it is given back, ready: nothing left)."""
    if env.stopping():
        await env.settler.unprepare(claimed)
        return
    if prepared.first_of_run:
        env.metrics.record_first_dispatch(prepared.since_admission)

    env.crash_points.reached(AFTER_PREPARE)
    request, op = built.request, built.operation
    connection_type = run.workflow.connections[step.connection]
    deadline_in = prepared.deadline_in
    result = await _send(
        env, request.authorized(token), step, deadline_in, tls, connection_type, flight
    )
    if result.result == REFUSED and result.status == 401:
        # The product did not process it; its verdict may only be about a stale token.
        env.tokens.invalidate(step.connection)
        fresh = await access_token(env, step.connection)
        if fresh is None:
            result = Classified(RETRYABLE, "401, and no fresh token", 401)
        else:
            result = await _send(
                env, request.authorized(fresh), step, deadline_in, tls, connection_type, flight
            )
    env.crash_points.reached(AFTER_ANSWER)
    flight.phase = SETTLING
    await _record(env, claimed, run, step, op, result, prepared.attempts, flight)


@dataclass(frozen=True)
class _Following:
    """The run's next call, ready to be prepared as the call before it is settled."""

    run: RunView
    """The run as the next call sees it: with the settled call's output."""
    step: CallStep
    built: Built
    token: str
    tls: ssl.SSLContext | None
    call: NextCall


def _following_call(
    env: StepEnv,
    claimed: Claimed,
    run: RunView,
    step: CallStep,
    settlement: Settlement,
    flight: Flight,
) -> _Following | None:
    """The run's next step when the settle of ``step`` can prepare it too (issue 43): a call
    whose command can be made now from the run's values and the output just kept, on a
    connection with a current access token and usable TLS trust. ``None`` when anything is
    missing or in doubt: the next step is then made due and claimed, and meets whatever it
    is the usual way. Nothing here waits for the network, and nothing that goes wrong here
    may keep the answer in hand from being recorded: it only means no chain."""
    way = settlement.way
    if (
        way is None
        or way.next_step is None
        or way.next_kind != "call"
        or flight.chained >= MAX_CHAINED_CALLS
        or env.stopping()
    ):
        return None
    following = run.workflow.step(way.next_step)
    if not isinstance(following, CallStep):
        return None
    # Only a token in hand, and one the issuer has granted since it last refused: a fetch
    # would hold the settle of the answer already known.
    token = env.tokens.cached(following.connection)
    if token is None or following.connection not in env.tokens.confirmed:
        return None
    try:
        tls = env.calls.tls(following.connection)
        kept = settlement.keep.get("output")
        scope = run.scope
        if isinstance(kept, dict):
            scope = dataclasses.replace(scope, steps={**scope.steps, step.id: kept})
        key = command_key(env.admission_key, run.id, following.id)
        now = claimed.now or clock.now()
        decision = reached(following, Reached(run.workflow, scope, now, run.bindings, key=key))
        if not isinstance(decision, Send):
            return None
        namespace = env.store.runtime.config.namespace
        sealed = seal_json(env.keyring, namespace, run.id, "command", decision.built.command)
    except Exception as exc:  # the claimed call meets it again, the usual way
        log.warning(
            "run %s: the call after %s was not prepared with its settle (%s); it is claimed",
            run.id,
            step.id,
            type(exc).__name__,
        )
        return None
    return _Following(
        run=dataclasses.replace(run, scope=scope),
        step=following,
        built=decision.built,
        token=token,
        tls=tls,
        call=NextCall(following.id, sealed, key, following.deadline_seconds),
    )


async def _withheld(
    env: StepEnv, claimed: Claimed, step: CallStep, connection_type: str, withheld: TokenWithheld
) -> None:
    """No token, for a reason only an operator can mend: send nothing, make it visible, try
    again later.

    The step keeps its place (ready, due after the error delay) until its deadline, then
    fails ``deadline-exceeded`` like any call that could not be sent; meanwhile the run shows
    ``attention`` and the step the cause (``token-refused``, ``tls-refused``). A refusal by
    the issuer is also counted and shown by doctor with its OAuth error code; a failed TLS
    verification is not the issuer's verdict on the client, and has no code to show there.
    """
    if withheld.cause == SentNothing.TOKEN_REFUSED:
        env.metrics.record_token_refusal(connection_type)
        env.tokens.confirmed.discard(step.connection)
        await env.settler.record_token_refusal(step.connection, withheld.error or UNRECOGNISED)
    await env.settler.sent_nothing(
        claimed,
        withheld.cause,
        delay=env.settings.error_retry_seconds,
        deadline_seconds=step.deadline_seconds,
    )


async def _record(
    env: StepEnv,
    claimed: Claimed,
    run: RunView,
    step: CallStep,
    op: Operation,
    result: Classified,
    attempts: int,
    flight: Flight,
) -> None:
    """Commit the classified answer and what follows from it, in one transaction."""
    if result.result == UNCERTAIN:
        # The cause is all it says: no URL, header, body or token.
        log.warning(
            "call %s of run %s is uncertain: %s (%s)", step.id, run.id, result.cause, result.reason
        )
    elif result.cause is not None:
        # Retryable, but only an operator can mend it (a certificate, a trusted root).
        log.warning("call %s of run %s: %s (%s)", step.id, run.id, result.result, result.reason)
    elif result.result != ACCEPTED:
        log.info("call %s of run %s: %s (%s)", step.id, run.id, result.result, result.reason)
    settlement = answered(run.workflow, run.scope, step, op, result)
    if settlement is not None:
        following = _following_call(env, claimed, run, step, settlement, flight)
        if following is None:
            await env.settler.conclude(claimed, settlement)
            return
        chained = await env.settler.conclude_chained(
            claimed, settlement, following.call, env.settings.lease_seconds
        )
        if chained is not None:
            # The execution goes on to the next call: its lease is the one to keep now.
            flight.step = chained.claimed
            flight.chained += 1
            flight.phase = WORKING
            await _send_prepared(
                env,
                chained.claimed,
                following.run,
                following.step,
                following.built,
                following.token,
                following.tls,
                chained.prepared,
                flight,
            )
        return

    # A lost lease is logged by the settler, in one line that says whether a restore-hold
    # took it.
    if result.result == RETRYABLE:
        delay = retry_wait(
            attempts,
            result,
            first=env.settings.retry_first_seconds,
            cap=env.settings.retry_cap_seconds,
            jitter=env.jitter,
        )
        cause = None if result.cause is None else SentNothing(result.cause)
        await env.settler.retry(
            claimed, delay, cause, met=retry_cause(result), status=result.status
        )
    else:
        await env.settler.uncertain(claimed, result.cause or UNREADABLE_ANSWER, result.cause_status)
