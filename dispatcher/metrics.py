"""The dispatcher's own series, kept by prometheus-client (CONTRACT §13).

Labels never name a workflow, a run or a principal: only the connection type and the
classified result, so the series count stays small and says nothing about who did what.
Every (connection type, result) pair of ``coordinator_calls_total`` is present from the
start, at 0, so an alert can tell "no calls" from "no dispatcher". The registry also holds
the dispatcher process's ``process_*`` and ``python_*`` series, labelled
``component="dispatcher"``, and ``coordinator_build_info`` (:func:`core.metrics.new_registry`).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from core.config.model import CONNECTION_TYPES
from core.execution.classify import RESULTS
from core.metrics import exposition, new_registry

CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ADMISSION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 300.0)


class DispatchMetrics:
    """The dispatcher's series; one instance (and registry) per dispatcher."""

    def __init__(self) -> None:
        self.registry = new_registry("dispatcher")
        self._calls = Counter(
            "coordinator_calls",
            "Product calls by connection type and classified result.",
            ("connection_type", "result"),
            registry=self.registry,
        )
        self._call_duration = Histogram(
            "coordinator_call_duration_seconds",
            "Time from sending a command to its answer (or failure), per connection type.",
            ("connection_type",),
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self._admission_to_dispatch = Histogram(
            "coordinator_admission_to_dispatch_seconds",
            "Time from a run's admission to the sending of its first command.",
            buckets=ADMISSION_BUCKETS,
            registry=self.registry,
        )
        self._token_refusals = Counter(
            "coordinator_token_refusals",
            "Token requests the issuer refused (or answered with narrower scopes), per "
            "connection type; nothing is sent with such a token.",
            ("connection_type",),
            registry=self.registry,
        )
        # Made once, so every series exists at 0 and counting skips the label look-up.
        self._call_series = {
            (kind, result): self._calls.labels(kind, result)
            for kind in CONNECTION_TYPES
            for result in RESULTS
        }
        self._duration_series = {
            kind: self._call_duration.labels(kind) for kind in CONNECTION_TYPES
        }
        for kind in CONNECTION_TYPES:
            self._token_refusals.labels(kind)

    def record_call(self, connection_type: str, result: str, seconds: float) -> None:
        """Count one classified call attempt and how long it took."""
        series = self._call_series.get((connection_type, result))
        if series is None:
            series = self._calls.labels(connection_type, result)
        series.inc()
        duration = self._duration_series.get(connection_type)
        if duration is None:
            duration = self._call_duration.labels(connection_type)
        duration.observe(seconds)

    def record_token_refusal(self, connection_type: str) -> None:
        """Count one refused token request of a call."""
        self._token_refusals.labels(connection_type).inc()

    def record_first_dispatch(self, seconds: float) -> None:
        """Observe a run's admission-to-first-command time."""
        self._admission_to_dispatch.observe(max(seconds, 0.0))

    def calls(self, connection_type: str, result: str) -> int:
        """How many calls of ``connection_type`` were classified ``result``."""
        labels = {"connection_type": connection_type, "result": result}
        return int(self.registry.get_sample_value("coordinator_calls_total", labels) or 0)

    def render(self) -> str:
        """Every series as Prometheus text, ending with a newline."""
        return exposition(self.registry)
