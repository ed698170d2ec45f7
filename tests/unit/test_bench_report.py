"""The bench's arithmetic and report (bench/report.py): nearest-rank percentiles, medians of
repeats, the verdict of each goal of issue 11 at its edges, and the printed text."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.report import (
    POSTGRES_SETTINGS,
    goal_verdicts,
    goals,
    median,
    medians,
    nearest_rank,
    percentiles,
    report,
    verdict,
)
from bench.scale import claim_cost_of

RAW_PER_SECOND = 1000.0
COMPONENTS = ("gateway", "admission", "dispatcher", "recovery", "auditd")


def repeat(
    rps: float = 160.0,
    tx: float = 2.5,
    p50: float = 8.0,
    p99: float = 25.0,
    rss: float = 60.0,
    peak: float = 70.0,
) -> dict[str, Any]:
    """One repeat's figures as bench.run records them (500 runs)."""
    runs = 500
    memory = [{"component": "launcher", "pid": 1, "rss_mib": 40.0, "peak_mib": 400.0}]
    memory += [
        {"component": name, "pid": i + 2, "rss_mib": rss, "peak_mib": peak}
        for i, name in enumerate(COMPONENTS)
    ]
    latency = {"p50": p50, "p90": (p50 + p99) / 2, "p99": p99, "max": p99, "mean": p50}
    return {
        "throughput": {
            "runs": runs,
            "seconds": runs / rps,
            "starts_seconds": 1.0,
            "db_span_seconds": 1.0,
            "succeeded": runs,
            "start_errors": 0,
            "commits_per_run": tx * 4,
            "runs_per_second": rps,
            "steps_per_second": rps * 4,
        },
        "latency": {
            "runs": 100,
            "offered_rate": 50.0,
            "achieved_rate": 49.9,
            "pacing_lag_p99_ms": 1.0,
            "start_answer_ms": dict(latency),
            "send_to_accepted_ms": dict(latency),
            "created_to_prepared_ms": dict(latency),
            "start_errors": 0,
        },
        "memory": memory,
        "cpu_seconds_during_throughput": {
            "dispatcher": 2.0,
            "postgres (all backends)": 3.0,
            "bench client": 1.0,
            "machine (all processes)": 7.0,
            "other work on the machine": 0.5,
            "wall": runs / rps,
        },
    }


def scale(
    rss_before: float = 80.0,
    rss_after: float = 81.0,
    before: int = 12,
    after: int = 14,
    burst_after: float | None = 150.0,
) -> dict[str, Any]:
    def claim(buffers: int) -> dict[str, Any]:
        return {
            "shared_hit": buffers,
            "shared_read": 0,
            "execution_ms": 0.1,
            "rows": 0,
            "plan": "step: Index Scan step_due (0 rows)",
            "buffers": buffers,
        }

    return {
        "waiting_runs": 100_000,
        "seed_seconds": 3.0,
        "burst_runs": 100,
        "burst_before_rps": 150.0,
        "burst_after_rps": burst_after,
        "rss_before_mib": rss_before,
        "rss_after_mib": rss_after,
        "claim_before": claim(before),
        "claim_after": claim(after),
        "shape": "waiting runs",
    }


def results(
    repeats: list[dict[str, Any]] | None = None,
    scaled: dict[str, Any] | None = None,
    durable: bool = False,
    raw_per_second: float = RAW_PER_SECOND,
) -> dict[str, Any]:
    """A whole results document, as bench.run.main assembles it."""
    done = repeats or [repeat()]
    found: dict[str, Any] = {
        "postgres": {name: f"value-of-{name}" for name in POSTGRES_SETTINGS},
        "repeats": done,
        "commands": {"processed": 1000, "twice": 0},
        "scale": scaled,
        "raw": {
            "transactions": 10_000,
            "seconds": 10.0,
            "connections": 8,
            "empty_claims": 0,
            "per_second": raw_per_second,
            "cpu_seconds": {"postgres (all backends)": 5.0, "bench client": 3.0},
            "note": "scratch table",
        },
        "raw_halves_per_second": [990.0, 1010.0],
        "settings": {"runs": 500, "durable": durable},
        "machine": {"cpus": 2, "load_before": [0.1], "load_after": [0.2]},
    }
    found["median"] = medians(done, raw_per_second)
    return found


def verdicts_of(found: dict[str, Any]) -> dict[str, bool | None]:
    return {g.key: g.ok for g in goals(found)}


# ------------------------------------------------------------------------------ arithmetic


def test_nearest_rank_takes_the_smallest_value_covering_the_quantile() -> None:
    ten = [float(v) for v in range(1, 11)]
    assert nearest_rank(ten, 0.50) == 5.0
    assert nearest_rank(ten, 0.90) == 9.0
    assert nearest_rank(ten, 0.99) == 10.0
    hundred = [float(v) for v in range(1, 101)]
    assert nearest_rank(hundred, 0.50) == 50.0
    assert nearest_rank(hundred, 0.99) == 99.0
    # 0.07 * 100 is 7.000000000000001 in floating point; the rank is still 7.
    assert nearest_rank(hundred, 0.07) == 7.0
    assert nearest_rank([4.0], 0.99) == 4.0


