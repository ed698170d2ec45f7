"""Bulk run actions (CONTRACT §8.7): one request, the same action on many runs.

After an outage an operator may face a thousand held runs that all want the same thing. A
bulk request names the action (retry-same, cancel or reconcile), a filter, a ``limit`` and a
``reason``, and goes through these steps in order:

1. The caller's policy must list the action itself: 403 before the body is read, as for one
   run.
2. The body is checked (:func:`gateway.bodies.bulk_request`), then the scope: the workflows
   that policy lists (narrowed by ``filter.workflow``) and, for a caller who is not an
   operator, only the runs it started. These are the runs that action on one run would
   allow.
3. The runs are chosen as ``GET /v1/runs?order=oldest`` with the filter lists them, page by
   page from recovery until ``limit`` runs are found: the runs held longest come first.
4. A dry run answers the chosen ids and acts on none. A real request sends each chosen run
   through the same ``RunAction`` call as the single route, at most :data:`CONCURRENCY` at
   once. Each run's outcome is appended to the audit journal as that action's record (with
   the run and the reason) as soon as it is known. One record for the bulk request itself
   (``bulk-<action>``) is written last, before the answer leaves. A run's refusal becomes its
   ``code`` and does not stop the others.

retry-same waits for the dispatcher's verdict on each resend. The whole request shares one
:data:`VERDICT_BUDGET_SECONDS` budget for those waits: once it is spent, each remaining
resend still happens and answers ``pending``. So a product that is still down cannot keep
the request open for minutes.

If the audit journal cannot take a run's record, no further run is started. The runs already
being acted on finish, and the answer is 503 ``audit.response-unavailable``. An unexpected
failure stops the request the same way. The runs acted on before it keep their records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Final

from core.errors import CoordinatorError
from core.runs import MAX_LIST_LIMIT, OLDEST, VERDICT_WAIT_SECONDS
from gateway import bodies
from gateway.auditing import OK, AuditNote, append, outcome_for
from gateway.auth import VerifiedToken
from gateway.backend import Backend, BackendCaller, ListQuery
from gateway.policies import ListScope

log = logging.getLogger("coordinator.gateway")

CONCURRENCY: Final = 8
"""Runs acted on at once by one bulk request: enough to keep recovery busy, few enough that
one request does not take every connection of its pool."""
VERDICT_BUDGET_SECONDS: Final = 20.0
"""How long one bulk retry-same waits, in all, for the dispatcher's verdicts."""
BULK_PATH: Final = "/v1/runs/bulk/{action}"
"""Where a bulk request of each operator action on a run is posted."""


def audit_action(action: str) -> str:
    """The audit record's action word for a bulk request of ``action``."""
    return f"bulk-{action}"


@dataclass
class _Budget:
    """What is left of the request's wait for retry-same verdicts."""

    ends: float

    def wait(self) -> float:
        return max(0.0, min(VERDICT_WAIT_SECONDS, self.ends - time.monotonic()))


async def choose(backend: Backend, scope: ListScope, request: bodies.BulkRequest) -> list[str]:
    """The ids of the runs a bulk request acts on, oldest first, at most ``limit``."""
    chosen: list[str] = []
    cursor: str | None = None
    wanted = request.filter
    while len(chosen) < request.limit:
        page = await backend.list(
            ListQuery(
                workflows=scope.workflows,
                principal=scope.principal,
                attention=wanted.attention,
                state=wanted.state,
                limit=min(MAX_LIST_LIMIT, request.limit - len(chosen)),
                cursor=cursor,
                order=OLDEST,
                step=wanted.step,
                cause=wanted.cause,
                updated_before=wanted.updated_before,
            )
        )
        chosen += [str(run["runId"]) for run in page.get("runs", [])]
        cursor = page.get("nextCursor")
        if not cursor:
            break
    # (A page never holds more than asked; the slice keeps the promise if one ever did.)
    return chosen[: request.limit]


async def act_on_each(
    backend: Backend,
    token: VerifiedToken,
    caller: BackendCaller,
    action: str,
    reason: str,
    run_ids: list[str],
) -> list[dict[str, str]]:
    """Act on every run in ``run_ids``, each audited as ``action``; the results in order."""
    results: list[dict[str, str]] = [{"runId": run_id} for run_id in run_ids]
    budget = _Budget(time.monotonic() + VERDICT_BUDGET_SECONDS)
    waiting = iter(range(len(run_ids)))  # shared: each worker takes the next run's index
    stopped: list[BaseException] = []

    async def one(index: int) -> None:
        run_id = run_ids[index]
        wait = budget.wait() if action == "retry-same" else None
        try:
            document = await backend.run_action(caller, run_id, action, reason, wait)
        except CoordinatorError as exc:
            results[index]["code"] = exc.code.value
            outcome = outcome_for(exc.code)
        except Exception as exc:
            # Not a refusal: record it as the single route would, then stop taking runs.
            await append(backend, token, action, "failed", AuditNote(run_id, reason))
            raise exc
        else:
            results[index]["result"] = str(document["result"])
            outcome = OK
        await append(backend, token, action, outcome, AuditNote(run_id, reason))

    async def worker() -> None:
        for index in waiting:
            if stopped:
                return
            try:
                await one(index)
            except Exception as exc:  # the audit journal or the backend broke
                stopped.append(exc)

    await asyncio.gather(*(worker() for _ in range(min(CONCURRENCY, len(run_ids)))))
    if stopped:
        first = stopped[0]
        log.error(
            "bulk %s stopped after a failure: %s",
            action,
            first.code if isinstance(first, CoordinatorError) else type(first).__name__,
        )
        raise first
    return results


__all__ = ["BULK_PATH", "CONCURRENCY", "act_on_each", "audit_action", "choose"]
