"""``make soak``: a steady flow of runs among a million waiting ones, for minutes, watching
whether throughput, latency, memory and the cost of a claim or a settle drift (issue 24,
item 4). Not a test and not part of ``make bench``: pytest never collects it.

The order of things:

1. the local stack ``make bench`` uses (:func:`bench.run.build_stack`), a warm-up of a few
   bench runs (the seeding copies one of them);
2. the quiet-VACUUM state and ``--waiting-runs`` seeded waiting runs, exactly as the bench's
   scale phase makes them (:class:`bench.scale.Scale`): each is due at its next check a day
   or more away, so none comes due during a soak;
3. the start line: every component's RSS, PostgreSQL's, one claim's and one settle's
   buffers and time;
4. the flow: starts through the public API paced open-loop at ``--rate`` runs/s for
   ``--minutes``, at most ``rate × minutes × 60`` of them and none after the last minute,
   each a run of ``bench-notice`` (send, choose, send, finish). A poller on a connection of
   its own asks the database once a second which of the flow's runs have ended, by primary
   key;
5. after each minute (2 s into the next, so its last runs can end), one line: runs started
   and ended in it, p50/p99 of its runs' client send → the Messaging stand-in's
   ``acceptedAt`` of their first command (as the bench's latency phase measures it), the
   pacing lag, each component's RSS and PostgreSQL's;
6. the drain (every run of the flow ends, or 60 s pass), the end line, the claim and the
   settle again, and the verdicts; ``var/soak/results.json``.

The seeded runs never come due: their input payloads cannot be sealed in SQL, so a seeded
wait that came due could not be carried on. What comes due and completes during the soak
is the flow's own runs: each run's calls, its choose and its finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench.procs import memory
from bench.report import (
    GOAL_P99_MS,
    GOAL_SCALE_RSS_GROWTH_MIB,
    SCALE_BUFFER_SLACK,
    percentiles,
    verdict,
)
from bench.run import Bench, build_stack, fresh_state
from bench.scale import PlanCost, Scale
from devstack.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "var" / "soak" / "state"
OUT = ROOT / "var" / "soak" / "results.json"
MAX_RATE = 200.0
MAX_MINUTES = 120.0
MINUTE = 60.0
# A minute's line waits this long into the next minute, so that the minute's last runs
# (a run takes well under a second) have ended and are measured with the rest.
LINE_GRACE_SECONDS = 2.0
POLL_SECONDS = 1.0
DRAIN_SECONDS = 60.0
CLIENT_CONNECTIONS = 64


# ------------------------------------------------------------------------------ pure parts


def _bounded(name: str, low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number in (``low``, ``high``]."""

    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: not a number: {text!r}") from None
        if not (low < value <= high) or math.isnan(value):
            raise argparse.ArgumentTypeError(f"{name} must be > {low:g} and <= {high:g}")
        return value

    return check


