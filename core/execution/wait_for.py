"""The decisions of a ``wait-for`` step (CONTRACT §9.5): what a read of the awaited result
means, the result's identity in the run's values, and how the wait ends. The dispatcher
(:mod:`dispatcher.steps.wait_for`, which reads the product) and ``workflow simulate`` (which
reads a script) both decide through these."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from core.canonical import parse_json
from core.execution.onward import Onward
from core.execution.settlement import Failure, Settlement
from core.workflow.expr import MissingValue, Scope, render
from core.workflow.model import WaitForStep, Workflow

DECIDED: Final = "decided"
PENDING: Final = "pending"
FAILED: Final = "failed"
REFUSED: Final = "refused"
UNTRUSTED: Final = "untrusted"
"""Casework or the issuer failed TLS verification: nothing was read, nothing will be until
an operator acts."""

SPREAD: Final = 0.2
"""Checks are planned ``interval × (1 ± SPREAD/2)`` ahead."""
_RETRY_STATUSES: Final = frozenset({408, 429})


@dataclass(frozen=True)
class Read:
    """What one read of a result answered."""

    kind: str
    """decided, pending, failed, refused or untrusted."""
    reason: str
    """A short, value-free description for logs."""
    status: int | None = None
    result: Mapping[str, str] | None = None
    """The result fields of a decision (``outcome``, ``decidedAt``)."""


def check_delay(interval: float, jitter: Callable[[], float]) -> float:
    """Seconds until the next check: ``interval`` spread by up to ±10 % at random."""
    return interval * (1.0 - SPREAD / 2 + SPREAD * jitter())


def interpret(status: int, body: bytes) -> Read:
    """Classify an answer of ``GET …/review-requests/{reviewId}``. Never quotes the body."""
    if 200 <= status < 300:
        try:
            document: Any = parse_json(body)
        except (UnicodeDecodeError, ValueError):
            return Read(FAILED, f"{status} with a body that is not JSON", status)
        state = document.get("status") if isinstance(document, dict) else None
        if state == "pending":
            return Read(PENDING, f"{status} pending", status)
        decision = document.get("decision") if isinstance(document, dict) else None
        if state == "decided" and isinstance(decision, dict):
            outcome, decided_at = decision.get("outcome"), decision.get("decidedAt")
            if isinstance(outcome, str) and isinstance(decided_at, str):
                return Read(
                    DECIDED,
                    f"{status} decided",
                    status,
                    {"outcome": outcome, "decidedAt": decided_at},
                )
        return Read(FAILED, f"{status} without a readable result", status)
    if status in _RETRY_STATUSES or status >= 500:
        return Read(FAILED, f"{status}", status)
    if 400 <= status < 500:
        return Read(REFUSED, f"{status}", status)
    return Read(FAILED, f"{status}", status)


def identity_of(step: WaitForStep, field: str, scope: Scope) -> str | Failure:
    """The awaited result's identifying value (``field``, Casework's ``reviewId``) from the
    run's values, or the ``mapping-invalid`` failure that ends the run."""
    try:
        identity = render(step.identifying.get(field), scope)
    except MissingValue:
        return Failure("mapping-invalid", f"/{field}")
    if not isinstance(identity, str) or not identity:
        return Failure("mapping-invalid", f"/{field}")
    return identity


def decided(workflow: Workflow, step: WaitForStep, result: Mapping[str, str]) -> Settlement:
    """The wait ends with a decision: keep its fields and continue at ``next``."""
    return Settlement.onward(Onward.direct(workflow, step.next), keep={"wait-result": dict(result)})


def timed_out(workflow: Workflow, step: WaitForStep) -> Settlement:
    """The wait ends without a decision after ``timeoutSeconds``: continue at ``onTimeout``."""
    assert step.on_timeout is not None  # the checker requires onTimeout with a timeout
    return Settlement.onward(Onward.direct(workflow, step.on_timeout))
