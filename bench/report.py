"""The bench's arithmetic and its printed report: percentiles, the medians of repeated
phases, the goals of issues 11, 24 and 41 with their verdicts, and the text ``make bench``
prints.

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
GOAL_MACHINE_CPU_MS_PER_RUN = 6.0  # issue 43
GOAL_POSTGRES_CPU_MS_PER_TRANSITION = 0.5  # issue 43
GOAL_SCALE_RSS_GROWTH_MIB = 10.0
# A claim may touch twice the buffers it touched before the waiting runs, plus this many:
# a tiny claim gains an index level or a visibility-map page without the cost growing.
SCALE_BUFFER_SLACK = 10
# Issue 24: after this many waiting runs (in the quiet-VACUUM state), a burst keeps this
# share of the burst before seeding, and start -> first command keeps the latency goal.
GOAL_SCALE_WAITING = 1_000_000
GOAL_SCALE_BURST_SHARE = 0.80
# Issue 41 item 1: among 1,000,000 waiting runs and 10,000 held, one page of GET /v1/runs
# answers within this many ms at the API, for every filter (judged on each median).
GOAL_LIST_MS = 50.0

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
    """One goal beside the figure achieved; ``ok`` is None when not measured."""

    key: str
    label: str
    achieved: str
    target: str
    ok: bool | None


def verdict(ok: bool | None) -> str:
    if ok is None:
        return "SKIP"
    return "PASS" if ok else "MISS"


def burst_ok(size: Mapping[str, Any]) -> bool:
    """The burst after seeding ended within its time limit."""
    return size["burst"] is not None


def burst_share(before: Mapping[str, Any], size: Mapping[str, Any]) -> float | None:
    """The burst's runs/s after seeding as a share of the burst's before (None: stalled)."""
    if size["burst"] is None or before["burst"] is None:
        return None
    return float(size["burst"]["runs_per_second"]) / float(before["burst"]["runs_per_second"])


def burst_rate_ok(before: Mapping[str, Any], size: Mapping[str, Any]) -> bool:
    share = burst_share(before, size)
    return share is not None and share >= GOAL_SCALE_BURST_SHARE


def latency_ok(size: Mapping[str, Any]) -> bool:
    """p99 start -> first command of the runs paced after the burst (a stall misses)."""
    paced = size["paced"]
    return paced is not None and float(paced["send_to_accepted_ms"]["p99"]) <= GOAL_P99_MS


def rss_growth_ok(before: Mapping[str, Any], size: Mapping[str, Any]) -> bool:
    growth = float(size["rss_mib"]) - float(before["rss_mib"])
    return growth < GOAL_SCALE_RSS_GROWTH_MIB


def claim_cost_ok(before: Mapping[str, Any], size: Mapping[str, Any]) -> bool:
    return int(size["claim"]["buffers"]) <= 2 * int(before["claim"]["buffers"]) + SCALE_BUFFER_SLACK


def goal_size(scale: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The size issue 24's goals are judged on: the largest of at least
    :data:`GOAL_SCALE_WAITING` waiting runs, or None when no such size ran."""
    if not scale:
        return None
    large = [x for x in scale["sizes"] if int(x["size"]) >= GOAL_SCALE_WAITING]
    return max(large, key=lambda x: int(x["size"])) if large else None


def _ms(p: Mapping[str, Any] | None, key: str) -> str:
    if p is None:
        return "stalled"
    q = p[key]
    return f"{q['p50']:.1f} / {q['p99']:.1f}"


