"""What every step executor is handed: the dispatcher's shared parts and the step's flight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from core.crypto import Keyring
from core.products.tokens import ConnectionTokens
from core.runtime import Store
from dispatcher.context import DispatchSettings
from dispatcher.metrics import DispatchMetrics
from dispatcher.settle import Settler

WORKING = "working"
"""Nothing has been sent for this step by this execution."""
SENDING = "sending"
"""A command is on its way or its answer is awaited."""
SETTLING = "settling"
"""The answer is in and being recorded."""


@dataclass
class Flight:
    """How far one step execution got; read by the dispatcher when it has to stop."""

    phase: str = WORKING


@dataclass(frozen=True)
class StepEnv:
    """The dispatcher's parts a step executor uses."""

    store: Store
    settler: Settler
    settings: DispatchSettings
    metrics: DispatchMetrics
    keyring: Keyring
    admission_key: bytes
    tokens: ConnectionTokens
    http: httpx.AsyncClient
    stopping: Callable[[], bool]
    """True once the dispatcher is stopping: start nothing new."""
    jitter: Callable[[], float]
    """Uniform random numbers in [0, 1) for retry delays."""

    @property
    def namespace(self) -> str:
        """The deployment's namespace."""
        return self.store.runtime.config.namespace
