"""``wait-for``: waiting for a product result (CONTRACT §9.5).

PRELIMINARY: reading Casework's review result every ``resultCheckSeconds`` lands with the
review-wait work. Until then the step only waits — woken by nothing but its timeout, which
continues at ``onTimeout`` — so a run reaching it stays ``waiting`` and visible.
"""

from __future__ import annotations

from datetime import timedelta

from core.workflow.model import WaitForStep
from dispatcher.context import Claimed, RunView
from dispatcher.settle import Tx
from dispatcher.steps.base import Flight, StepEnv


async def execute(
    env: StepEnv, claimed: Claimed, run: RunView, step: WaitForStep, flight: Flight
) -> None:
    """Wait; after ``timeoutSeconds`` continue at ``onTimeout``."""

    async def act(tx: Tx) -> None:
        timeout_at = tx.timeout_at
        if timeout_at is None and step.timeout_seconds is not None:
            timeout_at = tx.now + timedelta(seconds=step.timeout_seconds)
        if timeout_at is not None and step.on_timeout is not None and timeout_at <= tx.now:
            await tx.advance(run.workflow, step.on_timeout)
            return
        await tx.wait(timeout_at, timeout_at)

    await env.settler.settle(claimed, act)
