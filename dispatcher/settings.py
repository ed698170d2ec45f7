"""How one dispatcher behaves: concurrency, leases, idle waits, retries and the stop budget."""

from __future__ import annotations

from dataclasses import dataclass

from core.execution.classify import RETRY_CAP_SECONDS, RETRY_FIRST_SECONDS


@dataclass(frozen=True)
class DispatchSettings:
    """How one dispatcher behaves; the defaults are the production values."""

    concurrency: int = 16
    """Steps worked on at once by this dispatcher."""
    lease_seconds: float = 30.0
    """Lease length (the contract allows at most 30 s); renewed every third of it."""
    idle_cap_seconds: float = 5.0
    """Longest idle wait without a notification before the dispatcher looks again."""
    test_clock_idle_cap_seconds: float = 0.25
    """The same while the test clock is on: moving a clock file sends no notification."""
    shutdown_budget_seconds: float = 7.0
    """How long a stop waits for answers to commands already sent."""
    retry_first_seconds: float = RETRY_FIRST_SECONDS
    """First delay after a definite retryable answer."""
    retry_cap_seconds: float = RETRY_CAP_SECONDS
    """Longest delay between automatic retries."""
    error_retry_seconds: float = 5.0
    """Delay before a step whose execution failed unexpectedly is tried again."""
    sweep_limit: int = 100
    """Expired leases handled per look."""
    sweep_interval_seconds: float = 1.0
    """Least time between two looks for expired leases: a lease lasts ``lease_seconds``, so
    finding an abandoned one up to a second later changes nothing, and a busy dispatcher
    looks for work many times a second."""
