"""The dispatcher's own series, in the Prometheus text exposition format (CONTRACT §13).

Labels never name a workflow, a run or a principal: only the connection type and the
classified result, so the series count stays small and says nothing about who did what.
Every (connection type, result) pair of ``coordinator_calls_total`` is present from the
start, at 0, so an alert can tell "no calls" from "no dispatcher".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from core.config.model import CONNECTION_TYPES
from dispatcher.classify import RESULTS

CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ADMISSION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 300.0)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    pairs = [*labels, *([extra] if extra else [])]
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


@dataclass
class Counter:
    """A monotonically increasing count per label set."""

    name: str
    help: str
    values: dict[Labels, float] = field(default_factory=dict)

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        """Add ``amount`` to the series of ``labels``."""
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def touch(self, labels: Labels) -> None:
        """Make the series exist (at 0) without counting anything."""
        self.values.setdefault(labels, 0.0)

    def get(self, labels: Labels = ()) -> float:
        """The series' current value (0 when absent)."""
        return self.values.get(labels, 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels in sorted(self.values):
            yield f"{self.name}{_labels(labels)} {_number(self.values[labels])}"


@dataclass
class _Series:
    counts: list[int]
    total: float = 0.0
    observations: int = 0


@dataclass
class Histogram:
    """Observations in cumulative buckets per label set."""

    name: str
    help: str
    buckets: Sequence[float]
    series: dict[Labels, _Series] = field(default_factory=dict)

    def touch(self, labels: Labels = ()) -> _Series:
        """The series of ``labels``, made (empty) if it did not exist."""
        one = self.series.get(labels)
        if one is None:
            one = self.series[labels] = _Series([0] * len(self.buckets))
        return one

    def observe(self, value: float, labels: Labels = ()) -> None:
        """Record one observation."""
        one = self.touch(labels)
        for position, bound in enumerate(self.buckets):
            if value <= bound:
                one.counts[position] += 1
        one.total += value
        one.observations += 1

    def count(self, labels: Labels = ()) -> int:
        """How many observations the series holds."""
        one = self.series.get(labels)
        return 0 if one is None else one.observations

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels in sorted(self.series):
            one = self.series[labels]
            for bound, count in zip(self.buckets, one.counts, strict=True):
                yield f"{self.name}_bucket{_labels(labels, ('le', _number(bound)))} {count}"
            yield f"{self.name}_bucket{_labels(labels, ('le', '+Inf'))} {one.observations}"
            yield f"{self.name}_sum{_labels(labels)} {_number(one.total)}"
            yield f"{self.name}_count{_labels(labels)} {one.observations}"


class DispatchMetrics:
    """The dispatcher's series; one instance per dispatcher process."""

    def __init__(self) -> None:
        self.calls = Counter(
            "coordinator_calls_total",
            "Product calls by connection type and classified result.",
        )
        for connection_type in CONNECTION_TYPES:
            for result in RESULTS:
                self.calls.touch(self.call_labels(connection_type, result))
        self.call_duration = Histogram(
            "coordinator_call_duration_seconds",
            "Time from sending a command to its answer (or failure), per connection type.",
            CALL_BUCKETS,
        )
        self.admission_to_dispatch = Histogram(
            "coordinator_admission_to_dispatch_seconds",
            "Time from a run's admission to the sending of its first command.",
            ADMISSION_BUCKETS,
        )
        self.token_refusals = Counter(
            "coordinator_token_refusals_total",
            "Token requests the issuer refused (or answered with narrower scopes), per "
            "connection type; nothing is sent with such a token.",
        )
        for connection_type in CONNECTION_TYPES:
            self.call_duration.touch((("connection_type", connection_type),))
            self.token_refusals.touch((("connection_type", connection_type),))
        self.admission_to_dispatch.touch()

    @staticmethod
    def call_labels(connection_type: str, result: str) -> Labels:
        """The label set of one ``coordinator_calls_total`` series."""
        return (("connection_type", connection_type), ("result", result))

    def record_call(self, connection_type: str, result: str, seconds: float) -> None:
        """Count one classified call attempt and how long it took."""
        self.calls.inc(self.call_labels(connection_type, result))
        self.call_duration.observe(seconds, (("connection_type", connection_type),))

    def record_token_refusal(self, connection_type: str) -> None:
        """Count one refused token request of a call."""
        self.token_refusals.inc((("connection_type", connection_type),))

    def record_first_dispatch(self, seconds: float) -> None:
        """Observe a run's admission-to-first-command time."""
        self.admission_to_dispatch.observe(max(seconds, 0.0))

    def render(self) -> str:
        """Every series as Prometheus text, ending with a newline."""
        lines: list[str] = []
        for metric in (
            self.calls,
            self.call_duration,
            self.admission_to_dispatch,
            self.token_refusals,
        ):
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"
