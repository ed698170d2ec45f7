"""The gateway's Prometheus series and the one ``/metrics`` document (CONTRACT §13).

The gateway counts its HTTP answers by route **template** (``/v1/runs/{runId}``), never by
raw path, so no run id, workflow or principal ever becomes a label. ``/metrics`` is the
gateway's own series followed by each component's Metrics RPC text, merged family by family
through prometheus-client (:func:`core.metrics.merge`): the gateway's readiness gauges win
over a component's copy. The gateway's registry (:class:`HttpMetrics`) also holds the
gateway process's ``process_*`` and ``python_*`` series, labelled ``component="gateway"``
beside each component's own, and ``coordinator_build_info``, which being first is the one
the merged document shows.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter

from core.metrics import CONTENT_TYPE, gauge, merge, new_registry, render
from core.metrics import exposition as _exposition
from gateway.health import Readiness

__all__ = [
    "CONTENT_TYPE",
    "OVER_LIMIT_ROUTE",
    "UNMATCHED_ROUTE",
    "HttpMetrics",
    "merge",
    "readiness_text",
]

UNMATCHED_ROUTE: Final = "unmatched"
"""The ``route`` label of requests no route matched."""
OVER_LIMIT_ROUTE: Final = "over-limit"
"""The ``route`` label of requests answered 503 before routing, because the listener had
``deployment.listener.maxConnections`` connections or requests already."""


class HttpMetrics:
    """``coordinator_http_requests_total{route,status}`` of the main listener, in the
    gateway's registry (with its process series and build info)."""

    def __init__(self) -> None:
        self._registry = new_registry("gateway")
        self._answers = Counter(
            "coordinator_http_requests",
            "HTTP answers of the listeners, by route template (or unmatched, over-limit).",
            ("route", "status"),
            registry=self._registry,
        )

    def observe(self, route: str, status: int) -> None:
        """Count one answer; ``route`` is a route template or :data:`UNMATCHED_ROUTE`."""
        self._answers.labels(route, str(status)).inc()

    def over_limit(self) -> None:
        """Count one request answered 503 for being over ``maxConnections``."""
        self.observe(OVER_LIMIT_ROUTE, 503)

    def count(self, route: str, status: int) -> int:
        """How many answers ``route`` gave with ``status`` so far."""
        value = self._registry.get_sample_value(
            "coordinator_http_requests_total", {"route": route, "status": str(status)}
        )
        return int(value or 0)

    def render(self) -> str:
        """The gateway's registry (the counter family, the process series and the build
        info) as Prometheus text."""
        return _exposition(self._registry)


def readiness_text(readiness: Readiness) -> str:
    """The readiness gauges; always present, also when everything is down."""
    return render(
        [
            gauge(
                "coordinator_store_available",
                "1 when every component reaches the database.",
                [((), 1 if readiness.store_available else 0)],
            ),
            gauge(
                "coordinator_audit_ready",
                "1 when the audit journal accepts records.",
                [((), 1 if readiness.audit_ready else 0)],
            ),
            gauge(
                "coordinator_token_verifier_ready",
                "1 when the gateway holds the issuer's signing keys.",
                [((), 1 if readiness.verifier_ready else 0)],
            ),
            gauge(
                "coordinator_component_up",
                "1 when the component answered its health check.",
                [((name,), 1 if up else 0) for name, up in readiness.components],
                labels=("component",),
            ),
        ]
    )
