"""The gateway's Prometheus series and the one ``/metrics`` document (CONTRACT §13).

The gateway counts its HTTP answers by route **template** (``/v1/runs/{runId}``), never by
raw path, so no run id, workflow or principal ever becomes a label. ``/metrics`` is the
gateway's own text followed by each component's Metrics RPC text; a metric family that an
earlier text already holds is dropped from a later one, so the exposition never names a
family twice (the gateway's readiness gauges win over a component's copy).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from typing import Final

from gateway.health import Readiness

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED_ROUTE: Final = "unmatched"
"""The ``route`` label of requests no route matched."""

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{name}="{_escape(value)}"' for name, value in pairs)
    return "{" + inner + "}" if inner else ""


class HttpMetrics:
    """``coordinator_http_requests_total{route,status}`` of the main listener."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        # uvicorn serves on one loop, but a counter must not depend on that.
        self._lock = threading.Lock()

    def observe(self, route: str, status: int) -> None:
        """Count one answer; ``route`` is a route template or :data:`UNMATCHED_ROUTE`."""
        with self._lock:
            key = (route, str(status))
            self._counts[key] = self._counts.get(key, 0) + 1

    def count(self, route: str, status: int) -> int:
        """How many answers ``route`` gave with ``status`` so far."""
        with self._lock:
            return self._counts.get((route, str(status)), 0)

    def render(self) -> str:
        """The counter family as Prometheus text."""
        with self._lock:
            counts = sorted(self._counts.items())
        lines = [
            "# HELP coordinator_http_requests_total HTTP answers of the main listener.",
            "# TYPE coordinator_http_requests_total counter",
        ]
        for (route, status), value in counts:
            labels = _labels((("route", route), ("status", status)))
            lines.append(f"coordinator_http_requests_total{labels} {value}")
        return "\n".join(lines) + "\n"


def _gauge(name: str, help_text: str, samples: Sequence[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for labels, value in samples:
        lines.append(f"{name}{labels} {value:g}")
    return lines


def readiness_text(readiness: Readiness) -> str:
    """The readiness gauges; always present, also when everything is down."""
    lines: list[str] = []
    lines += _gauge(
        "coordinator_store_available",
        "1 when every component reaches the database.",
        [("", 1 if readiness.store_available else 0)],
    )
    lines += _gauge(
        "coordinator_audit_ready",
        "1 when the audit journal accepts records.",
        [("", 1 if readiness.audit_ready else 0)],
    )
    lines += _gauge(
        "coordinator_token_verifier_ready",
        "1 when the gateway holds the issuer's signing keys.",
        [("", 1 if readiness.verifier_ready else 0)],
    )
    lines += _gauge(
        "coordinator_component_up",
        "1 when the component answered its health check.",
        [(_labels((("component", name),)), 1 if up else 0) for name, up in readiness.components],
    )
    return "\n".join(lines) + "\n"


def _family_of(line: str, current: str | None) -> str | None:
    if line.startswith("#"):
        parts = line.split(maxsplit=3)
        if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
            return parts[2]
        return current
    match = _METRIC_NAME.match(line)
    if match is None:
        return current
    name = match.group(0)
    # Histogram and summary samples (_bucket, _sum, _count) belong to the family above them.
    if current is not None and name.startswith(current):
        return current
    return name


def merge(texts: Sequence[str]) -> str:
    """Concatenate exposition texts, keeping the first occurrence of each metric family."""
    seen: set[str] = set()
    out: list[str] = []
    for text in texts:
        families: set[str] = set()
        current: str | None = None
        for raw in text.splitlines():
            line = raw.rstrip()
            if not line or line == "# EOF":
                continue
            family = _family_of(line, current)
            current = family
            if family is None or family in seen:
                continue
            families.add(family)
            out.append(line)
        seen |= families
    return "\n".join(out) + "\n"
