"""Prometheus series of every component, written and merged by prometheus-client (§13).

Each component keeps its own :class:`~prometheus_client.CollectorRegistry` (never the
library's process-wide default, so a test, or anything else holding several components in
one interpreter, keeps them apart) and answers the gateway's Metrics RPC with its
exposition. Gauges read from the database at scrape time are families made for that one
answer (:func:`render`). The gateway parses the components' texts back into families with
the library's parser and writes one document (:func:`merge`), the first copy of a family
winning.

No series carries a workflow, run or principal label: the labels are connection types,
results, states, holds, components, route templates and statuses, and the interpreter's and
the product's versions.

Process series. A registry made by :func:`new_registry` holds from the start the library's
standard series of the process it lives in: ``process_*`` (CPU seconds, resident and
virtual memory, open and maximum file descriptors, start time; Linux only, read from
``/proc``), ``python_info`` and ``python_gc_*``. Each component is a process of its own,
in the all-in-one ``coordinator`` too (its launcher starts every component as a child
process and keeps no series itself), so the gateway's merged document holds the series of
several processes. Without a distinguishing label their copies would collide and the first (the
gateway's) would silently stand for all of them, so every one of these series carries a
``component`` label naming the process's component (:data:`COMPONENT_LABEL`), and
:func:`merge` takes such a family whole from each component: a family whose every series
carries ``component``, in the kept copy and the later one alike (and of the same type), is
the union of the components' series, a component's series coming from the first text that
has any. A series is still never declared twice: two texts of one component (two scrapes)
give one copy. A component's own ``/metrics`` listener shows its own process, with the same
label.

``coordinator_build_info{version,python}`` is 1, with the product's version
(:data:`core.__version__`) and the interpreter's; it has no ``component`` label, so a
document holds one series: that of the process that wrote it, and in the gateway's merged
document the gateway's (its text comes first).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from core import __version__

# The *_created series say when a process first counted something; nobody alerts on it and
# every counter and histogram would double its series.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""The media type of the text exposition format :func:`generate_latest` writes."""


COMPONENT_LABEL: Final = "component"
"""The label naming the component (the process) a per-process series describes."""

BUILD_INFO: Final = "coordinator_build_info"


def new_registry(component: str) -> CollectorRegistry:
    """A component's own registry, holding from the start the standard series of this
    process labelled ``component=<component>`` and ``coordinator_build_info``."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_ProcessSeries(component))
    registry.register(_BuildInfo())
    return registry


class _ProcessSeries(Collector):
    """The library's process, platform and garbage-collector series of this process, each
    with the ``component`` label added."""

    def __init__(self, component: str) -> None:
        self._component = component
        # The library's collectors live in a registry of their own, read only through this
        # one, so the component's registry holds nothing unlabelled.
        self._library = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._library)
        PlatformCollector(registry=self._library)
        GCCollector(registry=self._library)

    def collect(self) -> Iterator[Metric]:
        for family in self._library.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                sample._replace(labels={**sample.labels, COMPONENT_LABEL: self._component})
                for sample in family.samples
            ]
            yield labelled


class _BuildInfo(Collector):
    """``coordinator_build_info``: 1, labelled with the product's and Python's versions."""

    def __init__(self) -> None:
        self._family = gauge(
            BUILD_INFO,
            "The product's version and the Python version this process runs; always 1.",
            [((__version__, platform.python_version()), 1)],
            labels=("version", "python"),
        )

    def collect(self) -> Iterator[Metric]:
        yield self._family


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


def _components(family: Metric) -> set[str] | None:
    """The components whose series ``family`` holds, or ``None`` if one of its series
    carries no ``component`` label (the family is not per component)."""
    found: set[str] = set()
    for sample in family.samples:
        component = sample.labels.get(COMPONENT_LABEL)
        if component is None:
            return None
        found.add(component)
    return found


def merge(texts: Sequence[str]) -> str:
    """One document of several exposition texts; no family is ever declared twice.

    A family an earlier text holds is dropped from a later one, except that a family
    labelled by component in both (every series carries ``component``, same type) gains
    the later text's series of components it does not hold yet."""
    kept: dict[str, Metric] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            first = kept.get(family.name)
            if first is None:
                kept[family.name] = family
                continue
            held = _components(first)
            if held is None or first.type != family.type or _components(family) is None:
                continue
            first.samples.extend(
                sample for sample in family.samples if sample.labels[COMPONENT_LABEL] not in held
            )
    return render(kept.values())
