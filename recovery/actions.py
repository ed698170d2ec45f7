"""Operator actions on one run: reconcile, retry-same and cancel (CONTRACT §10.1–10.4)."""

from __future__ import annotations

from typing import Any

from core.errors import CoordinatorError
from recovery.env import RecoveryEnv


async def run_action(env: RecoveryEnv, run_id: str, action: str, reason: str) -> dict[str, Any]:
    """Carry out ``action`` on ``run_id``; answers the run's status with ``result``."""
    raise CoordinatorError("method-not-allowed", f"{action} is not built yet")
