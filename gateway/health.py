"""Readiness of the whole service as the gateway sees it (``/ready``, readiness gauges).

Sources: each component's Check RPC (store, activation, its own reasons), and the token
verifier (whether it holds the issuer's keys). The audit journal counts as ready when auditd
answers and does not report ``audit-unavailable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gateway.backend import ComponentHealth

AUDIT_COMPONENT: Final = "auditd"
AUDIT_UNAVAILABLE_REASON: Final = "audit-unavailable"
STORE_UNAVAILABLE_REASON: Final = "store-unavailable"
ACTIVATION_REASON: Final = "activation-not-ready"
VERIFIER_REASON: Final = "token-verifier-unavailable"


@dataclass(frozen=True)
class Readiness:
    """The service's readiness and the reasons when it is not ready."""

    ready: bool
    """True when nothing below is missing."""
    reasons: tuple[str, ...]
    """Sorted machine words, e.g. ``store-unavailable``; empty when ready."""
    store_available: bool
    """Every answering component reaches the database (and at least one answered)."""
    audit_ready: bool
    """auditd answered and its journal takes records."""
    verifier_ready: bool
    """The token verifier holds a key set."""
    components: tuple[tuple[str, bool], ...]
    """``(component, answered its Check)`` for each component asked."""


def summarize(healths: Sequence[ComponentHealth], verifier_ready: bool) -> Readiness:
    """Combine the components' health answers and the verifier's state."""
    reasons: set[str] = set()
    reachable = [health for health in healths if health.reachable]
    for health in healths:
        reasons.update(health.reasons)
        if health.reachable and not health.store_ready:
            reasons.add(STORE_UNAVAILABLE_REASON)
        if health.reachable and not health.activation_ready:
            reasons.add(ACTIVATION_REASON)
    audit = [health for health in healths if health.component == AUDIT_COMPONENT]
    audit_ready = bool(audit) and all(
        health.reachable and AUDIT_UNAVAILABLE_REASON not in health.reasons for health in audit
    )
    if not audit_ready:
        reasons.add(AUDIT_UNAVAILABLE_REASON)
    store_available = bool(reachable) and all(health.store_ready for health in reachable)
    if not store_available:
        reasons.add(STORE_UNAVAILABLE_REASON)
    if not verifier_ready:
        reasons.add(VERIFIER_REASON)
    return Readiness(
        ready=not reasons,
        reasons=tuple(sorted(reasons)),
        store_available=store_available,
        audit_ready=audit_ready,
        verifier_ready=verifier_ready,
        components=tuple((health.component, health.reachable) for health in healths),
    )