def _count(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("--waiting-runs cannot be negative")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rate",
        type=_bounded("--rate", 0.0, MAX_RATE),
        default=50.0,
        help=f"starts per second, paced open-loop (> 0, <= {MAX_RATE:g})",
    )
    parser.add_argument(
        "--minutes",
        type=_bounded("--minutes", 0.0, MAX_MINUTES),
        default=10.0,
        help=f"length of the flow (> 0, <= {MAX_MINUTES:g})",
    )
    parser.add_argument(
        "--waiting-runs",
        type=_count,
        default=1_000_000,
        help="waiting runs seeded before the flow (0: none)",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="PostgreSQL with fsync, synchronous_commit and full_page_writes on",
    )
    parser.add_argument(
        "--state", type=Path, default=STATE, help="state and logs (replaced at every run)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="the results document")
    args = parser.parse_args(argv)
    args.state = args.state.resolve()
    return args


def planned_starts(rate: float, minutes: float) -> int:
    """The most starts the flow sends: ``rate`` per second for ``minutes``."""
    return int(rate * minutes * MINUTE)


def windows(minutes: float) -> list[tuple[float, float]]:
    """Each minute of the flow as (seconds from its start, seconds at its end); the last is
    shorter when ``minutes`` is not whole."""
    total = minutes * MINUTE
    return [(i * MINUTE, min((i + 1) * MINUTE, total)) for i in range(math.ceil(minutes))]


def count_within(instants: Sequence[float], since: float, until: float) -> int:
    """How many of ``instants`` fall in [``since``, ``until``)."""
    return sum(1 for at in instants if since <= at < until)


@dataclass(frozen=True)
class MinuteLine:
    """One line of the soak: a minute of the flow, or its start (``label`` ``start``, no
    runs) or its end (``end``: the drain after the last minute)."""

    label: str
    started: int
    ended: int
    measured: int
    """Runs of this minute whose first command was matched at the stand-in."""
    running: int
    """Runs started in this minute and not ended when it was summed up."""
    send_to_accepted_ms: dict[str, float]
    created_to_prepared_ms: dict[str, float]
    lag_p99_ms: float
    rss_mib: dict[str, float]
    postgres_mib: float | None
    seconds: float
    """Seconds since the flow began, when the line was taken."""
    match_ms: float = 0.0
    """How long matching the minute's first commands took: the stand-in's whole
    ``/dev/stats``, fetched and parsed, and one look-up of the runs' first steps."""


def summarise(
    label: str,
    sent: Mapping[str, float],
    ended: Mapping[str, float],
    since: float,
    until: float,
    to_accepted: Sequence[float],
    to_prepared: Sequence[float],
    lags_ms: Sequence[float],
    rss_mib: Mapping[str, float],
    postgres_mib: float | None,
    seconds: float,
    match_ms: float = 0.0,
) -> MinuteLine:
    """One minute's line: ``sent`` and ``ended`` are every run's send and end instants in
    seconds from the flow's start; the minute is [``since``, ``until``); ``to_accepted``
    and ``to_prepared`` are the minute's runs' start → first command in ms."""
    mine = [run for run, at in sent.items() if since <= at < until]
    return MinuteLine(
        label=label,
        started=len(mine),
        ended=count_within(list(ended.values()), since, until),
        measured=len(to_accepted),
        running=sum(1 for run in mine if run not in ended),
        send_to_accepted_ms=percentiles(to_accepted),
        created_to_prepared_ms=percentiles(to_prepared),
        lag_p99_ms=percentiles(lags_ms)["p99"] if lags_ms else 0.0,
        rss_mib=dict(rss_mib),
        postgres_mib=postgres_mib,
        seconds=round(seconds, 1),
        match_ms=round(match_ms, 1),
    )


def format_line(line: MinuteLine) -> str:
    """The printed form of one line."""
    head = f"soak: {line.label:>6}"
    if line.label == "start":
        runs = ""
    else:
        p = line.send_to_accepted_ms
        latency = (
            "start->first command -"
            if not line.measured
            else f"start->first command p50 {p['p50']:.1f} / p99 {p['p99']:.1f} ms"
            f" ({line.measured})"
        )
        runs = (
            f" started {line.started:5d} ended {line.ended:5d}"
            + (f" ({line.running} running)" if line.running else "")
            + f" | {latency} | lag p99 {line.lag_p99_ms:.1f} ms"
        )
    memory_mib = " ".join(f"{name} {mib:.1f}" for name, mib in line.rss_mib.items())
    pg = "" if line.postgres_mib is None else f" postgres {line.postgres_mib:.1f}"
    return f"{head}{runs} | RSS MiB {memory_mib}{pg}"


def format_cost(what: str, cost: PlanCost) -> str:
    return (
        f"{what} {cost.buffers} buffers ({cost.shared_hit} hit, {cost.shared_read} read), "
        f"{cost.execution_ms:.3f} ms; {cost.plan}"
    )


@dataclass(frozen=True)
class Verdict:
    key: str
    label: str
    achieved: str
    target: str
    ok: bool | None


def flat(before: int, after: int) -> bool:
    """Flat means flat: a statement's buffers at the end are at most twice those at the start
    plus a little (an index level or a visibility-map page)."""
    return after <= 2 * before + SCALE_BUFFER_SLACK


def verdicts(
    rss_start: float,
    rss_end: float,
    minutes: Sequence[MinuteLine],
    claim: tuple[int, int],
    settle: tuple[int, int] | None,
) -> list[Verdict]:
    """The soak's goals: the dispatcher's RSS growth, the worst minute's p99 start → first
    command, and one claim's and one settle's buffers, start vs end (None: not measured)."""
    growth = rss_end - rss_start
    p99s = [m.send_to_accepted_ms["p99"] for m in minutes if m.measured]
    worst = max(p99s) if p99s else None
    # A minute with runs started and none measured is a stalled minute: it misses.
    stalled = any(m.started and not m.measured for m in minutes)
    p99_ok = None if worst is None else (worst <= GOAL_P99_MS and not stalled)
    target_flat = f"end <= 2x start + {SCALE_BUFFER_SLACK}"
    return [
        Verdict(
            "rss",
            "dispatcher RSS growth over the soak, MiB",
            f"{rss_start:.1f} -> {rss_end:.1f} ({growth:+.1f})",
            f"< {GOAL_SCALE_RSS_GROWTH_MIB:.0f}",
            growth < GOAL_SCALE_RSS_GROWTH_MIB,
        ),
        Verdict(
            "p99",
            "start->first command p99, worst minute, ms",
            "not measured"
            if worst is None
            else f"{worst:.1f}" + (" (a stalled minute)" if stalled else ""),
            f"<= {GOAL_P99_MS:.0f}",
            p99_ok,
        ),
        Verdict(
            "claim",
            "claim buffers start / end",
            f"{claim[0]} / {claim[1]}",
            target_flat,
            flat(*claim),
        ),
        Verdict(
            "settle",
            "settle buffers start / end",
            "not measured" if settle is None else f"{settle[0]} / {settle[1]}",
            target_flat,
            None if settle is None else flat(*settle),
        ),
    ]


def format_verdict(v: Verdict) -> str:
    return f"soak: {v.label:<44} {v.achieved:>26}   goal {v.target:<22} {verdict(v.ok)}"


# ------------------------------------------------------------------------------ readings


def postgres_mib(server: PostgresServer) -> float | None:
    """PostgreSQL's memory: the proportional set size (Pss) of the postmaster and every
    backend, which counts shared buffers once rather than once per backend; None when
    ``/proc`` does not say."""
    try:
        postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
        pids = [
            postmaster,
            *map(int, Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()),
        ]
    except (OSError, ValueError):
        return None
    total_kib = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue  # a backend that ended meanwhile
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total_kib += int(line.split()[1])
    return round(total_kib / 1024, 1)


# ------------------------------------------------------------------------------ the flow


@dataclass
class Flow:
    """The steady flow's runs: each run's send instant and (once seen) end instant, both in
    seconds from the flow's start, and each start's pacing lag by minute."""

    began_wall: float = 0.0
    sent_wall: dict[str, float] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    lags_ms: dict[int, list[float]] = field(default_factory=dict)
    errors: int = 0
    planned: int = 0
    send_seconds: float = 0.0
    """From the first start sent until the last start was answered."""


class Soak:
    """The flow on one stack: the sender, the poller of ended runs, and the minute lines."""

    def __init__(self, bench: Bench, args: argparse.Namespace) -> None:
        self.bench = bench
        self.args = args
        self.flow = Flow()
        self.poll_db: asyncpg.Connection | None = None
        self.poll_lock = asyncio.Lock()
        self.launcher = bench.stack.processes["coordinator"].pid

    def rss(self) -> dict[str, float]:
        return {m.component: m.rss_mib for m in memory(self.launcher)}

    async def poll_ended(self) -> None:
        """Which of the flow's runs not yet seen ended have ended, and when (the database's
        clock, which is this host's); one look-up by primary key each."""
        async with self.poll_lock:
            pending = [run for run in self.flow.sent if run not in self.flow.ended]
            if not pending or self.poll_db is None:
                return
            rows = await self.poll_db.fetch(
                self.bench.sql(
                    "SELECT id, extract(epoch FROM ended_at)::float8 AS ended "
                    "FROM {ns}.run WHERE id = ANY($1::text[]) AND ended_at IS NOT NULL"
                ),
                pending,
            )
            for row in rows:
                self.flow.ended[str(row["id"])] = float(row["ended"]) - self.flow.began_wall

    async def poller(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            await self.poll_ended()

    async def send(self) -> None:
        """Starts paced open-loop at ``--rate`` until ``--minutes`` are over or the planned
        number is sent; then waits for every start's answer."""
        rate, total = self.args.rate, self.args.minutes * MINUTE
        flow = self.flow
        flow.planned = planned_starts(rate, self.args.minutes)
        in_flight: set[asyncio.Task[None]] = set()

        async def one(client: aiohttp.ClientSession, index: int) -> None:
            wall = time.time()
            try:
                run_id, _ = await self.bench.start(client, f"s-{index}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                sys.stderr.write(f"soak: a start failed: {exc!r}\n")
                run_id = None
            if run_id is None:
                flow.errors += 1
                return
            flow.sent_wall[run_id] = wall
            flow.sent[run_id] = wall - flow.began_wall

        async with self.bench.client(CLIENT_CONNECTIONS) as client:
            began = time.monotonic()
            for index in range(flow.planned):
                target = began + index / rate
                if target - began >= total:
                    break
                pause = target - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                if time.monotonic() - began >= total:
                    break  # bounded in time too: a client that fell behind stops on time
                lag = max(0.0, time.monotonic() - target) * 1000
                flow.lags_ms.setdefault(int((target - began) // MINUTE), []).append(lag)
                task = asyncio.create_task(one(client, index))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await asyncio.gather(*in_flight)
            flow.send_seconds = time.monotonic() - began

    async def minute(self, index: int, since: float, until: float, label: str) -> MinuteLine:
        """The line of one window of the flow, measured now."""
        await self.poll_ended()
        flow = self.flow
        done = {
            run: flow.sent_wall[run]
            for run, at in list(flow.sent.items())
            if since <= at < until and run in flow.ended
        }
        # The stand-in answers every command it has processed so far and builds that on
        # its one event loop; its cost grows with the flow and falls on the next minute's
        # runs, so it is recorded beside the minute.
        began = time.perf_counter()
        to_accepted, to_prepared = await self.bench.first_commands(done) if done else ([], [])
        match_ms = (time.perf_counter() - began) * 1000
        return summarise(
            label,
            dict(flow.sent),
            dict(flow.ended),
            since,
            until,
            to_accepted,
            to_prepared,
            flow.lags_ms.get(index, []),
            self.rss(),
            postgres_mib(self.bench.server),
            time.time() - flow.began_wall,
            match_ms,
        )

    async def run(self) -> dict[str, Any]:
        """The flow with a line per minute, the drain and the end line."""
        self.poll_db = await self.bench.connect()
        flow = self.flow
        flow.began_wall = time.time()
        began = time.monotonic()
        sender = asyncio.create_task(self.send())
        poller = asyncio.create_task(self.poller())
        lines: list[MinuteLine] = []
        try:
            for index, (since, until) in enumerate(windows(self.args.minutes)):
                due = began + until + LINE_GRACE_SECONDS
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                line = await self.minute(index, since, until, f"min {index + 1}")
                print(format_line(line), flush=True)
                lines.append(line)
            await sender
            drain_deadline = time.monotonic() + DRAIN_SECONDS
            while len(flow.ended) < len(flow.sent) and time.monotonic() < drain_deadline:
                await asyncio.sleep(POLL_SECONDS)
                await self.poll_ended()
            # A minute summed up with runs still running is summed up again now, so that
            # the judged figure covers every run that ended.
            for index, (since, until) in enumerate(windows(self.args.minutes)):
                if lines[index].running:
                    lines[index] = await self.minute(index, since, until, f"min {index + 1}")
                    print(format_line(lines[index]) + " (again, after the drain)", flush=True)
            end = await self.minute(-1, self.args.minutes * MINUTE, math.inf, "end")
        finally:
            poller.cancel()
            if not sender.done():
                sender.cancel()
            await asyncio.gather(poller, sender, return_exceptions=True)
            await self.poll_db.close()
        print(format_line(end), flush=True)
        return {
            "minutes": lines,
            "end": end,
            "flow_seconds": round(flow.send_seconds, 1),
            "planned": flow.planned,
            "started": len(flow.sent),
            "ended": len(flow.ended),
            "start_errors": flow.errors,
        }


# ------------------------------------------------------------------------------ the soak


async def soak(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    timings: dict[str, float] = {}
    mark = time.monotonic()

    def took(phase: str) -> None:
        nonlocal mark
        timings[phase] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()

    await bench.open()
    try:
        assert bench.db is not None
        settings = await bench.postgres_settings()
        print("soak: warming up", flush=True)
        await bench.warm_up()
        took("warm-up")
        scale = Scale(bench.db, bench.namespace, bench.connect)
        print("soak: VACUUM ANALYZE with no run live (the quiet-VACUUM state)", flush=True)
        vacuum = await scale.quiet_vacuum()
        if vacuum.live_runs:
            sys.stderr.write(f"soak: {vacuum.live_runs} runs were live at the VACUUM\n")
        took("quiet VACUUM")
        if args.waiting_runs:
            print(f"soak: seeding {args.waiting_runs:,} waiting runs", flush=True)
            seed_seconds = await scale.seed(args.waiting_runs)
            print(f"soak: seeded in {seed_seconds:.1f} s", flush=True)
        took("seeding")
        waiting = await scale.waiting()
        middle = (args.waiting_runs + 1) // 2
        flow = Soak(bench, args)
        start_rss = flow.rss()
        start = summarise(
            "start", {}, {}, 0, 0, [], [], [], start_rss, postgres_mib(bench.server), 0.0
        )
        claim_start = await scale.claim_cost()
        settle_start = await scale.settle_cost(middle) if args.waiting_runs else None
        print(
            f"soak: {waiting:,} waiting runs; {args.rate:g} runs/s for {args.minutes:g} min "
            f"({planned_starts(args.rate, args.minutes):,} starts at most)",
            flush=True,
        )
        print(format_line(start), flush=True)
        print("soak: start: " + format_cost("one claim:", claim_start), flush=True)
        if settle_start is not None:
            print("soak: start: " + format_cost("one settle:", settle_start), flush=True)
        took("start readings")
        flowed = await flow.run()
        took("flow and drain")
        claim_end = await scale.claim_cost()
        settle_end = await scale.settle_cost(middle) if args.waiting_runs else None
        print("soak: end: " + format_cost("one claim:", claim_end), flush=True)
        if settle_end is not None:
            print("soak: end: " + format_cost("one settle:", settle_end), flush=True)
        untouched = await scale.analysed() == scale.analysed_at_vacuum
        waiting_end = await scale.waiting()
        took("end readings")
    finally:
        await bench.close()
    end: MinuteLine = flowed["end"]
    found = verdicts(
        start_rss["dispatcher"],
        end.rss_mib["dispatcher"],
        flowed["minutes"],
        (claim_start.buffers, claim_end.buffers),
        None
        if settle_start is None or settle_end is None
        else (settle_start.buffers, settle_end.buffers),
    )
    return {
        "postgres": settings,
        "quiet_vacuum": asdict(vacuum),
        "waiting_runs": {"start": waiting, "end": waiting_end},
        "statistics_untouched": untouched,
        "start": asdict(start),
        "minutes": [asdict(m) for m in flowed["minutes"]],
        "end": asdict(end),
        "flow": {
            k: flowed[k] for k in ("flow_seconds", "planned", "started", "ended", "start_errors")
        },
        "claim": {"start": claim_start.to_json(), "end": claim_end.to_json()},
        "settle": None
        if settle_start is None or settle_end is None
        else {"start": settle_start.to_json(), "end": settle_end.to_json()},
        "verdicts": [asdict(v) for v in found],
        "goals": {v.key: v.ok for v in found},
        "timings": timings,
    }


def summary(results: Mapping[str, Any], verdicts_found: Sequence[Verdict]) -> list[str]:
    """The lines printed at the end."""
    flow = results["flow"]
    lines = [
        f"soak: {flow['started']:,} runs started of {flow['planned']:,} planned in "
        f"{flow['flow_seconds']:.0f} s, {flow['ended']:,} ended, "
        f"{flow['start_errors']} start errors; waiting runs {results['waiting_runs']['start']:,}"
        f" -> {results['waiting_runs']['end']:,}; statistics untouched since the VACUUM: "
        f"{'yes' if results['statistics_untouched'] else 'NO'}",
        *(format_verdict(v) for v in verdicts_found),
        "soak: timings, s: "
        + ", ".join(f"{phase} {seconds:g}" for phase, seconds in results["timings"].items()),
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``make soak``."""
    args = parse_args(argv)
    fresh_state(args.state)
    load_before = os.getloadavg()
    began = time.monotonic()
    print(
        f"soak: starting PostgreSQL (TLS, durable={args.durable}) and the local stack "
        f"in {args.state}",
        flush=True,
    )
    server, stack = build_stack(args.state, args.durable)
    stack_seconds = time.monotonic() - began
    try:
        bench = Bench(server, stack, args)
        results = asyncio.run(soak(bench, args))
    finally:
        stack.stop()
        server.stop()
    results["timings"] = {
        "stack start": round(stack_seconds, 1),
        **results["timings"],
        "whole soak": round(time.monotonic() - began, 1),
    }
    results["settings"] = {
        "rate": args.rate,
        "minutes": args.minutes,
        "waiting_runs": args.waiting_runs,
        "durable": args.durable,
    }
    results["machine"] = {
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }
    found = [Verdict(**v) for v in results["verdicts"]]
    for line in summary(results, found):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"soak: results written to {args.out}")


if __name__ == "__main__":
    main()