def size_goals(before: Mapping[str, Any], size: Mapping[str, Any], runs: int) -> list[Goal]:
    """The goals of one size of the scale phase, whose bursts were of ``runs`` runs, each
    against the burst before seeding."""
    n = int(size["size"])
    at = f"{n:,} waiting"
    burst = size["burst"]
    share = burst_share(before, size)
    return [
        Goal(
            f"scale_burst_{n}",
            f"{at}: burst of {runs} ends, runs/s",
            "stalled" if burst is None else f"{burst['runs_per_second']:.1f}",
            "ends in time",
            burst_ok(size),
        ),
        Goal(
            f"scale_rate_{n}",
            f"{at}: burst runs/s vs before seeding",
            "stalled" if share is None else f"{share * 100:.1f} %",
            f">= {GOAL_SCALE_BURST_SHARE * 100:.0f} % of {before['burst']['runs_per_second']:.1f}",
            burst_rate_ok(before, size),
        ),
        Goal(
            f"scale_latency_{n}",
            f"{at}: start->first command p50/p99, ms",
            _ms(size["paced"], "send_to_accepted_ms"),
            f"p99 <= {GOAL_P99_MS:.0f}",
            latency_ok(size),
        ),
        Goal(
            f"scale_rss_{n}",
            f"{at}: dispatcher RSS growth, MiB",
            f"{float(size['rss_mib']) - float(before['rss_mib']):+.1f}",
            f"< {GOAL_SCALE_RSS_GROWTH_MIB:.0f}",
            rss_growth_ok(before, size),
        ),
        Goal(
            f"scale_claim_{n}",
            f"{at}: claim buffers before/after",
            f"{before['claim']['buffers']} / {size['claim']['buffers']}",
            f"<= 2x before + {SCALE_BUFFER_SLACK}",
            claim_cost_ok(before, size),
        ),
    ]


def scale_goals(scale: Mapping[str, Any] | None) -> list[Goal]:
    """Each size's goals; issue 24's two goals at 1,000,000 waiting runs show as SKIP when
    no size reached it, and every goal does when the phase did not run."""
    if not scale:
        label = "scale (not run)"
        return [
            Goal("scale_burst", f"{label}: burst of runs ends", "not run", "ends in time", None),
            Goal("scale_rate", f"{label}: burst runs/s vs before seeding", "not run",
                 f">= {GOAL_SCALE_BURST_SHARE * 100:.0f} %", None),
            Goal("scale_latency", f"{label}: start->first command p50/p99, ms", "not run",
                 f"p99 <= {GOAL_P99_MS:.0f}", None),
            Goal("scale_rss", f"{label}: dispatcher RSS growth, MiB", "not run",
                 f"< {GOAL_SCALE_RSS_GROWTH_MIB:.0f}", None),
            Goal("scale_claim", f"{label}: claim buffers before/after", "not run",
                 f"<= 2x before + {SCALE_BUFFER_SLACK}", None),
        ]  # fmt: skip
    runs = int(scale["burst_runs"])
    found = [g for size in scale["sizes"] for g in size_goals(scale["before"], size, runs)]
    if goal_size(scale) is None:
        at = f"{GOAL_SCALE_WAITING:,} waiting"
        found += [
            Goal("scale_rate", f"{at}: burst runs/s vs before seeding", "not run",
                 f">= {GOAL_SCALE_BURST_SHARE * 100:.0f} %", None),
            Goal("scale_latency", f"{at}: start->first command p50/p99, ms", "not run",
                 f"p99 <= {GOAL_P99_MS:.0f}", None),
        ]  # fmt: skip
    return found


def list_entries(listed: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every filter and limit of the run list at scale, over every round."""
    return [entry for found in listed["rounds"] for entry in found["filters"]]


def list_slowest(listed: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The entry with the largest median of the run list at scale (None: none measured)."""
    timed = [entry for entry in list_entries(listed) if entry["ms"] is not None]
    return max(timed, key=lambda entry: float(entry["ms"]["median"])) if timed else None


def list_ok(listed: Mapping[str, Any]) -> bool:
    """Every filter answered right, each page's median within :data:`GOAL_LIST_MS`."""
    entries = list_entries(listed)
    return bool(entries) and all(
        entry["failure"] is None and float(entry["ms"]["median"]) <= GOAL_LIST_MS
        for entry in entries
    )


def list_goals(scale: Mapping[str, Any] | None) -> list[Goal]:
    """The run list's goal (issue 41 item 1), when the bench measured it: every filter at
    every limit, in both rounds, answered right with a median within :data:`GOAL_LIST_MS`.
    The figure shown is the slowest median, or how many answers were wrong."""
    listed = (scale or {}).get("list_at_scale")
    if not listed:
        return []
    failed = sum(1 for entry in list_entries(listed) if entry["failure"] is not None)
    slowest = list_slowest(listed)
    achieved = "-" if slowest is None else f"{float(slowest['ms']['median']):.1f}"
    return [
        Goal(
            "scale_list",
            f"{int(listed['waiting_runs']):,} waiting + {int(listed['held']['runs']):,} held: "
            "list page median, ms",
            f"{failed} wrong" if failed else achieved,
            f"<= {GOAL_LIST_MS:.0f} every filter",
            list_ok(listed),
        )
    ]


def goals(results: Mapping[str, Any]) -> list[Goal]:
    """Every goal of issues 11 and 43, judged on the medians, and the scale phase's (issues
    11 and 24) for each size it seeded."""
    m = results["median"]
    rps = float(m["runs_per_second"])
    lat = m["send_to_accepted_ms"]
    components = [x for x in m["memory"] if x["component"] != "launcher"]
    largest = max(components, key=lambda x: x["peak_mib"]) if components else None
    cpu = m["cpu_ms_per_run"]
    machine = float(cpu["machine (all processes)"])
    postgres = float(cpu["postgres (all backends)"]) / STEPS_PER_RUN
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
        Goal(
            "machine_cpu",
            "machine CPU per run (every process), ms",
            f"{machine:.1f}",
            f"<= {GOAL_MACHINE_CPU_MS_PER_RUN:.0f}",
            machine <= GOAL_MACHINE_CPU_MS_PER_RUN,
        ),
        Goal(
            "postgres_cpu",
            "PostgreSQL CPU per step transition, ms",
            f"{postgres:.2f}",
            f"<= {GOAL_POSTGRES_CPU_MS_PER_TRANSITION}",
            postgres <= GOAL_POSTGRES_CPU_MS_PER_TRANSITION,
        ),
    ]
    return found + scale_goals(results.get("scale")) + list_goals(results.get("scale"))


