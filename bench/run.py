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
5. scale (see :mod:`bench.scale`): the quiet-VACUUM state (VACUUM ANALYZE while no run is
   live), a burst of ``--burst-runs`` runs before seeding, then for each size of
   ``--waiting-runs`` that many waiting runs seeded with SQL and another burst; after each
   burst the dispatcher's RSS, one claim's, one settle's and one lease sweep's buffers and
   time, and doctor's time through the API;
6. the run list at scale (see :mod:`bench.listing`): ``--held-runs`` runs held for an
   operator seeded among the largest size's waiting runs, then one page of ``GET /v1/runs``
   per filter, checked against SQL and timed, before and after ``ANALYZE``.

The stand-in is reached over plain HTTP unless ``--products-tls`` is given: then it serves
HTTPS with a certificate from a private root made for the run, and the runtime file's
connections name that root with ``trustedRootCertificateRef`` (see :mod:`bench.products`).
The report's header says which mode ran, and its last lines what the stand-in served, by
scheme, and on how many connections.

Every wait for runs to end polls the database for those runs only, by primary key: a count
over the whole run table cost 30–110 ms with 100,000 runs waiting, every 20 ms, and
disturbed what it measured.

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
import yaml

from bench.listing import list_at_scale
from bench.procs import CpuMeter, Memory, component_processes, memory, rss_mib
from bench.products import PLAIN, TLS, client_verify, make_tls, served, start_products, use_https
from bench.profile import Profiler, profile_text
from bench.raw import RawResult, measure, scratch_owner_note
from bench.report import (
    POSTGRES_SETTINGS,
    STEPS_PER_RUN,
    goal_verdicts,
    medians,
    percentiles,
    report,
)
from bench.scale import SHAPE, Scale, SizeResult, parse_sizes
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
SCALE_BURST_TIMEOUT = 60.0
POLL_SECONDS = 0.02
DOCTOR_CALLS = 3
STATS_SETTLE_SECONDS = 1.5


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Started:
    """Starts sent through the API: the run ids answered, each with the client's wall-clock
    send instant."""

    sent: dict[str, float]
    errors: int
    seconds: float
    """From the first send until every start was answered."""

    @property
    def ids(self) -> list[str]:
        return list(self.sent)


@dataclass(frozen=True)
class Throughput:
    runs: int
    seconds: float
    starts_seconds: float
    db_span_seconds: float
    succeeded: int
    start_errors: int
    commits_per_run: float
    poll_ms: dict[str, float]
    """The completion poll's own duration (p50, max) and how many polls it took."""

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


# ------------------------------------------------------------------------------ the stack


