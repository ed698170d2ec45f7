"""Where the kill -9 tests (tests/fault/) stop a dispatcher in the middle of a call.

The call executor tells its :class:`CrashPoints` each point of the protocol it passes:
:data:`AFTER_PREPARE` and :data:`AFTER_ANSWER`. A dispatcher is given the hook when it is
made and passes every point silently by default. Only the dispatcher's startup reads the
environment (:func:`crash_points_from`): a process started with ``COORDINATOR_TEST_CRASH_AT``
naming a point SIGKILLs itself exactly there. Production never sets it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

AFTER_PREPARE: Final = "after-prepare"
"""The command is committed as prepared, and not sent."""
AFTER_ANSWER: Final = "after-answer"
"""The product answered; the outcome is not committed."""
CRASH_AT_ENV: Final = "COORDINATOR_TEST_CRASH_AT"


class CrashPoints(Protocol):
    """Told each point of the call protocol an execution passes."""

    def reached(self, point: str) -> None:
        """The execution is at ``point``."""


class NoCrash:
    """Passes every point: what a dispatcher has unless a test says otherwise."""

    def reached(self, point: str) -> None:
        return None


@dataclass(frozen=True)
class KillAt:
    """SIGKILLs this process when the execution reaches ``point``."""

    point: str

    def reached(self, point: str) -> None:
        if point == self.point:
            os.kill(os.getpid(), signal.SIGKILL)


def crash_points_from(environ: Mapping[str, str]) -> CrashPoints:
    """The crash point ``COORDINATOR_TEST_CRASH_AT`` names in ``environ``, if any."""
    point = environ.get(CRASH_AT_ENV)
    return NoCrash() if point is None else KillAt(point)