SCALE_SUMMARY = ("scale_burst", "scale_rss", "scale_claim", "scale", "scale_rate", "scale_latency")


def goal_verdicts(results: Mapping[str, Any]) -> dict[str, bool | None]:
    """``results.json``'s ``goals``: each goal's key and verdict (the scale phase's per
    size, as ``scale_<goal>_<size>``), and the scale phase summed up: ``scale_burst``,
    ``scale_rss`` and ``scale_claim`` over every size, ``scale`` for those three together,
    ``scale_rate`` and ``scale_latency`` (issue 24) at 1,000,000 waiting runs; None when
    not measured."""
    verdicts = {g.key: g.ok for g in goals(results)}
    scale = results.get("scale")
    if not scale:
        return {**verdicts, **dict.fromkeys(SCALE_SUMMARY)}
    before, sizes = scale["before"], scale["sizes"]
    verdicts["scale_burst"] = all(burst_ok(x) for x in sizes)
    verdicts["scale_rss"] = all(rss_growth_ok(before, x) for x in sizes)
    verdicts["scale_claim"] = all(claim_cost_ok(before, x) for x in sizes)
    verdicts["scale"] = (
        verdicts["scale_burst"] and verdicts["scale_rss"] and verdicts["scale_claim"]
    )
    judged = goal_size(scale)
    verdicts["scale_rate"] = None if judged is None else burst_rate_ok(before, judged)
    verdicts["scale_latency"] = None if judged is None else latency_ok(judged)
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
        *products_block(results),
    ]


def products_mode(results: Mapping[str, Any]) -> str:
    """``products-tls`` when the stand-ins served HTTPS under a private root, else
    ``plain``."""
    return "products-tls" if results["settings"].get("products_tls") else "plain"


def products_block(results: Mapping[str, Any]) -> list[str]:
    """The mode the products were reached in, and each connection as the runtime file named
    it (base URL, private root)."""
    if products_mode(results) == "products-tls":
        lines = [
            "products: products-tls (HTTPS; each connection trusts only a private root made "
            "for this run)"
        ]
    else:
        lines = ["products: plain (http:// to loopback)"]
    products = results.get("products") or {}
    for name, connection in products.get("connections", {}).items():
        root = connection.get("trustedRootCertificateRef")
        lines.append(
            f"  connection {name}: {connection['baseUrl']}"
            + (f", trustedRootCertificateRef {root}" if root else "")
        )
    return lines


def served_line(results: Mapping[str, Any]) -> str | None:
    """What the Messaging stand-in counted it served over the whole bench: requests by
    scheme and the connections they came on (with the TLS version of each), or None."""
    served = (results.get("products") or {}).get("messaging")
    if not served:
        return None
    requests = ", ".join(f"{n} {scheme}" for scheme, n in sorted(served["requests"].items()))
    protocols = ", ".join(f"{n} {name}" for name, n in sorted(served["tls_protocols"].items()))
    connections = served["connections"]
    return (
        f"stand-in served: {requests or 'no'} requests on "
        + ("uncounted" if connections is None else str(connections))
        + " connections"
        + (f" (TLS: {protocols})" if protocols else " (no TLS)")
    )


