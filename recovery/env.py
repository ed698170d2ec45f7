"""What recovery's operator actions work with: the store, the keys, the product clients.

One :class:`RecoveryEnv` per running recovery component. Reconcile reads receipts with each
connection's own OAuth client (so a recovery-only instance can settle calls without a
dispatcher); retry-same and cancel only write the database, and the dispatcher of an
ordinary instance does the sending.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from core.crypto import Keyring, keyring_from_config
from core.products.calls import ConnectionCalls
from core.products.http import Exchanger
from core.products.tokens import ConnectionTokens
from core.runtime import Store
from core.workflow.stored import WorkflowCache

RECEIPT_TIMEOUT_SECONDS = 10.0
"""How long a receipt read may take before reconcile answers service.unavailable."""


@dataclass
class RecoveryEnv:
    """The parts every operator action uses."""

    store: Store
    keyring: Keyring
    admission_key: bytes
    """Derives command keys: a step leased but never prepared has none stored, yet the
    holder may have sent it under the key every attempt of that step carries."""
    tokens: ConnectionTokens
    http: Exchanger
    calls: ConnectionCalls
    """Each connection's exchange deadline and TLS trust, for receipt reads."""
    recovery_only: bool
    """True under ``--recovery-only``: nothing is dispatched, so retry-same is refused."""
    workflows: WorkflowCache = field(default_factory=WorkflowCache)
    sleep: Callable[[float], Awaitable[None]] | None = None
    """Replaces ``asyncio.sleep`` in tests of retry-same's bounded wait for its answer."""

    @property
    def namespace(self) -> str:
        """The deployment's namespace."""
        return self.store.runtime.config.namespace

    @classmethod
    def from_store(cls, store: Store, http: Exchanger, *, recovery_only: bool) -> RecoveryEnv:
        """The environment of the store's runtime file: its state keys and connections."""
        runtime = store.runtime
        return cls(
            store=store,
            keyring=keyring_from_config(runtime.config, runtime.resolver),
            admission_key=runtime.resolver.read_key(runtime.config.deployment.admission_key_ref),
            tokens=ConnectionTokens(runtime.config, runtime.resolver, http),
            http=http,
            calls=ConnectionCalls(runtime.config, runtime.resolver),
            recovery_only=recovery_only,
        )