def test_percentiles_sort_their_input_and_are_nan_when_empty() -> None:
    found = percentiles([9.0, 1.0, 5.0, 3.0, 7.0])
    assert found == {"p50": 5.0, "p90": 9.0, "p99": 9.0, "max": 9.0, "mean": 5.0}
    assert all(math.isnan(v) for v in percentiles([]).values())


def test_median_of_odd_and_even_counts() -> None:
    assert median([30.0, 10.0, 20.0]) == 20.0
    assert median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert math.isnan(median([]))


def test_medians_take_the_middle_repeat_of_each_figure_separately() -> None:
    repeats = [
        repeat(rps=100.0, tx=4.0, p50=12.0, p99=20.0, rss=50.0, peak=60.0),
        repeat(rps=140.0, tx=2.0, p50=9.0, p99=40.0, rss=70.0, peak=90.0),
        repeat(rps=120.0, tx=3.0, p50=15.0, p99=30.0, rss=60.0, peak=80.0),
    ]
    m = medians(repeats, RAW_PER_SECOND)
    assert m["repeats"] == 3
    assert m["runs_per_second"] == 120.0
    assert m["steps_per_second"] == 480.0
    assert m["transactions_per_transition"] == 3.0
    assert m["ratio"] == pytest.approx(0.48)
    # Each quantile is its own median: p50 from one repeat, p99 from another.
    assert m["send_to_accepted_ms"]["p50"] == 12.0
    assert m["send_to_accepted_ms"]["p99"] == 30.0
    dispatcher = next(x for x in m["memory"] if x["component"] == "dispatcher")
    assert dispatcher["rss_mib"] == 60.0
    assert dispatcher["peak_mib"] == 90.0  # a peak is the largest, not the median
    assert m["cpu_ms_per_run"]["dispatcher"] == pytest.approx(4.0)


def test_medians_refuse_no_repeats() -> None:
    with pytest.raises(ValueError):
        medians([], RAW_PER_SECOND)


def test_claim_cost_reads_the_execution_buffers_of_the_top_node() -> None:
    explained = {
        "Plan": {
            "Node Type": "Sort",
            "Actual Rows": 0,
            "Shared Hit Blocks": 7,
            "Shared Read Blocks": 2,
            "Plans": [
                {"Node Type": "Index Scan", "Relation Name": "step", "Index Name": "step_due",
                 "Actual Rows": 0},
            ],
        },
        "Planning": {"Shared Hit Blocks": 300},
        "Execution Time": 0.25,
    }  # fmt: skip
    cost = claim_cost_of(explained)
    assert (cost.shared_hit, cost.shared_read, cost.buffers) == (7, 2, 9)
    assert cost.execution_ms == 0.25
    assert cost.plan == "step: Index Scan step_due (0 rows)"


# ------------------------------------------------------------------------------ verdicts


def test_every_goal_passes_on_figures_that_meet_them_exactly() -> None:
    found = results(
        [repeat(rps=150.0, tx=3.0, p50=10.0, p99=30.0, peak=150.0)],
        scaled=scale(rss_before=80.0, rss_after=89.9, before=12, after=34),
        raw_per_second=1200.0,
    )
    assert verdicts_of(found) == {
        "throughput": True,
        "throughput_floor": True,
        "ratio": True,
        "latency": True,
        "transactions": True,
        "rss": True,
        "scale_burst": True,
        "scale_rss": True,
        "scale_claim": True,
    }
    assert goal_verdicts(found)["scale"] is True


@pytest.mark.parametrize(
    ("figures", "missed"),
    [
        ({"rps": 149.9}, {"throughput", "ratio"}),
        ({"rps": 99.9}, {"throughput", "throughput_floor", "ratio"}),
        ({"p50": 10.1}, {"latency"}),
        ({"p99": 30.1}, {"latency"}),
        ({"tx": 3.1}, {"transactions"}),
        ({"peak": 150.1}, {"rss"}),
    ],
)
def test_each_goal_misses_just_past_its_edge(figures: dict[str, float], missed: set[str]) -> None:
    base = {"rps": 150.0, "tx": 3.0, "p50": 10.0, "p99": 30.0, "peak": 150.0}
    found = results([repeat(**{**base, **figures})], scaled=scale(), raw_per_second=1200.0)
    assert {key for key, ok in verdicts_of(found).items() if ok is False} == missed


def test_ratio_misses_below_half_the_raw_rate() -> None:
    # 150 runs/s is 600 transitions/s: half of 1200 passes, half of 1201 does not.
    assert verdicts_of(results([repeat(rps=150.0)], raw_per_second=1200.0))["ratio"] is True
    assert verdicts_of(results([repeat(rps=150.0)], raw_per_second=1201.0))["ratio"] is False