def build_stack(
    state: Path, durable: bool, products_tls: bool = False, statement_statistics: bool = False
) -> tuple[PostgresServer, LocalStack]:
    """PostgreSQL under ``state`` (``durable`` as asked), the issuer, the Messaging stand-in
    (over HTTPS with a private root made for this run when ``products_tls``, see
    :mod:`bench.products`), the deployment applied with the real ``coordinatorctl``, and
    the all-in-one coordinator, ready."""
    built = build_package(WORKFLOW_SOURCE, state / "packages")
    server = PostgresServer.start(
        state / "postgres", durable=durable, statement_statistics=statement_statistics
    )
    stack: LocalStack | None = None
    try:
        stack = LocalStack.prepare(
            state / "stack", packages=[(built.path, built.digest)], database=server.default
        )
        tls = make_tls(state / "products-tls") if products_tls else None
        if tls is not None:
            use_https(stack, tls)
        start_products(stack, tls)
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
        operator_file = stack.mint("operator", "bench-operator", args.state / "operator-token")
        self.operator_token = operator_file.read_text().strip()
        self.messaging = stack.product_urls["messaging"]
        self.verify = client_verify(stack)
        self.db: asyncpg.Connection | None = None
        self.own_queries = 0

    async def open(self) -> None:
        self.db = await self.connect()

    async def connect(self) -> asyncpg.Connection:
        """A new connection to the coordinator's database as the migration role."""
        handle = self.server.default
        return await connect(handle.migration_url, handle.ca_pem, label="bench database")

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

    async def ended_of(self, ids: list[str]) -> set[str]:
        """Which of the runs ``ids`` have ended: one look-up by primary key each, so the
        cost follows the runs asked about, never the size of the run table."""
        assert self.db is not None
        self.own_queries += 1
        rows = await self.db.fetch(
            self.sql("SELECT id FROM {ns}.run WHERE id = ANY($1::text[]) AND ended_at IS NOT NULL"),
            ids,
        )
        return {str(row["id"]) for row in rows}

    async def wait_ended(self, ids: list[str], timeout: float) -> dict[str, float]:
        """Poll the database every 20 ms until every run of ``ids`` has ended, asking only
        about those not seen ended yet; answers the polls' own cost (p50 and max ms, and
        how many). Raises ``TimeoutError`` after ``timeout`` seconds."""
        pending = list(ids)
        spent: list[float] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"only {len(ids) - len(pending)} of {len(ids)} runs ended in {timeout:.0f} s"
                )
            began = time.perf_counter()
            ended = await self.ended_of(pending)
            spent.append((time.perf_counter() - began) * 1000)
            pending = [run for run in pending if run not in ended]
            if pending:
                await asyncio.sleep(POLL_SECONDS)
        found = percentiles(spent)
        return {"p50": found["p50"], "max": found["max"], "polls": float(len(spent))}

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
        started = await self.start_many(WARM_UP_RUNS, 4, "warm")
        await self.wait_ended(started.ids, timeout=60)

    async def start_many(self, runs: int, concurrency: int, label: str) -> Started:
        """``runs`` starts as fast as answered, at most ``concurrency`` in flight."""
        gate = asyncio.Semaphore(concurrency)
        errors = 0
        sent: dict[str, float] = {}

        async def one(client: aiohttp.ClientSession, index: int) -> None:
            nonlocal errors
            async with gate:
                wall = time.time()
                run_id, _ = await self.start(client, f"{label}-{index}")
            if run_id is None:
                errors += 1
            else:
                sent[run_id] = wall

        began = time.monotonic()
        async with self.client(concurrency) as client:
            await asyncio.gather(*(one(client, i) for i in range(runs)))
        return Started(sent=sent, errors=errors, seconds=time.monotonic() - began)

    async def throughput(self, runs: int) -> Throughput:
        """``runs`` starts, at most ``--start-concurrency`` in flight, timed until all have
        ended."""
        await asyncio.sleep(STATS_SETTLE_SECONDS)
        commits_before = await self.commits()
        own_before = self.own_queries
        began = time.monotonic()
        started = await self.start_many(runs, self.args.start_concurrency, "t")
        ids = started.ids
        polls = await self.wait_ended(ids, timeout=max(120.0, runs * 0.5))
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
            starts_seconds=started.seconds,
            db_span_seconds=float(row["span"]),
            succeeded=int(row["succeeded"]),
            start_errors=started.errors,
            commits_per_run=await self._commits_since(commits_before, own_before) / len(ids),
            poll_ms=polls,
        )

    async def burst(self, runs: int) -> dict[str, Any]:
        """``runs`` starts, at most ``--start-concurrency`` in flight, timed until all have
        ended, with each run's send → the stand-in's acceptance of its first command (under
        that load). Raises ``TimeoutError`` when they do not end in time."""
        began = time.monotonic()
        started = await self.start_many(runs, self.args.start_concurrency, "b")
        polls = await self.wait_ended(started.ids, timeout=SCALE_BURST_TIMEOUT)
        elapsed = time.monotonic() - began
        to_accepted, _ = await self.first_commands(started.sent)
        return {
            "runs": len(started.sent),
            "start_errors": started.errors,
            "seconds": round(elapsed, 3),
            "runs_per_second": len(started.sent) / elapsed,
            "send_to_accepted_ms": percentiles(to_accepted),
            "poll_ms": polls,
        }

    async def _commits_since(self, before: int, own_before: int) -> float:
        # The coordinator is idle again: wait for its last counts to be published, then
        # leave out this client's own polling queries (each its own transaction).
        await asyncio.sleep(STATS_SETTLE_SECONDS)
        own = self.own_queries - own_before + 1
        return float(await self.commits() - before - own)

    async def latency(self, rate: float, seconds: float, label: str = "l") -> Latency:
        """Starts paced open-loop at ``rate`` runs/s for ``seconds``; start → first command
        of each, two ways (see the module's docstring)."""
        count = int(rate * seconds)
        sent: dict[str, float] = {}
        answered: list[float] = []
        lags: list[float] = []
        errors = 0

        async def one(client: aiohttp.ClientSession, index: int) -> None:
            nonlocal errors
            wall = time.time()
            run_id, elapsed = await self.start(client, f"{label}-{index}")
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
        await self.wait_ended(list(sent), timeout=120)
        to_accepted, to_prepared = await self.first_commands(sent)
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

    async def first_commands(self, sent: dict[str, float]) -> tuple[list[float], list[float]]:
        """For the ended runs ``sent`` (run id → client send instant): send → the stand-in's
        ``acceptedAt`` of the first command, and ``run.created_at`` → the first call step's
        ``prepared_at``, in ms."""
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
        return to_accepted, to_prepared

    async def doctor(self) -> tuple[list[float], int | None]:
        """``GET /v1/operator/doctor`` :data:`DOCTOR_CALLS` times with an operator token, on
        one connection: each answer's ms, and the runs waiting the last one reported."""
        spent: list[float] = []
        waiting: int | None = None
        async with self.client(1) as client:
            for _ in range(DOCTOR_CALLS):
                began = time.perf_counter()
                async with client.get(
                    f"{self.stack.url}/v1/operator/doctor",
                    headers={"Authorization": f"Bearer {self.operator_token}"},
                ) as answer:
                    body = await answer.read()
                spent.append(round((time.perf_counter() - began) * 1000, 2))
                if answer.status != 200:
                    sys.stderr.write(f"bench: doctor answered {answer.status}\n")
                    waiting = None
                else:
                    waiting = int(json.loads(body)["state"]["waiting"])
        return spent, waiting

    async def accepted_by_key(self) -> dict[str, float]:
        """The stand-in's acceptance instant of every command, by idempotency key.

        ``/dev/stats`` lists processed keys and answers in the same first-processed order
        (both come from one ledger insert per key), so they pair up one to one.
        """
        async with httpx.AsyncClient(timeout=30.0, verify=self.verify) as client:
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
        async with httpx.AsyncClient(timeout=30.0, verify=self.verify) as client:
            stats = (await client.get(self.messaging + "/dev/stats")).json()
        processed: dict[str, int] = stats["processed"]
        return len(processed), sum(1 for n in processed.values() if n > 1)


