"""The states a run and a step are in, and a step's effect, as types (schema.sql's CHECKs).

``StrEnum`` members are the very strings the database stores and the API documents show, so
they pass to queries and into JSON unchanged; code names them instead of spelling them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class RunState(StrEnum):
    """``run.state``."""

    RUNNING = "running"
    WAITING = "waiting"
    HELD = "held"
    """A call's effect is unknown: an operator decides."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        """Whether nothing more happens to a run in this state."""
        return self in ENDED_RUN_STATES


ENDED_RUN_STATES: Final = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})


class StepState(StrEnum):
    """``step.state``."""

    READY = "ready"
    PREPARED = "prepared"
    """The command is committed and may have been sent."""
    WAITING = "waiting"
    UNCERTAIN = "uncertain"
    NOT_SENT = "not-sent"
    """A receipt check proved the command never arrived."""
    COMPLETED = "completed"
    REFUSED = "refused"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Effect(StrEnum):
    """``step.effect``: what is known of a call's effect downstream."""

    ACCEPTED = "accepted"
    UNKNOWN = "unknown"


class SentNothing(StrEnum):
    """The ``step.cause`` of a call that sent nothing and cannot until someone mends what
    stood in the way (schema.sql's ``sent_nothing()`` lists the same). The step waits, ready,
    to try again until its deadline, and its run asks for attention until the step next
    prepares or ends (CONTRACT §8.4)."""

    TOKEN_REFUSED = "token-refused"  # noqa: S105 - a cause, not a secret
    """The issuer refused the connection's token, or granted narrower scopes."""
    TLS_REFUSED = "tls-refused"
    """A product or the issuer failed TLS verification (untrusted, expired or misnamed)."""


class RetryCause(StrEnum):
    """``step.retry_cause``: what the last attempt of a call waiting for its next automatic
    attempt met (inspection's ``retry.lastCause``, CONTRACT §8.4; schema.sql lists the same).
    :func:`core.execution.classify.retry_cause` says which answer is which."""

    NEVER_CONNECTED = "never-connected"
    """No connection to the product was made (refused, no route, no such name)."""
    TLS_REFUSED = "tls-refused"
    """The product or the issuer failed TLS verification: nothing left."""
    TOKEN_REFUSED = "token-refused"  # noqa: S105 - a cause, not a secret
    """No token to send with: the issuer refused it, or the product refused the one sent
    (401) and the issuer gave no fresh one."""
    STATUS_429 = "status-429"
    """The product answered 429: too many requests, come back later."""
    STATUS_503 = "status-503"
    """The product answered 503 ``service.unavailable``."""


RETRYING: Final = "retrying"
"""The ``step.cause`` of a ready call that has kept getting retryable answers for longer than
``deployment.attention.retryingAfterSeconds``: its run asks for attention until the step
next prepares or ends (CONTRACT §8.4)."""


class Transition(StrEnum):
    """What a step transition function of ``transitions.sql`` did (its header says what
    each outcome writes)."""

    WRITTEN = "written"
    LEASE_LOST = "lease-lost"
    """The step is not leased to the caller: nothing written."""
    RESTORE_HELD = "restore-held"
    """The caller's lease is from before the current restore-hold: nothing written."""
    ALREADY_SETTLED = "already-settled"
    """The step has ended already: nothing written."""
    ABANDONED = "abandoned"
    """A cancel abandoned the step: its own end is kept, nothing follows it."""
    HELD = "held"
    """The execution hold is set: nothing is executed."""
    RUN_ENDED = "run-ended"
    """The run ended while the step was leased: the step's end only."""
    ERASED = "erased"
    """Retention erased the run's values: the step's end, none of its payloads."""
    CHANGED = "changed"
    """(Operator mode) the step is not the version the operator's action read: nothing
    written."""

    @property
    def moved(self) -> bool:
        """Whether the transition wrote anything at all."""
        return self not in NOTHING_WRITTEN


NOTHING_WRITTEN: Final = frozenset(
    {
        Transition.LEASE_LOST,
        Transition.RESTORE_HELD,
        Transition.ALREADY_SETTLED,
        Transition.CHANGED,
    }
)
