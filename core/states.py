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
