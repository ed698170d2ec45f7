"""``make bench``: throughput, start-to-first-command latency, the raw database rate, the
memory of each component and the cost of many waiting runs, measured on the whole local
stack of this machine and printed beside the goals of issue 11.

The stack is the one ``make quickstart`` runs (PostgreSQL 17 with TLS, the development
issuer, the Messaging stand-in without injected delay, the all-in-one coordinator) with one
workflow, ``bench-notice``: send a notice, choose, send another notice, finish — four step
transitions per run. PostgreSQL runs with ``durable=False`` (fsync, synchronous commit and
full-page writes off) unless ``--durable`` is given; the coordinator and the raw rate share
the server either way, so the ratio between the two compares like with like.

Phases, in order:

1. the raw rate, first half (see :mod:`bench.raw`), in a database of its own on the same
   server, so its commits never count as the coordinator's;
2. warm-up: a few runs fill the token, key and package caches;
3. ``--repeats`` times on the same stack:
   a. throughput: ``--runs`` starts through the HTTP API with a producer token and at most
      ``--start-concurrency`` requests in flight; the clock stops when the database counts
      every run ended (runs/s, step transitions/s, transactions per transition, CPU);
   b. memory: VmRSS of the launcher and each component child right after it;
   c. latency: starts paced open-loop at ``--rate`` runs/s for ``--latency-seconds``;
      start → first command is measured twice: from the client's send instant to the
      stand-in's ``acceptedAt`` (same host clock, millisecond resolution), and from
      ``run.created_at`` to the first call step's ``prepared_at`` (the database's clock);
   d. memory again (VmHWM: the peak each process reached so far);
4. the raw rate, second half;
5. scale (see :mod:`bench.scale`): ``--waiting-runs`` waiting runs seeded with SQL; the
   dispatcher's RSS and one claim's buffers before and after.

The medians of the repeats are judged against the goals (:mod:`bench.report`); every
repeat and the medians are written to ``results.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import httpx

from bench.raw import RawResult, measure, scratch_owner_note
from bench.report import (
    POSTGRES_SETTINGS,
    STEPS_PER_RUN,
    goal_verdicts,
    medians,
    percentiles,
    report,
)
from bench.scale import Scale, ScaleResult
from core.db.connect import connect
from core.workflow.package import build_package
from devstack.postgres import DatabaseHandle, PostgresServer
from devstack.stack import LocalStack

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "var" / "bench"
STATE_MARK = ".bench-state"
RAW_DATABASE = "bench_raw"
WORKFLOW_SOURCE = Path(__file__).resolve().parent / "workflow" / "bench-notice"
WORKFLOW = "bench-notice"
WARM_UP_RUNS = 10
SCALE_BURST_RUNS = 100
SCALE_BURST_TIMEOUT = 60.0
MIB = 1024 * 1024
STATS_SETTLE_SECONDS = 1.5


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Throughput:
    runs: int
    seconds: float
    starts_seconds: float
    db_span_seconds: float
    succeeded: int
    start_errors: int
    commits_per_run: float

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.seconds

    @property
    def steps_per_second(self) -> float:
        return self.runs * STEPS_PER_RUN / self.seconds


@dataclass(frozen=True)
class Latency:
    runs: int
    offered_rate: float
    achieved_rate: float
    pacing_lag_p99_ms: float
    start_answer_ms: dict[str, float]
    send_to_accepted_ms: dict[str, float]
    created_to_prepared_ms: dict[str, float]
    start_errors: int


@dataclass(frozen=True)
class Memory:
    component: str
    pid: int
    rss_mib: float
    peak_mib: float


# ------------------------------------------------------------------------------ the stack


def build_stack(state: Path, durable: bool) -> tuple[PostgresServer, LocalStack]:
    """PostgreSQL under ``state`` (``durable`` as asked), the issuer, the Messaging stand-in,
    the deployment applied with the real ``coordinatorctl``, and the all-in-one
    coordinator, ready."""
    built = build_package(WORKFLOW_SOURCE, state / "packages")
    server = PostgresServer.start(state / "postgres", durable=durable)
    stack: LocalStack | None = None
    try:
        stack = LocalStack.prepare(
            state / "stack", packages=[(built.path, built.digest)], database=server.default
        )
        stack.start_products()
        ctl = str(Path(sys.executable).with_name("coordinatorctl"))
        subprocess.run(
            [ctl, "--runtime-config", str(stack.runtime_file), "apply"],
            check=True,
            capture_output=True,
        )
        stack.start_coordinator()
    except BaseException:
        if stack is not None:
            stack.stop()
        server.stop()
        raise
    return server, stack


class Bench:
    """One stack and the measurements taken on it."""

    def __init__(self, server: PostgresServer, stack: LocalStack, args: argparse.Namespace):
        self.server = server
        self.stack = stack
        self.args = args
        self.namespace = str(stack.summary["namespace"])
        token_file = stack.mint("producer", "bench-producer", args.state / "producer-token")
        self.token = token_file.read_text().strip()
        self.messaging = stack.product_urls["messaging"]
        self.db: asyncpg.Connection | None = None
        self.own_queries = 0

    async def open(self) -> None:
        handle = self.server.default
        self.db = await connect(handle.migration_url, handle.ca_pem, label="bench database")

    async def close(self) -> None:
        if self.db is not None:
            await self.db.close()

    def sql(self, text: str) -> str:
        """``text`` with ``{ns}`` naming the deployment's namespace, which the runtime file
        check matched against ^coordinator_[a-z0-9_]+$; nothing else is put into SQL."""
        return text.replace("{ns}", f'"{self.namespace}"')

    async def postgres_settings(self) -> dict[str, str]:
        """The server settings the report shows, as ``SHOW`` spells them."""
        assert self.db is not None
        rows = await self.db.fetch(
            "SELECT name, current_setting(name) AS value FROM unnest($1::text[]) AS name",
            list(POSTGRES_SETTINGS),
        )
        return {str(row["name"]): str(row["value"]) for row in rows}

    async def commits(self) -> int:
        """Transactions committed in the database so far (all sessions; the statistics
        collector publishes other sessions' counts within about a second)."""
        assert self.db is not None
        self.own_queries += 1
        value = await self.db.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(value)

    async def ended_runs(self) -> int:
        assert self.db is not None
        self.own_queries += 1
        # The namespace is the deployment's own, matched against ^coordinator_[a-z0-9_]+$.
        value = await self.db.fetchval(
            self.sql("SELECT count(*) FROM {ns}.run WHERE ended_at IS NOT NULL")
        )
        return int(value)

    async def wait_ended(self, total: int, timeout: float) -> None:
        """Poll the database (every 20 ms) until ``total`` runs have ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.ended_runs() >= total:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError(f"only {await self.ended_runs()} of {total} runs ended in {timeout} s")

    async def start(self, client: aiohttp.ClientSession, label: str) -> tuple[str | None, float]:
        """One start through the API; answers (run id or None, seconds until answered)."""
        began = time.perf_counter()
        async with client.post(
            f"{self.stack.url}/v1/workflows/{WORKFLOW}/runs",
            json={"input": {"recipientRef": label}},
            headers={
                "Authorization": f"Bearer {self.token}",
                "Idempotency-Key": f"bench-{uuid.uuid4().hex}",
            },
        ) as answer:
            body = await answer.read()
        elapsed = time.perf_counter() - began
        if answer.status != 201:
            sys.stderr.write(f"bench: a start answered {answer.status}\n")
            return None, elapsed
        return str(json.loads(body)["runId"]), elapsed

    def client(self, connections: int) -> aiohttp.ClientSession:
        # aiohttp, as the dispatcher uses: the client shares the 2 cores with the stack, and
        # httpx's own transport cost it ~3 ms of CPU per start.
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=30.0),
            trust_env=False,
        )

    # -------------------------------------------------------------------------- phases

    async def warm_up(self) -> None:
        """A few runs first: JWKS, access tokens, package cache and pools get filled."""
        async with self.client(4) as client:
            await asyncio.gather(*(self.start(client, f"warm-{i}") for i in range(WARM_UP_RUNS)))
        await self.wait_ended(WARM_UP_RUNS, timeout=60)

    async def throughput(self, runs: int, timeout: float | None = None) -> Throughput:
        """``runs`` starts, at most ``--start-concurrency`` in flight, timed until all have
        ended (raises ``TimeoutError`` after ``timeout`` seconds; default by the count)."""
        before = await self.ended_runs()
        await asyncio.sleep(STATS_SETTLE_SECONDS)
        commits_before = await self.commits()
        own_before = self.own_queries
        concurrency = self.args.start_concurrency
        gate = asyncio.Semaphore(concurrency)
        errors = 0
        ids: list[str] = []

        async def one(client: aiohttp.ClientSession, index: int) -> None:
            nonlocal errors
            async with gate:
                run_id, _ = await self.start(client, f"t-{index}")
            if run_id is None:
                errors += 1
            else:
                ids.append(run_id)

        began = time.monotonic()
        async with self.client(concurrency) as client:
            await asyncio.gather(*(one(client, i) for i in range(runs)))
        starts = time.monotonic() - began
        await self.wait_ended(before + len(ids), timeout=timeout or max(120.0, runs * 0.5))
        elapsed = time.monotonic() - began
        assert self.db is not None
        row = await self.db.fetchrow(
            self.sql(
                """SELECT count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
                       extract(epoch FROM max(ended_at) - min(created_at))::float8 AS span
                  FROM {ns}.run WHERE id = ANY($1::text[])"""
            ),
            ids,
        )
        return Throughput(
            runs=len(ids),
            seconds=elapsed,
            starts_seconds=starts,
            db_span_seconds=float(row["span"]),
            succeeded=int(row["succeeded"]),
            start_errors=errors,
            commits_per_run=await self._commits_since(commits_before, own_before) / len(ids),
        )

    async def _commits_since(self, before: int, own_before: int) -> float:
        # The coordinator is idle again: wait for its last counts to be published, then
        # leave out this client's own polling queries (each its own transaction).
        await asyncio.sleep(STATS_SETTLE_SECONDS)
        own = self.own_queries - own_before + 1
        return float(await self.commits() - before - own)

    async def latency(self, rate: float, seconds: float) -> Latency:
        before = await self.ended_runs()
        count = int(rate * seconds)
        sent: dict[str, float] = {}
        answered: list[float] = []
        lags: list[float] = []
        errors = 0

        async def one(client: aiohttp.ClientSession, index: int) -> None:
            nonlocal errors
            wall = time.time()
            run_id, elapsed = await self.start(client, f"l-{index}")
            if run_id is None:
                errors += 1
                return
            sent[run_id] = wall
            answered.append(elapsed * 1000)

        tasks: list[asyncio.Task[None]] = []
        async with self.client(64) as client:
            began = time.monotonic()
            for index in range(count):
                target = began + index / rate
                pause = target - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                lags.append(max(0.0, time.monotonic() - target) * 1000)
                tasks.append(asyncio.create_task(one(client, index)))
            await asyncio.gather(*tasks)
            offered_for = time.monotonic() - began
        await self.wait_ended(before + len(sent), timeout=120)

        accepted = await self.accepted_by_key()
        assert self.db is not None
        rows = await self.db.fetch(
            self.sql(
                """SELECT r.id, s.command_key,
                       extract(epoch FROM s.prepared_at - r.created_at)::float8 AS prepared
                  FROM {ns}.run r
                  JOIN {ns}.step s ON s.run_id = r.id AND s.seq = 1
                 WHERE r.id = ANY($1::text[])"""
            ),
            list(sent),
        )
        to_accepted: list[float] = []
        to_prepared: list[float] = []
        for row in rows:
            to_prepared.append(float(row["prepared"]) * 1000)
            at = accepted.get(str(row["command_key"]))
            if at is not None:
                to_accepted.append((at - sent[str(row["id"])]) * 1000)
        if len(to_accepted) != len(sent):
            sys.stderr.write(
                f"bench: matched {len(to_accepted)} of {len(sent)} first commands at the stand-in\n"
            )
        return Latency(
            runs=len(sent),
            offered_rate=rate,
            achieved_rate=count / offered_for,
            pacing_lag_p99_ms=percentiles(lags)["p99"],
            start_answer_ms=percentiles(answered),
            send_to_accepted_ms=percentiles(to_accepted),
            created_to_prepared_ms=percentiles(to_prepared),
            start_errors=errors,
        )

    async def accepted_by_key(self) -> dict[str, float]:
        """The stand-in's acceptance instant of every command, by idempotency key.

        ``/dev/stats`` lists processed keys and answers in the same first-processed order
        (both come from one ledger insert per key), so they pair up one to one.
        """
        async with httpx.AsyncClient(timeout=30.0) as client:
            stats = (await client.get(self.messaging + "/dev/stats")).json()
        keys = list(stats["processed"])
        answers = stats["answers"]
        if len(keys) != len(answers):
            raise RuntimeError("the stand-in's processed keys and answers do not pair up")
        return {
            key: datetime.fromisoformat(answer["body"]["acceptedAt"]).timestamp()
            for key, answer in zip(keys, answers, strict=True)
        }

    async def processed_twice(self) -> tuple[int, int]:
        """(commands processed, keys processed more than once) at the stand-in."""
        async with httpx.AsyncClient(timeout=30.0) as client:
            stats = (await client.get(self.messaging + "/dev/stats")).json()
        processed: dict[str, int] = stats["processed"]
        return len(processed), sum(1 for n in processed.values() if n > 1)


# ------------------------------------------------------------------------------ memory


def component_processes(launcher_pid: int) -> dict[str, int]:
    """The launcher and its component children, by component name."""
    found = {"launcher": launcher_pid}
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    for child in children:
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"--component" in argv:
            found[argv[argv.index(b"--component") + 1].decode()] = int(child)
    return found


def _status_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of one process, in MiB."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024 / MIB
    return fields


def rss_mib(pid: int) -> float:
    """VmRSS of one process now, in MiB."""
    return round(_status_mib(pid)["VmRSS"], 1)


def memory(launcher_pid: int) -> list[Memory]:
    """VmRSS (now) and VmHWM (peak) of each coordinator process."""
    out: list[Memory] = []
    for name, pid in component_processes(launcher_pid).items():
        fields = _status_mib(pid)
        out.append(Memory(name, pid, round(fields["VmRSS"], 1), round(fields["VmHWM"], 1)))
    return out


# ------------------------------------------------------------------------------ CPU use

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _machine_busy() -> float:
    """CPU seconds the whole machine spent not idle, all cores together."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / TICK


class CpuMeter:
    """CPU seconds per process group of the stack between :meth:`start` and :meth:`stop`."""

    def __init__(self, server: PostgresServer, stack: LocalStack) -> None:
        self.server = server
        self.stack = stack
        self._before: dict[str, float] = {}
        self._began = 0.0

    def _groups(self) -> dict[str, list[int]]:
        groups = {
            name: [pid]
            for name, pid in component_processes(self.stack.processes["coordinator"].pid).items()
        }
        groups["messaging stand-in"] = [self.stack.processes["messaging"].pid]
        groups["issuer"] = [self.stack.processes["issuer"].pid]
        postmaster = int((self.server.data_dir / "postmaster.pid").read_text().split()[0])
        groups["postgres (all backends)"] = [postmaster, *_children(postmaster)]
        groups["bench client"] = [os.getpid()]
        return groups

    def _sample(self) -> dict[str, float]:
        sample = {name: sum(map(_cpu_seconds, pids)) for name, pids in self._groups().items()}
        sample["machine (all processes)"] = _machine_busy()
        return sample

    def start(self) -> None:
        self._before = self._sample()
        self._began = time.monotonic()

    def stop(self) -> dict[str, float]:
        """CPU seconds used per group since :meth:`start`, and the wall seconds as ``wall``."""
        after = self._sample()
        used = {name: after[name] - self._before.get(name, 0.0) for name in after}
        ours = sum(v for k, v in used.items() if not k.startswith("machine"))
        used["other work on the machine"] = used["machine (all processes)"] - ours
        used["wall"] = time.monotonic() - self._began
        return {name: round(value, 2) for name, value in used.items()}


# ------------------------------------------------------------------------------ phases


async def one_repeat(bench: Bench, args: argparse.Namespace, index: int) -> dict[str, Any]:
    """Throughput, memory, latency and peak memory once; the repeat's figures."""
    print(f"bench: repeat {index}: throughput, {args.runs} runs", flush=True)
    meter = CpuMeter(bench.server, bench.stack)
    meter.start()
    through = await bench.throughput(args.runs)
    cpu = meter.stop()
    launcher = bench.stack.processes["coordinator"].pid
    after_throughput = memory(launcher)
    print(
        f"bench: repeat {index}: latency, {args.rate:.0f} runs/s for {args.latency_seconds:.0f} s",
        flush=True,
    )
    lat = await bench.latency(args.rate, args.latency_seconds)
    peaks = {m.component: m for m in memory(launcher)}
    mem = [
        Memory(
            m.component,
            m.pid,
            m.rss_mib,
            # The kernel's RSS counters are per-CPU approximations; never show a peak
            # below a reading taken earlier.
            max(m.peak_mib, m.rss_mib, peaks[m.component].rss_mib, peaks[m.component].peak_mib),
        )
        for m in after_throughput
    ]
    return {
        "throughput": {
            **asdict(through),
            "runs_per_second": through.runs_per_second,
            "steps_per_second": through.steps_per_second,
        },
        "latency": asdict(lat),
        "memory": [asdict(m) for m in mem],
        "cpu_seconds_during_throughput": cpu,
    }


async def scale_phase(bench: Bench, count: int) -> ScaleResult:
    """Dispatcher RSS and one claim's cost, before and after ``count`` waiting runs."""
    assert bench.db is not None
    scale = Scale(bench.db, bench.namespace)
    dispatcher = component_processes(bench.stack.processes["coordinator"].pid)["dispatcher"]

    async def burst() -> tuple[float | None, float]:
        # A dispatcher that stops with many runs waiting is the finding here, not a reason
        # to lose every figure measured so far: give up on the burst and say so.
        try:
            through = await bench.throughput(SCALE_BURST_RUNS, timeout=SCALE_BURST_TIMEOUT)
        except TimeoutError as exc:
            sys.stderr.write(f"bench: scale: {exc}\n")
            return None, rss_mib(dispatcher)
        return through.runs_per_second, rss_mib(dispatcher)

    print(f"bench: scale: burst of {SCALE_BURST_RUNS} runs, one claim explained", flush=True)
    before_rps, rss_before = await burst()
    if before_rps is None:
        raise RuntimeError("the scale phase's first burst did not end; no waiting runs yet")
    claim_before = await scale.claim_cost()
    print(f"bench: scale: seeding {count:,} waiting runs", flush=True)
    seeded_in = await scale.seed(count)
    waiting = await scale.waiting()
    print(f"bench: scale: seeded in {seeded_in:.1f} s; burst, one claim explained", flush=True)
    after_rps, rss_after = await burst()
    claim_after = await scale.claim_cost()
    return ScaleResult(
        waiting_runs=waiting,
        seed_seconds=round(seeded_in, 2),
        burst_runs=SCALE_BURST_RUNS,
        burst_before_rps=round(before_rps, 1),
        burst_after_rps=None if after_rps is None else round(after_rps, 1),
        rss_before_mib=rss_before,
        rss_after_mib=rss_after,
        claim_before=claim_before,
        claim_after=claim_after,
    )


async def measure_all(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    await bench.open()
    try:
        settings = await bench.postgres_settings()
        raw_db = await bench.server.acreate_database(RAW_DATABASE)
        raw_halves = [await raw_rate(bench, raw_db, args)]
        print("bench: warming up", flush=True)
        await bench.warm_up()
        repeats = [await one_repeat(bench, args, i + 1) for i in range(args.repeats)]
        raw_halves.append(await raw_rate(bench, raw_db, args))
        processed, twice = await bench.processed_twice()
        scale = await scale_phase(bench, args.waiting_runs) if args.waiting_runs > 0 else None
    finally:
        await bench.close()
    return {
        "postgres": settings,
        "repeats": repeats,
        "commands": {"processed": processed, "twice": twice},
        "scale": scale.to_json() if scale is not None else None,
        "raw_result": RawResult(
            transactions=sum(r.transactions for r, _ in raw_halves),
            seconds=sum(r.seconds for r, _ in raw_halves),
            connections=args.raw_connections,
            empty_claims=sum(r.empty_claims for r, _ in raw_halves),
        ),
        "raw_halves_per_second": [round(r.per_second, 1) for r, _ in raw_halves],
        "raw_cpu": {
            name: round(sum(cpu[name] for _, cpu in raw_halves), 2) for name in raw_halves[0][1]
        },
    }


async def raw_rate(
    bench: Bench, database: DatabaseHandle, args: argparse.Namespace
) -> tuple[RawResult, dict[str, float]]:
    """Half of the raw-rate window (one before the coordinator works, one after), in its own
    ``database`` on the same server, with the CPU seconds PostgreSQL and this client spent."""
    seconds = args.raw_seconds / 2
    print(f"bench: raw rate, {args.raw_connections} connections, {seconds:.0f} s", flush=True)
    meter = CpuMeter(bench.server, bench.stack)
    used: dict[str, float] = {}
    result = await measure(
        database.migration_url,
        database.ca_pem,
        seconds=seconds,
        connections=args.raw_connections,
        started=meter.start,
        finished=lambda: used.update(meter.stop()),
    )
    keep = ("postgres (all backends)", "bench client", "other work on the machine", "wall")
    return result, {name: used[name] for name in keep}


def fresh_state(state: Path) -> None:
    """Empty ``state`` for this run: a folder an earlier bench made (it holds the mark
    file), an empty one, or a new one; anything else is refused rather than deleted."""
    if state.exists():
        if not (state / STATE_MARK).exists() and any(state.iterdir()):
            raise SystemExit(f"bench: {state} is not empty and not a bench state folder")
        shutil.rmtree(state)
    state.mkdir(parents=True)
    (state / STATE_MARK).write_text("made by bench.run; replaced at every run\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500, help="runs of each throughput phase")
    parser.add_argument("--start-concurrency", type=int, default=16, help="starts in flight")
    parser.add_argument("--rate", type=float, default=50.0, help="latency phase, runs/s")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--raw-seconds", type=float, default=10.0, help="both halves together")
    parser.add_argument("--raw-connections", type=int, default=8)
    parser.add_argument(
        "--repeats", type=int, default=3, help="throughput, memory and latency phases, each"
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="PostgreSQL with fsync, synchronous_commit and full_page_writes on",
    )
    parser.add_argument(
        "--waiting-runs",
        type=int,
        default=100_000,
        help="waiting runs seeded by the scale phase (0 skips it)",
    )
    parser.add_argument(
        "--state", type=Path, default=STATE, help="state and logs (replaced at every run)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.waiting_runs < 0:
        parser.error("--waiting-runs must not be negative")
    args.state = args.state.resolve()
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``make bench``."""
    args = parse_args(argv)
    fresh_state(args.state)
    load_before = os.getloadavg()
    print(
        f"bench: starting PostgreSQL (TLS, durable={args.durable}) and the local stack "
        f"in {args.state}",
        flush=True,
    )
    server, stack = build_stack(args.state, args.durable)
    try:
        bench = Bench(server, stack, args)
        results = asyncio.run(measure_all(bench, args))
    finally:
        stack.stop()
        server.stop()
    raw: RawResult = results.pop("raw_result")
    results["raw"] = {
        **asdict(raw),
        "per_second": raw.per_second,
        "cpu_seconds": results.pop("raw_cpu"),
        "note": scratch_owner_note(),
        "database": RAW_DATABASE,
    }
    results["median"] = medians(results["repeats"], raw.per_second)
    results["settings"] = {
        "runs": args.runs,
        "repeats": args.repeats,
        "start_concurrency": args.start_concurrency,
        "rate": args.rate,
        "latency_seconds": args.latency_seconds,
        "raw_seconds": args.raw_seconds,
        "raw_connections": args.raw_connections,
        "waiting_runs": args.waiting_runs,
        "durable": args.durable,
    }
    results["machine"] = {
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "postgres_durable": args.durable,
    }
    results["goals"] = goal_verdicts(results)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    print(f"bench: results written to {args.out}")


if __name__ == "__main__":
    main()
