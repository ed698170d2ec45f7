"""The readiness answer every database-using component gives on its ``Check`` RPC.

A component's store may have been idle for a while, so ``Check`` asks the database instead
of trusting the last query: it reads the deployment row (with a short deadline) and
compares the activation serial with the one the component verified at startup. A newer
serial means ``apply`` changed the active packages under a running service.
"""

from __future__ import annotations

import asyncio
from typing import Final

from core.codes import Code
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.runtime import Store

HEALTH_TIMEOUT_SECONDS: Final = 2.0


async def store_health(store: Store, timeout: float = HEALTH_TIMEOUT_SECONDS) -> pb.Health:
    """Whether the database answers and still holds the activation ``store`` verified."""
    reasons: list[str] = []
    row = None
    try:
        async with asyncio.timeout(timeout), store.connection() as conn:
            row = await store.queries.deployment_read(conn)
    except (CoordinatorError, TimeoutError):
        store.notice_unavailable()
        reasons.append("store-unavailable")
    activation = store.activation
    activation_ready = (
        activation is not None and row is not None and row.activation_serial == activation.serial
    )
    if activation is None:
        reasons.append("activation-unverified")
    elif row is not None and not activation_ready:
        reasons.append("activation-changed")
    return pb.Health(
        store_ready=row is not None, activation_ready=activation_ready, reasons=reasons
    )


async def refuse_changed_activation(store: Store) -> None:
    """409 ``deployment.activation-changed`` once an ``apply`` changed the activation this
    component verified at startup; every API call but ``/ready`` asks this first."""
    async with store.connection() as conn:
        row = await store.queries.deployment_read(conn)
    activation = store.activation
    if row is not None and activation is not None and row.activation_serial != activation.serial:
        raise CoordinatorError(
            Code.DEPLOYMENT_ACTIVATION_CHANGED,
            "an apply changed the active packages after this service started; restart it",
        )