# ------------------------------------------------------------------------------ phases


async def one_repeat(bench: Bench, args: argparse.Namespace, index: int) -> dict[str, Any]:
    """Throughput, memory, latency and peak memory once; the repeat's figures."""
    print(f"bench: repeat {index}: throughput, {args.runs} runs", flush=True)
    launcher = bench.stack.processes["coordinator"].pid
    profiler = None
    if args.profile is not None and index == 1:
        database = bench.server.default.database
        profiler = Profiler(
            args.profile,
            bench.server,
            database,
            component_processes(launcher),
            native=args.profile_native,
        )
        await profiler.begin()
    meter = CpuMeter(bench.server, bench.stack)
    meter.start()
    through = await bench.throughput(args.runs)
    cpu = meter.stop()
    profiled = None if profiler is None else await profiler.end(args.runs)
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
        **({"profile": profiled} if profiled is not None else {}),
    }


async def scale_phase(bench: Bench, sizes: list[int], runs: int) -> tuple[dict[str, Any], Scale]:
    """The quiet-VACUUM state, then a burst of ``runs`` before seeding and after seeding
    each of ``sizes`` waiting runs (cumulatively), each burst followed by its readings.
    Answers the phase's record and its seeded state (for :func:`bench.listing.list_at_scale`)."""
    assert bench.db is not None
    scale = Scale(bench.db, bench.namespace, bench.connect)
    dispatcher = component_processes(bench.stack.processes["coordinator"].pid)["dispatcher"]
    print("bench: scale: VACUUM ANALYZE with no run live (the quiet-VACUUM state)", flush=True)
    vacuum = await scale.quiet_vacuum()
    if vacuum.live_runs:
        sys.stderr.write(f"bench: scale: {vacuum.live_runs} runs were live at the VACUUM\n")
    before = await measure_size(bench, scale, dispatcher, 0, runs)
    if before.burst is None:
        raise RuntimeError("the scale phase's first burst did not end; no waiting runs yet")
    after = [await measure_size(bench, scale, dispatcher, size, runs) for size in sizes]
    found = {
        "burst_runs": runs,
        "rate": bench.args.rate,
        "shape": SHAPE,
        "quiet_vacuum": asdict(vacuum),
        "before": before.to_json(),
        "sizes": [size.to_json() for size in after],
    }
    return found, scale