def _goal_table(results: Mapping[str, Any]) -> list[str]:
    lines = ["", _row("goal (issues 11, 24 and 41)", "achieved", "goal", ""), "-" * RULE]
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


SCALE_LABEL = 46
SCALE_CELL = 15


def _scale_row(label: str, cells: Sequence[str]) -> str:
    return (f"{label:<{SCALE_LABEL}}" + "".join(f"{c:>{SCALE_CELL}}" for c in cells)).rstrip()


def _cost(cost: Mapping[str, Any] | None, what: str) -> str:
    if cost is None:
        return "-"
    if what == "buffers":
        return f"{cost['shared_hit']}+{cost['shared_read']}"
    return f"{cost['execution_ms']:.3f}"


def _scale(results: Mapping[str, Any]) -> list[str]:
    scale = results.get("scale")
    if not scale:
        return ["", "scale phase: not run (--waiting-runs 0)"]
    vac = scale["quiet_vacuum"]
    columns = [scale["before"], *scale["sizes"]]
    n = int(scale["burst_runs"])

    def row(label: str, cell: Any) -> str:
        return _scale_row(label, [cell(x) for x in columns])

    def burst(x: Mapping[str, Any], text: Any) -> str:
        return "stalled" if x["burst"] is None else str(text(x["burst"]))

    largest = columns[-1]
    return [
        "",
        f"scale, in the quiet-VACUUM state: VACUUM ANALYZE of {vac['tables']} tables while "
        f"{vac['live_runs']} runs were live ({vac['seconds']:.1f} s), autovacuum off for "
        f"{', '.join(vac['autovacuum_off'])} ({vac.get('analysed', '?')} of them analysed by "
        f"it); seeded: {scale['shape']}",
        _scale_row("", ["before", *(f"{int(x['size']):,}" for x in scale["sizes"])]),
        row("  waiting runs (counted)", lambda x: f"{int(x['waiting_runs']):,}"),
        row("  seeded for this size, s",
            lambda x: f"{x['seed_seconds']:.1f}" if x["size"] else "-"),
        row("  statistics untouched since the VACUUM",
            lambda x: "yes" if x["statistics_untouched"] else "NO"),
        row(f"  burst of {n}, runs/s", lambda x: burst(x, lambda b: f"{b['runs_per_second']:.1f}")),
        row("    start->accepted in the burst p50/p99, ms",
            lambda x: _ms(x["burst"], "send_to_accepted_ms")),
        row("    completion poll p50/max, ms",
            lambda x: burst(x, lambda b: f"{b['poll_ms']['p50']:.2f} / {b['poll_ms']['max']:.2f}")),
        row(f"  {n} paced at {scale['rate']:.0f}/s: start->accepted p50/p99",
            lambda x: _ms(x["paced"], "send_to_accepted_ms")),
        row("    created->prepared (DB clock) p50/p99, ms",
            lambda x: _ms(x["paced"], "created_to_prepared_ms")),
        row("  dispatcher RSS, MiB", lambda x: f"{x['rss_mib']:.1f}"),
        row("  one claim, shared buffers hit+read", lambda x: _cost(x["claim"], "buffers")),
        row("  one claim, execution ms", lambda x: _cost(x["claim"], "ms")),
        row("  one settle, shared buffers hit+read", lambda x: _cost(x["settle"], "buffers")),
        row("  one settle, execution ms", lambda x: _cost(x["settle"], "ms")),
        row("  one lease sweep, shared buffers hit+read", lambda x: _cost(x["sweep"], "buffers")),
        row("  one lease sweep, execution ms", lambda x: _cost(x["sweep"], "ms")),
        row("  doctor through the API, median ms",
            lambda x: f"{statistics.median(x['doctor_ms']):.1f}"),
        row("  doctor's state.waiting",
            lambda x: "-" if x["doctor_waiting"] is None else f"{int(x['doctor_waiting']):,}"),
        row("  seconds: burst + paced + readings",
            lambda x: "{burst:.0f} + {paced:.0f} + {readings:.0f}".format(**x["seconds"])),
        f"  plans at {int(largest['size']):,} waiting (generic, rolled back):",
        f"    claim: {largest['claim']['plan']}",
        f"    settle: {largest['settle']['plan'] if largest['settle'] else '-'}",
        f"    lease sweep: {largest['sweep']['plan']}",
    ]  # fmt: skip


