"""Every component's series go through prometheus-client (core.metrics): none by hand."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from core.metrics import merge
from dispatcher.metrics import DispatchMetrics
from gateway.metrics import HttpMetrics

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("core", "gateway", "admission", "dispatcher", "recovery", "auditd", "cli")


def test_no_product_module_writes_exposition_text_itself() -> None:
    writers = [
        str(path.relative_to(ROOT))
        for folder in PRODUCT
        for path in (ROOT / folder).rglob("*.py")
        if "# TYPE " in path.read_text() or "# HELP " in path.read_text()
    ]
    assert writers == []


def test_a_merged_document_parses_and_names_each_family_once() -> None:
    dispatcher = DispatchMetrics()
    dispatcher.record_call("messaging", "accepted", 0.2)
    http = HttpMetrics()
    http.observe("/v1/runs/{runId}", 200)
    # The dispatcher's counters twice (two scrapes of one component): the first copy wins.
    second = DispatchMetrics()
    second.record_call("messaging", "accepted", 0.2)
    second.record_call("messaging", "accepted", 0.2)
    text = merge([http.render(), dispatcher.render(), second.render()])
    families = list(text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert len(names) == len(set(names))
    assert {"coordinator_calls", "coordinator_http_requests"} <= set(names)
    [calls] = [family for family in families if family.name == "coordinator_calls"]
    accepted = [
        sample.value
        for sample in calls.samples
        if sample.labels == {"connection_type": "messaging", "result": "accepted"}
    ]
    assert accepted == [1.0]
    assert "_created" not in text