async def measure_size(
    bench: Bench, scale: Scale, dispatcher: int, size: int, runs: int
) -> SizeResult:
    """Seed up to ``size`` waiting runs (none for 0), then a burst of ``runs`` runs, the
    same number paced at ``--rate``, and the readings."""
    seconds: dict[str, float] = {}
    began = time.monotonic()
    seeded = size - scale.seeded if size else 0
    seed_seconds = 0.0
    if size:
        print(f"bench: scale: seeding {seeded:,} waiting runs (to {size:,})", flush=True)
        seed_seconds = await scale.seed(size)
        print(f"bench: scale: seeded in {seed_seconds:.1f} s", flush=True)
    waiting = await scale.waiting()
    mark = time.monotonic()
    where = f"{waiting:,} waiting runs"
    print(f"bench: scale: {where}: burst of {runs} runs, then {runs} at {bench.args.rate:.0f}/s",
          flush=True)  # fmt: skip
    burst: dict[str, Any] | None
    paced: dict[str, Any] | None = None
    # A dispatcher that stops with many runs waiting is the finding here, not a reason to
    # lose every figure measured so far: give up on the burst and say so.
    try:
        burst = await bench.burst(runs)
    except TimeoutError as exc:
        sys.stderr.write(f"bench: scale: {where}: burst: {exc}\n")
        burst = None
    seconds["burst"] = round(time.monotonic() - mark, 2)
    mark = time.monotonic()
    if burst is not None:
        try:
            lat = await bench.latency(bench.args.rate, runs / bench.args.rate, label="p")
            paced = {
                "runs": lat.runs,
                "offered_rate": lat.offered_rate,
                "achieved_rate": lat.achieved_rate,
                "send_to_accepted_ms": lat.send_to_accepted_ms,
                "created_to_prepared_ms": lat.created_to_prepared_ms,
            }
        except TimeoutError as exc:
            sys.stderr.write(f"bench: scale: {where}: paced runs: {exc}\n")
    seconds["paced"] = round(time.monotonic() - mark, 2)
    mark = time.monotonic()
    rss = rss_mib(dispatcher)
    claim = await scale.claim_cost()
    # A run in the middle of the seeded ones.
    settle = await scale.settle_cost((size + 1) // 2) if size else None
    sweep = await scale.sweep_cost()
    doctor_ms, doctor_waiting = await bench.doctor()
    untouched = await scale.analysed() == scale.analysed_at_vacuum
    seconds["readings"] = round(time.monotonic() - mark, 2)
    seconds["total"] = round(time.monotonic() - began, 2)
    return SizeResult(
        size=size,
        waiting_runs=waiting,
        seeded=seeded,
        seed_seconds=round(seed_seconds, 2),
        burst=burst,
        paced=paced,
        rss_mib=rss,
        claim=claim,
        settle=settle,
        sweep=sweep,
        doctor_ms=doctor_ms,
        doctor_waiting=doctor_waiting,
        statistics_untouched=untouched,
        seconds=seconds,
    )


async def measure_all(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    timings: dict[str, float] = {}
    mark = time.monotonic()

    def took(phase: str) -> None:
        nonlocal mark
        timings[phase] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()

    await bench.open()
    try:
        settings = await bench.postgres_settings()
        raw_db = await bench.server.acreate_database(RAW_DATABASE)
        raw_halves = [await raw_rate(bench, raw_db, args)]
        took("raw rate, first half")
        print("bench: warming up", flush=True)
        await bench.warm_up()
        took("warm-up")
        repeats = []
        for i in range(args.repeats):
            repeats.append(await one_repeat(bench, args, i + 1))
            took(f"repeat {i + 1}")
        raw_halves.append(await raw_rate(bench, raw_db, args))
        took("raw rate, second half")
        processed, twice = await bench.processed_twice()
        scale = None
        if args.waiting_runs:
            scale, seeded = await scale_phase(bench, args.waiting_runs, args.burst_runs)
            took("scale")
            if args.held_runs:
                scale["list_at_scale"] = await list_at_scale(
                    seeded, bench.stack.url, bench.operator_token, WORKFLOW, args.held_runs
                )
                took("list at scale")
    finally:
        await bench.close()
    return {
        "postgres": settings,
        "repeats": repeats,
        "commands": {"processed": processed, "twice": twice},
        "scale": scale,
        "timings": timings,
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


def products_seen(stack: LocalStack, mode: str) -> dict[str, Any]:
    """How the products were reached: the mode, each connection's base URL and private root
    as the runtime file the coordinator ran with names them, and what the Messaging
    stand-in counted it served over the whole bench (requests by scheme, connections)."""
    document = yaml.safe_load(stack.runtime_file.read_text(encoding="utf-8"))
    return {
        "mode": mode,
        "connections": {
            name: {
                "baseUrl": connection["baseUrl"],
                "trustedRootCertificateRef": connection.get("trustedRootCertificateRef"),
            }
            for name, connection in document["connections"].items()
        },
        "messaging": served(stack, "messaging"),
    }


def fresh_state(state: Path) -> None:
    """Empty ``state`` for this run: a folder an earlier bench made (it holds the mark
    file), an empty one, or a new one; anything else is refused rather than deleted."""
    if state.exists():
        if not (state / STATE_MARK).exists() and any(state.iterdir()):
            raise SystemExit(f"bench: {state} is not empty and not a bench state folder")
        shutil.rmtree(state)
    state.mkdir(parents=True)
    (state / STATE_MARK).write_text("made by bench.run; replaced at every run\n")


def sizes(text: str) -> list[int]:
    """``--waiting-runs`` for argparse (see :func:`bench.scale.parse_sizes`)."""
    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        "--products-tls",
        action="store_true",
        help="the stand-ins serve HTTPS with a certificate from a private root made for the "
        "run, which each connection names with trustedRootCertificateRef",
    )
    parser.add_argument(
        "--waiting-runs",
        type=sizes,
        default="100000,1000000",
        help="the scale phase's sizes, seeded cumulatively: comma-separated, increasing "
        "(0 skips the phase)",
    )
    parser.add_argument(
        "--burst-runs",
        type=int,
        default=200,
        help="runs of each scale burst (and as many paced at --rate after it)",
    )
    parser.add_argument(
        "--held-runs",
        type=int,
        default=10_000,
        help="runs held with attention seeded after the largest scale size, among which "
        "GET /v1/runs is timed per filter (0 skips it)",
    )
    parser.add_argument(
        "--state", type=Path, default=STATE, help="state and logs (replaced at every run)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile the first throughput phase into DIR: PostgreSQL per statement "
        "(pg_stat_statements) and each component by function (py-spy); see bench/profile.py",
    )
    parser.add_argument(
        "--profile-native",
        action="store_true",
        help="with --profile: sample the components' C frames too (py-spy --native)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.burst_runs < 1:
        parser.error("--burst-runs must be at least 1")
    if args.held_runs < 0:
        parser.error("--held-runs must be 0 or more")
    args.state = args.state.resolve()
    if args.profile is not None:
        args.profile = args.profile.resolve()
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``make bench``."""
    args = parse_args(argv)
    fresh_state(args.state)
    load_before = os.getloadavg()
    began = time.monotonic()
    mode = TLS if args.products_tls else PLAIN
    print(
        f"bench: starting PostgreSQL (TLS, durable={args.durable}) and the local stack "
        f"(products: {mode}) in {args.state}",
        flush=True,
    )
    server, stack = build_stack(
        args.state, args.durable, args.products_tls, statement_statistics=args.profile is not None
    )
    stack_seconds = time.monotonic() - began
    try:
        bench = Bench(server, stack, args)
        results = asyncio.run(measure_all(bench, args))
        results["products"] = products_seen(stack, mode)
    finally:
        stack.stop()
        server.stop()
    results["timings"] = {
        "stack start": round(stack_seconds, 1),
        **results["timings"],
        "whole bench": round(time.monotonic() - began, 1),
    }
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
        "burst_runs": args.burst_runs,
        "held_runs": args.held_runs,
        "durable": args.durable,
        "products_tls": args.products_tls,
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
    profiled = results["repeats"][0].get("profile")
    if profiled is not None:
        print("\n".join(profile_text(profiled)))
    print(f"bench: results written to {args.out}")


if __name__ == "__main__":
    main()
