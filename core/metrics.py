"""Prometheus series of every component, written and merged by prometheus-client (§13).

Each component keeps its own :class:`~prometheus_client.CollectorRegistry` (never the
library's process-wide default, so an all-in-one process or a test holds several apart) and
answers the gateway's Metrics RPC with its exposition. Gauges read from the database at
scrape time are families made for that one answer (:func:`render`). The gateway parses the
components' texts back into families with the library's parser and writes one document
(:func:`merge`), the first copy of a family winning.

No series carries a workflow, run or principal label: the labels are connection types,
results, states, holds, components, route templates and statuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

# The *_created series say when a process first counted something; nobody alerts on it and
# every counter and histogram would double its series.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""The media type of the text exposition format :func:`generate_latest` writes."""


def new_registry() -> CollectorRegistry:
    """A component's own registry."""
    return CollectorRegistry(auto_describe=True)


def exposition(registry: CollectorRegistry) -> str:
    """Every series of ``registry`` as exposition text, ending with a newline."""
    return generate_latest(registry).decode()


class _Families(Collector):
    """Families made for one answer."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: Iterable[Metric]) -> str:
    """``families`` as exposition text, in the order given."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families)))
    return exposition(registry)


def gauge(
    name: str,
    documentation: str,
    samples: Iterable[tuple[Sequence[str], float]] = (),
    *,
    labels: Sequence[str] = (),
) -> GaugeMetricFamily:
    """A gauge family: each sample is (label values in ``labels``' order, value)."""
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def merge(texts: Sequence[str]) -> str:
    """One document of several exposition texts; a family an earlier text holds is
    dropped from a later one, so no family is ever declared twice."""
    seen: set[str] = set()
    kept: list[Metric] = []
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in seen:
                seen.add(family.name)
                kept.append(family)
    return render(kept)
