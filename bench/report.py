"""The bench's arithmetic and its printed report: percentiles, the medians of repeated
phases, the goals of issue 11 with their verdicts, and the text ``make bench`` prints.

Everything here is a pure function of numbers or of the results document that
:mod:`bench.run` writes to ``results.json``, so the unit tests can feed it figures of
their own (``tests/unit/test_bench_report.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STEPS_PER_RUN = 4

# The goals of issue 11, judged on this machine.
GOAL_RUNS_PER_SECOND = 150.0
FLOOR_RUNS_PER_SECOND = 100.0  # below it the issue is not resolved
GOAL_RATIO = 0.50
GOAL_P50_MS = 10.0
GOAL_P99_MS = 30.0
GOAL_TX_PER_TRANSITION = 3.0
GOAL_RSS_MIB = 150.0
GOAL_SCALE_RSS_GROWTH_MIB = 10.0
# A claim may touch twice the buffers it touched before the waiting runs, plus this many:
# a tiny claim gains an index level or a visibility-map page without the cost growing.
SCALE_BUFFER_SLACK = 10

# What the report shows of the server's settings (SHOW), in this order.
POSTGRES_SETTINGS = (
    "server_version",
    "ssl",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "shared_buffers",
    "max_connections",
    "wal_level",
)

LABEL = 52
VALUE = 17
TARGET = 20
RULE = LABEL + VALUE + TARGET + 6


# ------------------------------------------------------------------------------ arithmetic


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered`` by nearest rank: the smallest value with at
    least ``q`` of the values at or below it (``q`` in (0, 1])."""
    if not ordered:
        return float("nan")
    # ceil(q * n) counted from 1; the epsilon keeps 0.07 * 100 = 7.000000000000001 at 7.
    rank = math.ceil(q * len(ordered) - 1e-9)
    return ordered[max(0, min(len(ordered) - 1, rank - 1))]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max / mean of ``values`` (nearest rank), in the values' unit."""
    if not values:
        nan = float("nan")
        return {"p50": nan, "p90": nan, "p99": nan, "max": nan, "mean": nan}
    ordered = sorted(values)
    return {
        "p50": nearest_rank(ordered, 0.50),
        "p90": nearest_rank(ordered, 0.90),
        "p99": nearest_rank(ordered, 0.99),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


def median(values: Sequence[float]) -> float:
    """The median of the repeats' figures (the mean of the middle two for an even count)."""
    if not values:
        return float("nan")
    return float(statistics.median(values))


def transactions_per_transition(throughput: Mapping[str, Any]) -> float:
    """Database transactions committed per step transition in one throughput phase."""
    return float(throughput["commits_per_run"]) / STEPS_PER_RUN


def cpu_ms_per_run(repeat: Mapping[str, Any]) -> dict[str, float]:
    """CPU milliseconds per run of each process group in one throughput phase."""
    runs = max(1, int(repeat["throughput"]["runs"]))
    return {
        name: seconds * 1000 / runs
        for name, seconds in repeat["cpu_seconds_during_throughput"].items()
        if name != "wall"
    }


def medians(repeats: Sequence[Mapping[str, Any]], raw_per_second: float) -> dict[str, Any]:
    """The median of every figure the repeats measured, with the ratio to the raw rate.

    Memory is the exception: RSS right after each throughput phase is a median, but the
    peak is the largest any repeat reached (VmHWM only grows, so it is the last one's)."""
    if not repeats:
        raise ValueError("no repeats to take the median of")

    def of(pick: Any) -> float:
        return median([float(pick(r)) for r in repeats])

    steps = of(lambda r: r["throughput"]["steps_per_second"])
    latency: dict[str, dict[str, float]] = {}
    for key in ("send_to_accepted_ms", "created_to_prepared_ms", "start_answer_ms"):
        latency[key] = {
            q: of(lambda r, key=key, q=q: r["latency"][key][q]) for q in ("p50", "p90", "p99")
        }
    cpu_runs = [cpu_ms_per_run(r) for r in repeats]
    memory = []
    for entry in repeats[0]["memory"]:
        name = entry["component"]
        readings = [m for r in repeats for m in r["memory"] if m["component"] == name]
        memory.append(
            {
                "component": name,
                "rss_mib": median([m["rss_mib"] for m in readings]),
                "peak_mib": max(m["peak_mib"] for m in readings),
            }
        )
    return {
        "repeats": len(repeats),
        "runs_per_second": of(lambda r: r["throughput"]["runs_per_second"]),
        "steps_per_second": steps,
        "starts_seconds": of(lambda r: r["throughput"]["starts_seconds"]),
        "db_span_seconds": of(lambda r: r["throughput"]["db_span_seconds"]),
        "transactions_per_transition": of(lambda r: transactions_per_transition(r["throughput"])),
        "ratio": steps / raw_per_second if raw_per_second else 0.0,
        "achieved_rate": of(lambda r: r["latency"]["achieved_rate"]),
        "offered_rate": float(repeats[0]["latency"]["offered_rate"]),
        **latency,
        "cpu_ms_per_run": {name: median([c[name] for c in cpu_runs]) for name in cpu_runs[0]},
        "throughput_wall_seconds": of(lambda r: r["cpu_seconds_during_throughput"]["wall"]),
        "memory": memory,
    }


# ------------------------------------------------------------------------------ goals


@dataclass(frozen=True)
class Goal:
    """One goal of issue 11 beside the figure achieved; ``ok`` is None when not measured."""

    key: str
    label: str
    achieved: str
    target: str
    ok: bool | None


def verdict(ok: bool | None) -> str:
    if ok is None:
        return "SKIP"
    return "PASS" if ok else "MISS"


def scale_ok(scale: Mapping[str, Any]) -> bool:
    """Flat memory and constant claim cost: the dispatcher kept working among the waiting
    runs, grew by less than 10 MiB, and one claim touches at most twice the shared buffers
    it touched before (plus a little)."""
    return burst_ok(scale) and rss_growth_ok(scale) and claim_cost_ok(scale)


def burst_ok(scale: Mapping[str, Any]) -> bool:
    return scale["burst_after_rps"] is not None


def rss_growth_ok(scale: Mapping[str, Any]) -> bool:
    growth = float(scale["rss_after_mib"]) - float(scale["rss_before_mib"])
    return growth < GOAL_SCALE_RSS_GROWTH_MIB


def claim_cost_ok(scale: Mapping[str, Any]) -> bool:
    before = int(scale["claim_before"]["buffers"])
    after = int(scale["claim_after"]["buffers"])
    return after <= 2 * before + SCALE_BUFFER_SLACK


def goals(results: Mapping[str, Any]) -> list[Goal]:
    """Every goal of issue 11, judged on the medians (and the scale phase when it ran)."""
    m = results["median"]
    rps = float(m["runs_per_second"])
    lat = m["send_to_accepted_ms"]
    components = [x for x in m["memory"] if x["component"] != "launcher"]
    largest = max(components, key=lambda x: x["peak_mib"]) if components else None
    found = [
        Goal(
            "throughput",
            "throughput, runs/s",
            f"{rps:.1f}",
            f">= {GOAL_RUNS_PER_SECOND:.0f}",
            rps >= GOAL_RUNS_PER_SECOND,
        ),
        Goal(
            "throughput_floor",
            "  resolved floor, runs/s",
            f"{rps:.1f}",
            f">= {FLOOR_RUNS_PER_SECOND:.0f}",
            rps >= FLOOR_RUNS_PER_SECOND,
        ),
        Goal(
            "ratio",
            "step transitions / raw rate",
            f"{float(m['ratio']) * 100:.1f} %",
            f">= {GOAL_RATIO * 100:.0f} %",
            float(m["ratio"]) >= GOAL_RATIO,
        ),
        Goal(
            "latency",
            f"start -> stand-in accepted at {m['offered_rate']:.0f} runs/s, ms p50/p99",
            f"{lat['p50']:.1f} / {lat['p99']:.1f}",
            f"<= {GOAL_P50_MS:.0f} / {GOAL_P99_MS:.0f}",
            lat["p50"] <= GOAL_P50_MS and lat["p99"] <= GOAL_P99_MS,
        ),
        Goal(
            "transactions",
            "DB transactions per step transition",
            f"{float(m['transactions_per_transition']):.1f}",
            f"<= {GOAL_TX_PER_TRANSITION:.0f}",
            float(m["transactions_per_transition"]) <= GOAL_TX_PER_TRANSITION,
        ),
        Goal(
            "rss",
            f"peak RSS, largest component ({largest['component'] if largest else '-'}), MiB",
            f"{largest['peak_mib']:.1f}" if largest else "-",
            f"<= {GOAL_RSS_MIB:.0f} each",
            all(x["peak_mib"] <= GOAL_RSS_MIB for x in components) if components else None,
        ),
    ]
    scale = results.get("scale")
    waiting = f"{int(scale['waiting_runs']):,} waiting runs" if scale else "scale (not run)"
    found += [
        Goal(
            "scale_burst",
            f"{waiting}: burst of runs ends, runs/s",
            (
                (
                    "stalled"
                    if scale["burst_after_rps"] is None
                    else f"{scale['burst_after_rps']:.1f}"
                )
                if scale
                else "not run"
            ),
            "ends in time",
            burst_ok(scale) if scale else None,
        ),
        Goal(
            "scale_rss",
            f"{waiting}: dispatcher RSS growth, MiB",
            f"{scale['rss_after_mib'] - scale['rss_before_mib']:+.1f}" if scale else "not run",
            f"< {GOAL_SCALE_RSS_GROWTH_MIB:.0f}",
            rss_growth_ok(scale) if scale else None,
        ),
        Goal(
            "scale_claim",
            f"{waiting}: claim buffers before/after",
            (
                f"{scale['claim_before']['buffers']} / {scale['claim_after']['buffers']}"
                if scale
                else "not run"
            ),
            f"<= 2x before + {SCALE_BUFFER_SLACK}",
            claim_cost_ok(scale) if scale else None,
        ),
    ]
    return found


def goal_verdicts(results: Mapping[str, Any]) -> dict[str, bool | None]:
    """``results.json``'s ``goals``: each goal's key and verdict, plus ``scale`` for both
    scale figures together."""
    verdicts = {g.key: g.ok for g in goals(results)}
    scale = results.get("scale")
    verdicts["scale"] = scale_ok(scale) if scale else None
    return verdicts


# ------------------------------------------------------------------------------ report


def _row(label: str, value: str, target: str = "", mark: str = "") -> str:
    return f"{label:<{LABEL}}{value:>{VALUE}}  {target:<{TARGET}}{mark:>4}".rstrip()


def settings_block(settings: Mapping[str, str]) -> list[str]:
    """The server's settings as two compact lines."""
    pairs = [f"{name} {settings.get(name, '?')}" for name in POSTGRES_SETTINGS]
    return [
        "PostgreSQL settings: " + ", ".join(pairs[:5]),
        "                     " + ", ".join(pairs[5:]),
    ]


def repeat_line(index: int, repeat: Mapping[str, Any]) -> str:
    """One short line per repeat, so the spread behind a median shows."""
    t = repeat["throughput"]
    lat = repeat["latency"]["send_to_accepted_ms"]
    return (
        f"  repeat {index}: {t['runs_per_second']:.1f} runs/s, "
        f"{transactions_per_transition(t):.1f} tx/transition, "
        f"start->accepted p50/p99 {lat['p50']:.1f} / {lat['p99']:.1f} ms"
    )


def _header(results: Mapping[str, Any]) -> list[str]:
    machine = results["machine"]
    durable = bool(results["settings"]["durable"])
    mode = (
        "durable=True (fsync, synchronous_commit, full_page_writes on)"
        if durable
        else "durable=False (fsync, synchronous_commit, full_page_writes off)"
    )
    return [
        "",
        f"bench-notice on {machine['cpus']} CPUs, {results['median']['repeats']} repeat(s) "
        f"(load before {machine['load_before']}, after {machine['load_after']}; "
        "shared with other work)",
        f"PostgreSQL with TLS, {mode}",
        *settings_block(results["postgres"]),
    ]


def _goal_table(results: Mapping[str, Any]) -> list[str]:
    lines = ["", _row("goal (issue 11)", "achieved", "goal", ""), "-" * RULE]
    lines += [_row(g.label, g.achieved, g.target, verdict(g.ok)) for g in goals(results)]
    return lines


def _figures(results: Mapping[str, Any]) -> list[str]:
    m = results["median"]
    raw = results["raw"]
    halves = results["raw_halves_per_second"]
    runs = sum(int(r["throughput"]["runs"]) for r in results["repeats"])
    succeeded = sum(int(r["throughput"]["succeeded"]) for r in results["repeats"])
    lines = [
        "",
        f"repeats (throughput {results['settings']['runs']} runs; "
        f"latency at {m['offered_rate']:.0f} runs/s):",
        *(repeat_line(i + 1, r) for i, r in enumerate(results["repeats"])),
        "",
        _row(f"measurement (median of {m['repeats']})", "value"),
        "-" * RULE,
        _row("runs started / succeeded (all repeats)", f"{runs} / {succeeded}"),
        _row("throughput, runs/s (to completion)", f"{m['runs_per_second']:.1f}"),
        _row("  all starts answered in, s", f"{m['starts_seconds']:.2f}"),
        _row("  first created -> last ended (DB clock), s", f"{m['db_span_seconds']:.2f}"),
        _row(f"step transitions/s ({STEPS_PER_RUN} per run)", f"{m['steps_per_second']:.1f}"),
        _row("  DB transactions per step transition", f"{m['transactions_per_transition']:.1f}"),
        _row(
            f"raw claim+update+insert tx/s ({raw['connections']} conns)",
            f"{raw['per_second']:.1f}",
        ),
        _row("  raw rate, each half (before / after), tx/s", f"{halves[0]:.0f} / {halves[-1]:.0f}"),
        _row("step transitions / raw rate", f"{m['ratio'] * 100:.1f} %"),
        "",
        _row("latency at, runs/s (offered / achieved)", f"{m['offered_rate']:.0f} / "
             f"{m['achieved_rate']:.1f}"),
    ]  # fmt: skip
    for label, key in (
        ("start -> stand-in accepted (client clock)", "send_to_accepted_ms"),
        ("run created -> first prepared (DB clock)", "created_to_prepared_ms"),
        ("start request answered (client)", "start_answer_ms"),
    ):
        p = m[key]
        lines.append(_row(label + ", ms p50/p99", f"{p['p50']:.1f} / {p['p99']:.1f}"))
    lines.append("")
    for x in m["memory"]:
        lines.append(
            _row(f"RSS {x['component']}, MiB (median now / peak)",
                 f"{x['rss_mib']:.1f} / {x['peak_mib']:.1f}")
        )  # fmt: skip
    return lines


def _cpu(results: Mapping[str, Any]) -> list[str]:
    m = results["median"]
    cpu = m["cpu_ms_per_run"]
    wall = float(m["throughput_wall_seconds"])
    cpus = int(results["machine"]["cpus"] or 1)
    lines = [
        "",
        f"CPU per run during the throughput phase (median; {wall:.1f} s wall, {cpus} cores = "
        f"{cpus * wall:.1f} CPU-s available):",
    ]
    lines += [_row(f"  {name}, ms per run", f"{value:.1f}") for name, value in cpu.items()]
    rc = results["raw"]["cpu_seconds"]
    tx = max(1, int(results["raw"]["transactions"]))
    stack = sum(v for k, v in cpu.items() if not k.startswith(("postgres", "bench", "machine",
                                                               "other")))  # fmt: skip
    lines += [
        "",
        f"CPU per transition: raw rate {rc['postgres (all backends)'] * 1e3 / tx:.2f} ms "
        f"PostgreSQL + {rc['bench client'] * 1e3 / tx:.2f} ms client; coordinator "
        f"{cpu.get('postgres (all backends)', 0.0) / STEPS_PER_RUN:.2f} ms PostgreSQL + "
        f"{stack / STEPS_PER_RUN:.2f} ms its processes and stand-in",
    ]
    return lines


def _scale(results: Mapping[str, Any]) -> list[str]:
    scale = results.get("scale")
    if not scale:
        return ["", "scale phase: not run (--waiting-runs 0)"]
    before, after = scale["claim_before"], scale["claim_after"]
    return [
        "",
        f"scale: {int(scale['waiting_runs']):,} waiting runs seeded in "
        f"{scale['seed_seconds']:.1f} s ({scale['shape']})",
        _row("  dispatcher RSS before / after, MiB",
             f"{scale['rss_before_mib']:.1f} / {scale['rss_after_mib']:.1f}"),
        _row(f"  burst of {scale['burst_runs']} runs before / after, runs/s",
             f"{scale['burst_before_rps']:.1f} / " + (
                 "stalled" if scale["burst_after_rps"] is None
                 else f"{scale['burst_after_rps']:.1f}")),
        _row("  one claim, shared buffers hit+read before",
             f"{before['shared_hit']}+{before['shared_read']}"),
        _row("  one claim, shared buffers hit+read after",
             f"{after['shared_hit']}+{after['shared_read']}"),
        _row("  one claim, execution ms before / after",
             f"{before['execution_ms']:.3f} / {after['execution_ms']:.3f}"),
        _row("  one claim, rows claimed before / after (rolled back)",
             f"{before['rows']} / {after['rows']}"),
        f"  claim plan after: {after['plan']}",
    ]  # fmt: skip


def report(results: Mapping[str, Any]) -> str:
    """The printed report: header and server settings, the goals with PASS/MISS, each
    repeat's line, the medians, CPU per run, the scale phase."""
    lines = [
        *_header(results),
        *_goal_table(results),
        *_figures(results),
        *_cpu(results),
        *_scale(results),
        "-" * RULE,
        f"stand-in: {results['commands']['processed']} commands, "
        f"{results['commands']['twice']} processed twice",
        f"raw rate: {results['raw']['note']}",
    ]
    return "\n".join(lines)