def test_the_launcher_is_not_judged_against_the_memory_goal() -> None:
    one = repeat(peak=100.0)
    one["memory"][0]["peak_mib"] = 900.0
    assert one["memory"][0]["component"] == "launcher"
    assert verdicts_of(results([one]))["rss"] is True


def test_scale_verdicts_at_their_edges() -> None:
    def scale_verdicts(**figures: Any) -> tuple[bool | None, ...]:
        found = results(scaled=scale(**figures))
        v = goal_verdicts(found)
        return v["scale_burst"], v["scale_rss"], v["scale_claim"], v["scale"]

    assert scale_verdicts(rss_before=80.0, rss_after=89.9) == (True, True, True, True)
    assert scale_verdicts(rss_before=80.0, rss_after=90.0) == (True, False, True, False)
    assert scale_verdicts(before=12, after=34) == (True, True, True, True)
    assert scale_verdicts(before=12, after=35) == (True, True, False, False)
    # A dispatcher that stopped among the waiting runs misses, whatever else it measured.
    assert scale_verdicts(burst_after=None) == (False, True, True, False)


def test_a_skipped_scale_phase_is_neither_pass_nor_miss() -> None:
    v = goal_verdicts(results(scaled=None))
    assert (v["scale_burst"], v["scale_rss"], v["scale_claim"], v["scale"]) == (None,) * 4
    assert verdict(None) == "SKIP"
    assert (verdict(True), verdict(False)) == ("PASS", "MISS")


# ------------------------------------------------------------------------------ report text


def goal_line(text: str, label: str) -> str:
    """The one line of the goal table (lines ending in a verdict) that starts with ``label``."""
    marks = ("PASS", "MISS", "SKIP")
    lines = [x for x in text.splitlines() if x.startswith(label) and x.endswith(marks)]
    assert len(lines) == 1, (label, lines)
    return lines[0]


def test_the_report_prints_every_goal_with_its_figure_and_verdict() -> None:
    found = results(
        [repeat(rps=37.3, tx=11.8, p50=329.0, p99=620.0, peak=88.0)],
        scaled=scale(rss_before=80.0, rss_after=81.5, before=12, after=14),
    )
    text = report(found)
    expected = {
        "throughput, runs/s": ("37.3", ">= 150", "MISS"),
        "  resolved floor, runs/s": ("37.3", ">= 100", "MISS"),
        "step transitions / raw rate": ("14.9 %", ">= 50 %", "MISS"),
        "start -> stand-in accepted at 50 runs/s, ms p50/p99": (
            "329.0 / 620.0",
            "<= 10 / 30",
            "MISS",
        ),
        "DB transactions per step transition": ("11.8", "<= 3", "MISS"),
        "peak RSS, largest component": ("88.0", "<= 150 each", "PASS"),
        "100,000 waiting runs: burst of runs ends, runs/s": ("150.0", "ends in time", "PASS"),
        "100,000 waiting runs: dispatcher RSS growth, MiB": ("+1.5", "< 10", "PASS"),
        "100,000 waiting runs: claim buffers before/after": ("12 / 14", "<= 2x before", "PASS"),
    }
    for label, (achieved, target, mark) in expected.items():
        line = goal_line(text, label)
        assert achieved in line and target in line, line
        assert line.endswith(mark), line
    assert len(goals(found)) == len(expected)


def test_the_report_marks_an_unrun_scale_phase_skipped() -> None:
    text = report(results(scaled=None))
    assert goal_line(text, "scale (not run): dispatcher RSS growth").endswith("SKIP")
    assert goal_line(text, "scale (not run): claim buffers").endswith("SKIP")
    assert goal_line(text, "scale (not run): burst of runs ends").endswith("SKIP")
    assert "scale phase: not run" in text


def test_the_report_says_when_the_dispatcher_stalled_among_waiting_runs() -> None:
    text = report(results(scaled=scale(burst_after=None)))
    line = goal_line(text, "100,000 waiting runs: burst of runs ends")
    assert "stalled" in line and line.endswith("MISS")
    assert "150.0 / stalled" in text


def test_the_report_prints_one_line_per_repeat() -> None:
    text = report(results([repeat(rps=101.0), repeat(rps=102.0), repeat(rps=103.0)]))
    lines = [line for line in text.splitlines() if line.startswith("  repeat ")]
    assert [line.split(":")[0].strip() for line in lines] == ["repeat 1", "repeat 2", "repeat 3"]
    assert "102.0 runs/s" in lines[1]
    assert "3 repeat(s)" in text


def test_the_report_says_whether_postgresql_was_durable_and_shows_its_settings() -> None:
    assert "durable=False (fsync, synchronous_commit, full_page_writes off)" in report(results())
    durable = report(results(durable=True))
    assert "durable=True (fsync, synchronous_commit, full_page_writes on)" in durable
    for name in POSTGRES_SETTINGS:
        assert f"{name} value-of-{name}" in durable
