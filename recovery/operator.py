"""Deployment-wide operator actions: the restore holds and retention (CONTRACT §10.5, §11)."""

from __future__ import annotations

from typing import Any

from core.errors import CoordinatorError
from recovery.env import RecoveryEnv


async def operator_action(env: RecoveryEnv, action: str, body_json: str) -> dict[str, Any]:
    """Carry out the deployment-wide ``action`` with its validated JSON body."""
    raise CoordinatorError("method-not-allowed", f"{action} is not built yet")