LIST_LABEL = 44


def _list_cell(entry: Mapping[str, Any]) -> str:
    if entry["failure"] is not None:
        return "WRONG"
    return f"{entry['ms']['median']:.1f} / {entry['ms']['max']:.1f}"


def _list_total(entry: Mapping[str, Any]) -> str:
    if entry["total"] is None:
        return "-"
    if entry["total_is_estimate"]:
        return f"~{int(entry['total']):,} of {int(entry['expected_total']):,}"
    return f"{int(entry['total']):,}"


def _console_pages(listed: Mapping[str, Any]) -> list[str]:
    """The console's attention page over the same runs (median / max ms of each page)."""
    console = listed.get("console")
    if not console:
        return []
    if console.get("failure"):
        return [f"  console attention page: WRONG: {console['failure']}"]
    cells = ", ".join(
        f"{page['page']} {page['ms']['median']:.1f} / {page['ms']['max']:.1f} ms"
        for page in console["pages"]
    )
    return [
        f"  console attention page (50 runs, served in process over the API, "
        f"{console['calls']} loads each, median / max): {cells}"
    ]


def _list_at_scale(results: Mapping[str, Any]) -> list[str]:
    """The run list at scale: per filter and limit, median / max ms in each round and the
    totals answered (a wrong answer shows WRONG, and its reason under the table)."""
    listed = (results.get("scale") or {}).get("list_at_scale")
    if not listed:
        return []
    held = listed["held"]
    rounds = listed["rounds"]
    lines = [
        "",
        f"run list at scale: GET /v1/runs among {int(listed['waiting_runs']):,} waiting and "
        f"{int(held['runs']):,} held runs, operator token, one connection",
        f"  held runs (seeded in {held['seconds']:.1f} s): {listed['shape']}",
        f"  each page: one call checked against SQL, then {listed['calls']} timed; median / max "
        "ms; total as answered (~: an estimate, of the real count)",
        (
            f"{'filter':<{LIST_LABEL}}{'limit':>6}"
            + "".join(f"{r['statistics'] + ' stats':>22}" for r in rounds)
            + "  total"
        ),
    ]
    failures: list[str] = []
    for i, first in enumerate(rounds[0]["filters"]):
        same = [r["filters"][i] for r in rounds]
        totals = list(dict.fromkeys(_list_total(entry) for entry in same))
        lines.append(
            (
                f"{'  ' + first['filter']:<{LIST_LABEL}}{first['limit']:>6}"
                + "".join(f"{_list_cell(entry):>22}" for entry in same)
                + "  "
                + " / ".join(totals)
            ).rstrip()
        )
        failures += [
            f"  WRONG ({r['statistics']} stats): {entry['filter']}, limit {entry['limit']}: "
            f"{entry['failure']}"
            for r, entry in zip(rounds, same, strict=True)
            if entry["failure"] is not None
        ]
    notes = []
    for r in rounds:
        if "analysed_tables" in r:
            how = (
                f"after ANALYZE of {', '.join(r['analysed_tables'])} ({r['analyse_seconds']:.1f} s)"
            )
        else:
            untouched = "yes" if r.get("statistics_untouched") else "NO"
            how = f"as the VACUUM left them (untouched since: {untouched})"
        notes.append(f"  {r['statistics']} stats: {how}; {r['seconds']:.1f} s")
    return lines + failures + notes + _console_pages(listed)


def _timings(results: Mapping[str, Any]) -> list[str]:
    timings = results.get("timings")
    if not timings:
        return []
    return ["", "phases, s: " + ", ".join(f"{name} {value:.0f}" for name, value in timings.items())]


def report(results: Mapping[str, Any]) -> str:
    """The printed report: header and server settings, the goals with PASS/MISS, each
    repeat's line, the medians, CPU per run, the scale phase."""
    lines = [
        *_header(results),
        *_goal_table(results),
        *_figures(results),
        *_cpu(results),
        *_scale(results),
        *_list_at_scale(results),
        *_timings(results),
        "-" * RULE,
        f"stand-in: {results['commands']['processed']} commands, "
        f"{results['commands']['twice']} processed twice",
        *filter(None, [served_line(results)]),
        f"raw rate: {results['raw']['note']}",
    ]
    return "\n".join(lines)
