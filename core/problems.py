"""The catalogue of HTTP problem codes (CONTRACT §8, §15).

Codes are data: each entry maps a code to its HTTP status and a short title. The gateway
turns a CoordinatorError into an RFC 9457 document from this table; coordinatorctl prints the
same code with the ``coordinator.`` prefix. The API reference in docs/ lists the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

PROBLEM_BASE = "https://registry-coordinator.dev/problems/"


@dataclass(frozen=True)
class Problem:
    """One catalogued problem code."""

    code: str
    """Stable machine-readable code, e.g. ``service.unavailable``."""
    status: int
    """HTTP status the gateway answers with."""
    title: str
    """Short human-readable summary; the same for every occurrence of the code."""

    @property
    def type_uri(self) -> str:
        """The problem ``type`` member."""
        return PROBLEM_BASE + self.code


_ROWS: tuple[tuple[str, int, str], ...] = (
    ("service.unavailable", 503, "A dependency of the service is unavailable"),
    ("audit.response-unavailable", 503, "The audited result of the operation was not released"),
    ("deployment.refused", 409, "The deployment check failed"),
    ("deployment.activation-changed", 409, "The active packages changed after the service started"),
    ("binding.conflict", 409, "The runtime file conflicts with the activation"),
    ("binding.live-conflict", 409, "A live run depends on connection settings that changed"),
    ("execution.held", 409, "The restore hold stops execution"),
    ("admission.held", 409, "The admission hold stops new runs"),
    ("admission.recovery-only", 409, "This instance admits no runs"),
    ("restore.hold-required", 409, "This step needs the restore hold in the right state"),
    ("restore.unresolved", 409, "Held work still needs an operator decision"),
    ("restore.review-required", 409, "Execution recovery has not been attested"),
    ("restore.lease-incompatible", 409, "A lease from before the hold cannot be honoured"),
    ("reconcile.unsupported", 409, "The product keeps no receipt for this call"),
    ("reconcile.refused", 409, "The step is not uncertain"),
    ("reconcile.raced", 409, "The step changed while the operator acted"),
    ("retry.refused", 409, "The call cannot be retried with the same key"),
    ("receipt.expired", 409, "The product no longer holds the receipt"),
    ("run.payload-erased", 409, "Retention erased the run's payloads"),
    ("cancel.refused", 409, "The run has already ended"),
    ("start.conflict", 409, "The idempotency key was used with a different input"),
    ("authentication.refused", 401, "The request is not authenticated"),
    ("authorization.refused", 403, "The caller may not perform this action"),
    ("run.not-found", 404, "No such run"),
    ("workflow.not-found", 404, "No such workflow"),
    ("input.invalid", 422, "The start input does not match the workflow's input schema"),
    ("request.invalid", 400, "The request is malformed"),
    ("request.too-large", 413, "The request body is too large"),
    ("not-found", 404, "No such route"),
    ("method-not-allowed", 405, "The route does not accept this method"),
    # Not a contract code: the bare answer to an unexpected failure, logged with the same
    # correlation id so an operator can find it.
    ("internal", 500, "An unexpected failure"),
)

CATALOGUE: dict[str, Problem] = {
    code: Problem(code, status, title) for code, status, title in _ROWS
}


def lookup(code: str) -> Problem:
    """The catalogued problem for ``code``; unknown codes are a programming error."""
    return CATALOGUE[code]
