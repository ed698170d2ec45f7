"""The parsed form of a workflow (format ``registry-coordinator/workflow/v1``).

Values an author writes in ``input``, ``output``, wait-for identifying fields and predicates
stay plain JSON-like data (dicts, lists, strings, numbers); strings may hold ``${…}``
expressions that ``core.workflow.expr`` parses and evaluates. Records are frozen; treat the
mappings inside them as read-only too (a parsed workflow is shared between tasks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WORKFLOW_FORMAT = "registry-coordinator/workflow/v1"
# The first coordinator release that runs this format. Packages record it as
# ``coordinator.minVersion``: a constant of the format, not the building tool's version, so a
# package's digest does not change when the coordinator is upgraded.
FORMAT_MIN_COORDINATOR = "0.1.0"
MAX_STEPS = 64
MAX_SOURCE_BYTES = 256 * 1024
DEFAULT_DEADLINE_SECONDS = 300


# ---------------------------------------------------------------------------------- predicates


@dataclass(frozen=True)
class Equals:
    """``equals: [left, right]``."""

    left: Any
    right: Any


@dataclass(frozen=True)
class In:
    """``in: [item, [options…]]``; ``options`` may also be one expression naming a list."""

    item: Any
    options: Any


@dataclass(frozen=True)
class Exists:
    """``exists: "${…}"``."""

    value: str


@dataclass(frozen=True)
class All:
    """``all: [p, …]``: every predicate holds."""

    items: tuple[Predicate, ...]


@dataclass(frozen=True)
class AnyOf:
    """``any: [p, …]``: at least one predicate holds."""

    items: tuple[Predicate, ...]


@dataclass(frozen=True)
class Not:
    """``not: p``."""

    item: Predicate


Predicate = Equals | In | Exists | All | AnyOf | Not


# --------------------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class CallStep:
    """Call one product operation through a named connection."""

    id: str
    connection: str
    operation: str
    input: Mapping[str, Any]
    output: Mapping[str, Any]
    deadline_seconds: int
    next: str
    on_refused: str | None

    def edges(self) -> tuple[tuple[str, str], ...]:
        """(edge kind, target step) pairs leaving this step."""
        out = [("next", self.next)]
        if self.on_refused is not None:
            out.append(("onRefused", self.on_refused))
        return tuple(out)

    @property
    def kept(self) -> tuple[str, ...]:
        """Field names later steps can read as ``${steps.<id>.<field>}``."""
        return tuple(self.output)


@dataclass(frozen=True)
class Branch:
    """One ``{when, next}`` entry of a ``choose`` step."""

    when: Predicate
    next: str


@dataclass(frozen=True)
class ChooseStep:
    """Continue at the first branch whose predicate holds, else at ``otherwise``."""

    id: str
    branches: tuple[Branch, ...]
    otherwise: str

    def edges(self) -> tuple[tuple[str, str], ...]:
        """(edge kind, target step) pairs leaving this step."""
        return (
            *((f"choose[{i}]", b.next) for i, b in enumerate(self.branches)),
            ("otherwise", self.otherwise),
        )

    @property
    def kept(self) -> tuple[str, ...]:
        """A choose step keeps no values."""
        return ()


@dataclass(frozen=True)
class WaitUntilStep:
    """A durable timer: wake at ``at`` (an RFC 3339 instant) or ``after_seconds`` from now."""

    id: str
    at: str | None
    after_seconds: int | None
    next: str

    def edges(self) -> tuple[tuple[str, str], ...]:
        """(edge kind, target step) pairs leaving this step."""
        return (("next", self.next),)

    @property
    def kept(self) -> tuple[str, ...]:
        """A timer keeps no values."""
        return ()


@dataclass(frozen=True)
class WaitForStep:
    """Wait for a named product result, identified by ``identifying`` field values."""

    id: str
    connection: str
    result: str
    identifying: Mapping[str, Any]
    timeout_seconds: int | None
    next: str
    on_timeout: str | None
    result_fields: tuple[str, ...]
    """The result's fields (from the catalogue), kept when the result arrives."""

    def edges(self) -> tuple[tuple[str, str], ...]:
        """(edge kind, target step) pairs leaving this step."""
        out = [("next", self.next)]
        if self.on_timeout is not None:
            out.append(("onTimeout", self.on_timeout))
        return tuple(out)

    @property
    def kept(self) -> tuple[str, ...]:
        """Field names later steps can read as ``${steps.<id>.<field>}``."""
        return self.result_fields


@dataclass(frozen=True)
class FinishStep:
    """End the run with one of the workflow's outcomes."""

    id: str
    outcome: str

    def edges(self) -> tuple[tuple[str, str], ...]:
        """A finish step has no successor."""
        return ()

    @property
    def kept(self) -> tuple[str, ...]:
        """A finish step keeps no values."""
        return ()


Step = CallStep | ChooseStep | WaitUntilStep | WaitForStep | FinishStep

STEP_KINDS = ("call", "choose", "wait-until", "wait-for", "finish")


def step_kind(step: Step) -> str:
    """The YAML key of a step's type (``call``, ``wait-for``, …)."""
    return {
        CallStep: "call",
        ChooseStep: "choose",
        WaitUntilStep: "wait-until",
        WaitForStep: "wait-for",
        FinishStep: "finish",
    }[type(step)]


# ------------------------------------------------------------------------------------ workflow


@dataclass(frozen=True)
class Workflow:
    """One checked workflow definition."""

    id: str
    version: str
    description: str
    input_schema: Mapping[str, Any]
    connections: Mapping[str, str]
    """Connection name -> connection type."""
    outcomes: tuple[str, ...]
    start: str
    on_cancel: str | None
    steps: Mapping[str, Step]
    """Steps by id, in source order."""

    def step(self, step_id: str) -> Step:
        """The step called ``step_id`` (KeyError if there is none)."""
        return self.steps[step_id]
