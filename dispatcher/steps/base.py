"""What every step executor is handed: the dispatcher's shared parts and the step's flight,
and how a step that talks to a product gets its access token."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from core.crypto import Keyring
from core.errors import CoordinatorError
from core.products.calls import ConnectionCalls
from core.products.http import Exchanger
from core.products.token_client import UNRECOGNISED, TokenUnavailable
from core.products.tokens import ConnectionTokens
from core.runtime import Store
from core.states import SentNothing
from dispatcher.claim import Claimed
from dispatcher.crash_points import CrashPoints
from dispatcher.metrics import DispatchMetrics
from dispatcher.settings import DispatchSettings
from dispatcher.settle import Settler

log = logging.getLogger("coordinator.dispatcher")

WORKING = "working"
"""Nothing has been sent for this step by this execution."""
SENDING = "sending"
"""A command is on its way or its answer is awaited."""
SETTLING = "settling"
"""The answer is in and being recorded."""


MAX_CHAINED_CALLS = 8
"""At most this many calls one execution prepares while settling the call before each (a
longer run of calls goes on through a claim, so one run never keeps a slot for long)."""


@dataclass
class Flight:
    """How far one step execution got; read by the dispatcher when it has to stop."""

    phase: str = WORKING
    step: Claimed | None = None
    """The call the execution went on to, prepared as the call before it was settled
    (``None``: still the step it was started with). Its lease is the one the dispatcher
    renews and gives back."""
    chained: int = 0
    """How many calls the execution has gone on to."""


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
    http: Exchanger
    """Sends product requests (:class:`core.products.http.ProductHttp`)."""
    calls: ConnectionCalls
    """Each connection's exchange deadline and TLS trust."""
    stopping: Callable[[], bool]
    """True once the dispatcher is stopping: start nothing new."""
    jitter: Callable[[], float]
    """Uniform random numbers in [0, 1) for retry delays."""
    crash_points: CrashPoints
    """Told the points of the call protocol an execution passes (the kill -9 tests')."""


@dataclass(frozen=True)
class TokenWithheld:
    """No token until someone mends what stands in the way, so nothing may be sent: the
    issuer definitely refused the connection's token request (or granted narrower scopes),
    or its TLS certificate failed verification."""

    cause: SentNothing
    """What the step shows: ``token-refused`` or ``tls-refused``."""
    error: str | None = None
    """With ``token-refused``: the issuer's OAuth error code, or ``scope-narrowed``; never a
    value."""


async def call_token(env: StepEnv, connection: str) -> str | TokenWithheld | None:
    """The connection's access token for a command; :class:`TokenWithheld` when the issuer
    refused it or failed TLS verification, ``None`` when the issuer could not be asked for
    another reason (try again later)."""
    try:
        return await env.tokens.token(connection)
    except TokenUnavailable as exc:
        log.warning("no access token for connection %s: %s", connection, exc)
        if exc.cause == SentNothing.TLS_REFUSED:
            # Retryable, but a certificate does not mend by itself: an operator must see it.
            return TokenWithheld(SentNothing.TLS_REFUSED)
        if exc.retryable:
            return None
        return TokenWithheld(SentNothing.TOKEN_REFUSED, exc.error or UNRECOGNISED)
    except CoordinatorError as exc:
        log.warning("no access token for connection %s: %s", connection, exc)
        return None


async def access_token(env: StepEnv, connection: str) -> str | None:
    """The connection's access token; ``None`` (logged) when the issuer gives none."""
    try:
        return await env.tokens.token(connection)
    except (TokenUnavailable, CoordinatorError) as exc:
        # The message names the issuer, client and OAuth error code only.
        log.warning("no access token for connection %s: %s", connection, exc)
        return None
