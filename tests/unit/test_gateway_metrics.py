"""The metrics listener, readiness summary and exposition merging (CONTRACT §8.2, §13)."""

from __future__ import annotations

import re

from gateway.app import create_metrics_app
from gateway.backend import ComponentHealth
from gateway.health import summarize
from gateway.metrics import HttpMetrics, merge, readiness_text
from tests.helpers.gateway_kit import (
    RUN_A,
    FakeBackend,
    bearer,
    client_for,
    context,
    healthy,
    main_client,
    mint,
    primed,
)

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def samples(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        found[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return found


def family_declarations(text: str) -> list[str]:
    return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]


async def test_metrics_listener_serves_gateway_and_component_series() -> None:
    backend = FakeBackend()
    backend.metric_texts = (
        "# HELP coordinator_dispatch_jobs Due work.\n# TYPE coordinator_dispatch_jobs gauge\n"
        "coordinator_dispatch_jobs 0\n",
        # A component's own copy of a gateway family is dropped, not duplicated.
        "# TYPE coordinator_audit_ready gauge\ncoordinator_audit_ready 0\n"
        '# TYPE coordinator_runs gauge\ncoordinator_runs{state="held"} 3\n',
    )
    ctx = await primed(context(backend))
    async with main_client(ctx) as api:
        await api.get(f"/v1/runs/{RUN_A}", headers=bearer(mint()))
    async with client_for(create_metrics_app(ctx)) as scrape:
        response = await scrape.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = samples(response.text)
    assert values['coordinator_http_requests_total{route="/v1/runs/{runId}",status="200"}'] == 1
    assert values["coordinator_audit_ready"] == 1
    assert values["coordinator_store_available"] == 1
    assert values["coordinator_dispatch_jobs"] == 0
    assert values['coordinator_runs{state="held"}'] == 3
    assert RUN_A not in response.text
    declared = family_declarations(response.text)
    assert len(declared) == len(set(declared))


async def test_metrics_listener_serves_nothing_else() -> None:
    ctx = await primed(context())
    async with client_for(create_metrics_app(ctx)) as scrape:
        ready = await scrape.get("/ready")
        runs = await scrape.get(f"/v1/runs/{RUN_A}", headers=bearer(mint()))
        post = await scrape.post("/metrics")
    assert ready.status_code == 404 and ready.json()["code"] == "not-found"
    assert runs.status_code == 404
    assert post.status_code == 405 and post.json()["code"] == "method-not-allowed"


async def test_readiness_gauges_are_present_when_everything_is_down() -> None:
    backend = FakeBackend()
    backend.health = tuple(
        ComponentHealth(name, False, False, False, (f"{name}-unavailable",))
        for name in ("recovery", "auditd")
    )
    ctx = context(backend)  # the verifier has no keys yet
    async with client_for(create_metrics_app(ctx)) as scrape:
        text = (await scrape.get("/metrics")).text
    values = samples(text)
    assert values["coordinator_audit_ready"] == 0
    assert values["coordinator_store_available"] == 0
    assert values["coordinator_token_verifier_ready"] == 0
    assert values['coordinator_component_up{component="recovery"}'] == 0
    assert "coordinator_http_requests_total" in family_declarations(text)


def test_summary_of_healthy_components_is_ready() -> None:
    readiness = summarize(healthy(), verifier_ready=True)
    assert readiness.ready and readiness.reasons == ()
    assert readiness.store_available and readiness.audit_ready


def test_summary_reasons() -> None:
    healths = (
        ComponentHealth("admission", True, False, True, ()),
        ComponentHealth("auditd", True, True, True, ("audit-unavailable",)),
    )
    readiness = summarize(healths, verifier_ready=True)
    assert not readiness.ready
    assert readiness.reasons == ("audit-unavailable", "store-unavailable")
    assert not readiness.audit_ready and not readiness.store_available


def test_summary_without_auditd_is_not_audit_ready() -> None:
    readiness = summarize((ComponentHealth("recovery", True, True, True, ()),), True)
    assert readiness.reasons == ("audit-unavailable",)


def test_counter_labels_are_escaped_and_counted() -> None:
    metrics = HttpMetrics()
    metrics.observe("/b", 200)
    metrics.observe('/a"\\', 404)
    metrics.observe("/b", 200)
    # The gateway's registry also holds its process series and build info.
    counted = "coordinator_http_requests_total{"
    lines = [line for line in metrics.render().splitlines() if line.startswith(counted)]
    assert sorted(lines) == [
        'coordinator_http_requests_total{route="/a\\"\\\\",status="404"} 1.0',
        'coordinator_http_requests_total{route="/b",status="200"} 2.0',
    ]
    assert (metrics.count("/b", 200), metrics.count("/b", 404)) == (2, 0)


def test_merge_keeps_the_first_family_and_histogram_samples_together() -> None:
    first = (
        '# TYPE x_seconds histogram\nx_seconds_bucket{le="1"} 1\nx_seconds_bucket{le="+Inf"} 1\n'
        "x_seconds_sum 0.5\nx_seconds_count 1\n"
    )
    second = (
        '# HELP x_seconds dup\n# TYPE x_seconds histogram\nx_seconds_bucket{le="1"} 9\n'
        "x_seconds_count 9\n# TYPE y gauge\ny 2\n# EOF\n"
    )
    merged = merge([first, second])
    assert family_declarations(merged) == ["x_seconds", "y"]
    assert samples(merged) == {
        'x_seconds_bucket{le="1"}': 1,
        'x_seconds_bucket{le="+Inf"}': 1,
        "x_seconds_sum": 0.5,
        "x_seconds_count": 1,
        "y": 2,
    }


def test_readiness_text_lists_each_component() -> None:
    readiness = summarize(
        (
            ComponentHealth("recovery", True, True, True, ()),
            ComponentHealth("auditd", False, False, False, ()),
        ),
        verifier_ready=True,
    )
    values = samples(readiness_text(readiness))
    assert values['coordinator_component_up{component="recovery"}'] == 1
    assert values['coordinator_component_up{component="auditd"}'] == 0
