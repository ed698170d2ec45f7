"""Audit before answer (CONTRACT §12).

Every request whose caller was authenticated is one action; whatever its outcome — done,
refused by a policy, not found, conflicting, malformed — one record goes to auditd and is
fsynced there **before** the gateway releases the answer. When that append fails the caller
gets 503 ``audit.response-unavailable`` instead of the answer: the action may have taken
effect, but nothing unaudited leaves the gateway.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

from core.codes import Code
from core.errors import CoordinatorError
from gateway.auth import VerifiedToken
from gateway.backend import AuditRecord, Backend

log = logging.getLogger("coordinator.gateway")

OK: Final = "ok"
FAILED: Final = "failed"

# Outcome words by problem code where the status alone says too little.
_BY_CODE: Final = {
    Code.AUTHORIZATION_REFUSED: "refused",
    Code.AUTHENTICATION_REFUSED: "refused",
    Code.RUN_NOT_FOUND: "not-found",
    Code.WORKFLOW_NOT_FOUND: "not-found",
}
_BY_STATUS: Final = {
    400: "invalid",
    404: "not-found",
    409: "conflict",
    413: "invalid",
    422: "invalid",
    503: "unavailable",
}


def outcome_for(code: Code) -> str:
    """The short outcome word an audit record gets for a refusal with ``code``."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code.status is None:
        return FAILED
    return _BY_STATUS.get(code.status, FAILED)


@dataclass
class AuditNote:
    """What a handler learns while it works and the record should carry (mutable on purpose:
    a run id becomes known only once a start has been admitted)."""

    run_id: str | None = None
    reason: str | None = None


class AuditUnavailable(CoordinatorError):
    """503 ``audit.response-unavailable``."""

    def __init__(self) -> None:
        super().__init__(
            Code.AUDIT_RESPONSE_UNAVAILABLE, "the result could not be recorded in the audit journal"
        )


async def append(
    backend: Backend, caller: VerifiedToken, action: str, outcome: str, note: AuditNote
) -> None:
    """Append one record; any failure becomes :class:`AuditUnavailable`."""
    record = AuditRecord(
        action=action,
        outcome=outcome,
        principal=caller.principal,
        client_id=caller.client_id,
        run_id=note.run_id,
        reason=note.reason,
    )
    try:
        await backend.append_audit((record,))
    except CoordinatorError as exc:
        log.error("audit append failed for %s (%s): %s", action, outcome, exc.code)
        raise AuditUnavailable() from None
    except Exception as exc:
        # A broken backend must not turn into a released, unaudited answer either.
        log.error("audit append failed for %s (%s): %s", action, outcome, type(exc).__name__)
        raise AuditUnavailable() from None


@asynccontextmanager
async def audited(
    backend: Backend, caller: VerifiedToken, action: str, note: AuditNote | None = None
) -> AsyncIterator[AuditNote]:
    """Run the body of an action, then record its outcome before anything is answered.

    Refusals raised in the body are recorded and raised again; an audit failure replaces
    them (and any success) with 503 ``audit.response-unavailable``.
    """
    note = note or AuditNote()
    try:
        yield note
    except CoordinatorError as exc:
        await append(backend, caller, action, outcome_for(exc.code), note)
        raise
    except Exception:
        await append(backend, caller, action, FAILED, note)
        raise
    await append(backend, caller, action, OK, note)
