"""Which executor works on each step kind: each does the work of its kind that only a dispatcher
can do (send a command, read a result, store a timer), deciding through
:mod:`core.execution.steps`, and records what came of it through the settler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from core.execution.steps import STEPS, Reached
from dispatcher.claim import Claimed
from dispatcher.run_view import Loaded
from dispatcher.steps import call, local, wait_for, wait_until
from dispatcher.steps.base import Flight, StepEnv

Executor = Callable[[StepEnv, Claimed, Loaded, Any, Flight, Reached], Awaitable[None]]

EXECUTORS: Final[Mapping[str, Executor]] = MappingProxyType(
    {
        "call": call.execute,
        "choose": local.execute,
        "finish": local.execute,
        "wait-until": wait_until.execute,
        "wait-for": wait_for.execute,
    }
)
"""The executor of each step kind (``step_kind``; the kinds of :data:`STEPS`)."""

assert set(EXECUTORS) == set(STEPS)  # every kind has its executor
