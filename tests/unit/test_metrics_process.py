"""Each component's process series and the build info, and how the gateway merges them
(core.metrics; CONTRACT §13)."""

from __future__ import annotations

import gc
import os
import platform
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from core import __version__
from core.metrics import exposition, merge, new_registry
from dispatcher.metrics import DispatchMetrics
from gateway.app import create_metrics_app
from gateway.metrics import HttpMetrics
from tests.helpers.gateway_kit import FakeBackend, client_for, context, primed

PROCESS_FAMILIES = (
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
)
GC_FAMILIES = (
    "python_gc_collections",
    "python_gc_objects_collected",
    "python_gc_objects_uncollectable",
)
COMPONENTS = ("gateway", "admission", "dispatcher", "recovery", "auditd")
SUFFIXES = {"gauge": ("",), "counter": ("",), "histogram": ("_bucket", "_sum", "_count")}
"""The sample names a family of each type the coordinator writes may have."""
FORBIDDEN_LABELS = re.compile(r"workflow|run|principal|subject|client|caller", re.IGNORECASE)


def samples_of(text: str) -> dict[str, list[Sample]]:
    """Each family's samples, by family name."""
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float:
    """The one sample called ``name`` with exactly ``labels``."""
    found = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels == labels
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def assert_valid_document(text: str) -> None:
    """Each family declared once, its samples right under its declaration, no series twice
    (what Prometheus refuses a scrape for); the library's parser reads it all."""
    declared: list[str] = []
    allowed: tuple[str, ...] = ()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            declared.append(name)
            allowed = tuple(name + suffix for suffix in SUFFIXES[kind])
        elif line and not line.startswith("#"):
            assert re.split(r"[{ ]", line, maxsplit=1)[0] in allowed, line
    assert len(declared) == len(set(declared)), declared
    series = [
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
    assert len(series) == len(set(series))


@contextmanager
def open_descriptors(count: int) -> Iterator[None]:
    pipes = [os.pipe() for _ in range(count // 2)]
    try:
        yield
    finally:
        for read, write in pipes:
            os.close(read)
            os.close(write)


# ------------------------------------------------------------------------ one registry


def test_a_components_registry_reports_this_process_labelled_with_the_component() -> None:
    registry = new_registry("auditd")
    before = exposition(registry)
    with open_descriptors(32):
        during = exposition(registry)
    families = samples_of(during)
    for name in PROCESS_FAMILIES:
        [sample] = families[name]
        assert sample.labels == {"component": "auditd"}, name
    open_before = value(before, "process_open_fds", component="auditd")
    assert value(during, "process_open_fds", component="auditd") - open_before >= 32
    assert value(during, "process_resident_memory_bytes", component="auditd") > 0
    assert value(during, "process_cpu_seconds_total", component="auditd") > 0
    started = value(during, "process_start_time_seconds", component="auditd")
    assert 0 < started <= time.time()


def test_gc_and_python_info_are_this_interpreters() -> None:
    registry = new_registry("recovery")
    labels = {"component": "recovery", "generation": "2"}
    before = value(exposition(registry), "python_gc_collections_total", **labels)
    gc.collect()
    after = exposition(registry)
    assert value(after, "python_gc_collections_total", **labels) >= before + 1
    for name in GC_FAMILIES:
        generations = {s.labels["generation"] for s in samples_of(after)[name]}
        assert {s.labels["component"] for s in samples_of(after)[name]} == {"recovery"}
        assert generations == {"0", "1", "2"}, name
    [info] = samples_of(after)["python_info"]
    assert info.value == 1
    assert info.labels["component"] == "recovery"
    assert info.labels["version"] == platform.python_version()


def test_build_info_is_one_series_with_the_product_and_python_versions() -> None:
    text = exposition(new_registry("admission"))
    [sample] = samples_of(text)["coordinator_build_info"]
    assert sample.value == 1
    assert sample.labels == {"version": __version__, "python": platform.python_version()}
    assert_valid_document(text)


def test_the_gateway_and_dispatcher_registries_name_their_component() -> None:
    for text, component in (
        (HttpMetrics().render(), "gateway"),
        (DispatchMetrics().render(), "dispatcher"),
    ):
        families = samples_of(text)
        assert {s.labels["component"] for s in families["python_info"]} == {component}
        assert len(families["coordinator_build_info"]) == 1
        assert_valid_document(text)


# --------------------------------------------------------------------------------- merge


def test_merge_keeps_every_components_process_series_once_and_one_build_info() -> None:
    texts = [exposition(new_registry(component)) for component in COMPONENTS]
    # The dispatcher answering twice (two scrapes) must not give its series twice, and a
    # later build info (another version) never joins the first.
    again = exposition(new_registry("dispatcher"))
    other_build = (
        "# TYPE coordinator_build_info gauge\n"
        'coordinator_build_info{python="2.7.18",version="9.9.9"} 1\n'
    )
    merged = merge([*texts, again, other_build])
    assert_valid_document(merged)
    families = samples_of(merged)
    for name in ("python_info", *(PROCESS_FAMILIES if Path("/proc/self/stat").exists() else ())):
        by_component = [s.labels["component"] for s in families[name]]
        assert sorted(by_component) == sorted(COMPONENTS), name
    [build] = families["coordinator_build_info"]
    assert build.labels == {"version": __version__, "python": platform.python_version()}


def test_a_family_is_merged_per_component_only_when_both_copies_are_labelled_by_it() -> None:
    first = (
        "# TYPE plain gauge\nplain 1\n"
        '# TYPE typed gauge\ntyped{component="gateway"} 1\n'
        '# TYPE partly gauge\npartly{component="gateway"} 1\n'
    )
    second = (
        '# TYPE plain gauge\nplain{component="recovery"} 2\n'
        '# TYPE typed_total counter\ntyped_total{component="recovery"} 2\n'
        '# TYPE partly gauge\npartly{component="recovery"} 2\npartly 3\n'
    )
    merged = merge([first, second])
    assert_valid_document(merged)
    families = samples_of(merged)
    assert set(families) == {"plain", "typed", "partly"}
    assert [(s.labels, s.value) for s in families["plain"]] == [({}, 1)]
    assert [(s.labels, s.value) for s in families["typed"]] == [({"component": "gateway"}, 1)]
    assert [(s.labels, s.value) for s in families["partly"]] == [({"component": "gateway"}, 1)]


def test_merge_takes_a_components_histogram_from_one_text_only() -> None:
    first = (
        "# TYPE h_seconds histogram\n"
        'h_seconds_bucket{component="gateway",le="1"} 1\n'
        'h_seconds_bucket{component="gateway",le="+Inf"} 1\n'
        'h_seconds_sum{component="gateway"} 0.5\nh_seconds_count{component="gateway"} 1\n'
    )
    second = (
        "# TYPE h_seconds histogram\n"
        'h_seconds_bucket{component="gateway",le="5"} 7\n'
        'h_seconds_bucket{component="gateway",le="+Inf"} 7\n'
        'h_seconds_sum{component="gateway"} 9\nh_seconds_count{component="gateway"} 7\n'
        'h_seconds_bucket{component="auditd",le="+Inf"} 2\n'
        'h_seconds_sum{component="auditd"} 1\nh_seconds_count{component="auditd"} 2\n'
    )
    merged = merge([first, second])
    assert_valid_document(merged)
    [family] = list(text_string_to_metric_families(merged))
    gateway = {
        (s.name, s.labels.get("le")): s.value
        for s in family.samples
        if s.labels["component"] == "gateway"
    }
    assert gateway == {
        ("h_seconds_bucket", "1"): 1,
        ("h_seconds_bucket", "+Inf"): 1,
        ("h_seconds_sum", None): 0.5,
        ("h_seconds_count", None): 1,
    }
    auditd = [s for s in family.samples if s.labels["component"] == "auditd"]
    assert [s.value for s in auditd] == [2, 1, 2]


async def test_the_metrics_listener_shows_each_reachable_process_once() -> None:
    backend = FakeBackend()
    dispatcher = DispatchMetrics()
    dispatcher.record_call("messaging", "accepted", 0.1)
    backend.metric_texts = (dispatcher.render(), exposition(new_registry("recovery")))
    ctx = await primed(context(backend))
    async with client_for(create_metrics_app(ctx)) as scrape:
        text = (await scrape.get("/metrics")).text
    assert_valid_document(text)
    families = samples_of(text)
    components = {s.labels["component"] for s in families["python_info"]}
    assert components == {"gateway", "dispatcher", "recovery"}
    assert len(families["coordinator_build_info"]) == 1
    calls = families["coordinator_calls"]
    assert sum(s.value for s in calls if s.labels["result"] == "accepted") == 1
    labels = {name for family in families.values() for s in family for name in s.labels}
    assert not {name for name in labels if FORBIDDEN_LABELS.search(name)}
