"""The dispatcher's Prometheus series: names, labels, buckets."""

from __future__ import annotations

import re

import pytest

from dispatcher.metrics import CALL_BUCKETS, DispatchMetrics


def samples(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value.replace("+Inf", "inf"))
    return found


def test_every_call_series_exists_at_zero_before_any_call() -> None:
    text = DispatchMetrics().render()
    values = samples(text)
    for kind in ("messaging", "scheduling", "breg-action", "casework-review-producer"):
        for result in ("accepted", "retryable", "refused", "uncertain"):
            key = f'coordinator_calls_total{{connection_type="{kind}",result="{result}"}}'
            assert values[key] == 0
    assert values["coordinator_admission_to_dispatch_seconds_count"] == 0
    assert "# TYPE coordinator_call_duration_seconds histogram" in text
    assert text.endswith("\n")


def test_calls_and_durations_are_counted() -> None:
    metrics = DispatchMetrics()
    metrics.record_call("messaging", "accepted", 0.02)
    metrics.record_call("messaging", "accepted", 0.3)
    metrics.record_call("messaging", "uncertain", 31.0)
    metrics.record_first_dispatch(0.004)
    metrics.record_first_dispatch(-1.0)  # a clock step backwards counts as instant
    values = samples(metrics.render())
    assert values['coordinator_calls_total{connection_type="messaging",result="accepted"}'] == 2
    assert values['coordinator_calls_total{connection_type="messaging",result="uncertain"}'] == 1
    bucket = 'coordinator_call_duration_seconds_bucket{connection_type="messaging",le="%s"}'
    assert values[bucket % "0.025"] == 1
    assert values[bucket % "0.5"] == 2
    assert values[bucket % "30.0"] == 2
    assert values[bucket % "+Inf"] == 3
    messaging_buckets = [n for n in values if n.startswith(bucket.split(",le=")[0])]
    assert len(messaging_buckets) == len(CALL_BUCKETS) + 1
    duration_sum = values['coordinator_call_duration_seconds_sum{connection_type="messaging"}']
    assert duration_sum == pytest.approx(31.32)
    assert values['coordinator_admission_to_dispatch_seconds_bucket{le="0.005"}'] == 2
    assert values["coordinator_admission_to_dispatch_seconds_count"] == 2


def test_no_series_carries_a_workflow_run_or_principal_label() -> None:
    metrics = DispatchMetrics()
    metrics.record_call("scheduling", "refused", 0.1)
    labels = set(re.findall(r'[{,]([a-z_]+)="', metrics.render()))
    calls = {"connection_type", "result", "le"}
    # The process series (component, python_info's versions, the gc generation) and
    # coordinator_build_info{version,python}.
    process = {"component", "generation", "implementation", "major", "minor", "patchlevel"}
    assert labels == calls | process | {"version", "python"}
