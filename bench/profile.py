"""``make bench``'s ``--profile DIR``: where the time of a throughput phase goes (issue 43).

Over the first repeat's throughput phase:

- **PostgreSQL, per statement.** The server runs with pg_stat_statements preloaded, counting
  the statements inside the transition functions too (``pg_stat_statements.track = all``);
  its counters are reset as the phase begins and read as it ends. ``statements.json`` holds
  every statement with more than a trace of time; ``statements.txt`` the top ones by total
  time, per run: calls, milliseconds, rows and shared buffers (hit, read, dirtied).
- **Our processes, by function.** ``py-spy record`` samples each coordinator component
  (dispatcher, gateway, admission, auditd, recovery) at 200 Hz without stopping it, and
  writes its collapsed stacks to ``<component>.stacks``; ``<component>.txt`` lists the
  functions with the most samples, where they were running (self) and under them (total).
  With ``--profile-native`` the C frames are sampled too: without them, time spent in C
  (gRPC's core, asyncpg's protocol, TLS, the event loop) shows as the Python frame above it.
  Native frames can only be read from a paused process, so that mode pauses each component
  for every sample and slows it more.
- **PostgreSQL, by C function.** Where ``perf`` is on the path and may sample the whole
  machine (root, or ``kernel.perf_event_paranoid`` at most 0), ``perf record`` samples every
  CPU at 299 Hz with DWARF call stacks, and the samples of processes named ``postgres``
  become ``postgres.stacks`` (collapsed, as py-spy's) and ``postgres.txt``: the server's
  functions by samples where they ran and by samples under them. The second ranking is the
  one that finds work a statement does before it runs: PostgreSQL rebuilding each CHECK
  expression from its stored text for every statement that writes the table showed as 24 %
  of the backends' samples under ``ExecConstraints``, which no statement counter can show.
  ``postgres.perf.data`` stays for ``perf report -i``. Without perf the profile says so and
  goes on.

A profiled run costs more than a plain one (the sampling, the statement counters): its
figures are for finding where the time goes, never for comparing with another run.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from devstack.postgres import PostgresServer

SAMPLE_RATE: Final = 200
"""py-spy samples per second, per process."""
COMPONENTS: Final = ("dispatcher", "gateway", "admission", "auditd", "recovery")
TOP_STATEMENTS: Final = 25
TOP_FUNCTIONS: Final = 30
TOP_SERVER_FUNCTIONS: Final = 80
"""The server's ranking by samples under a function starts with the frames every backend
has (its main loop, the portal, plpgsql's handler): it needs more lines to reach the work."""
STOP_SECONDS: Final = 30.0
PERF_RATE: Final = 299
"""perf samples per second, per CPU."""
PERF_STACK_BYTES: Final = 8192
"""Bytes of each sampled thread's stack perf copies to unwind it (DWARF)."""
POSTGRES: Final = "postgres"
"""The process name (comm) of the server and every backend."""

_STATEMENTS: Final = """
SELECT s.queryid::text AS id, s.toplevel, s.calls, s.total_exec_time, s.mean_exec_time,
       s.rows, s.shared_blks_hit, s.shared_blks_read, s.shared_blks_dirtied,
       s.shared_blks_written, s.wal_records, s.query
  FROM pg_stat_statements s
  JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = $1
 ORDER BY s.total_exec_time DESC
"""


def py_spy() -> str:
    """The py-spy executable beside this interpreter (the dev environment has it)."""
    found = Path(sys.executable).with_name("py-spy")
    if found.exists():
        return str(found)
    on_path = shutil.which("py-spy")
    if on_path is None:
        raise SystemExit("bench: --profile needs py-spy (pip install -e .[dev])")
    return on_path


@dataclass
class Profiler:
    """The profile of one phase; :meth:`begin` before it, :meth:`end` after it."""

    out: Path
    server: PostgresServer
    database: str
    components: Mapping[str, int]
    """Component name -> pid."""
    native: bool = False
    """Sample C frames too (py-spy ``--native``): gRPC's core, asyncpg's protocol, TLS and
    the event loop show by name instead of as the Python frame that called them."""
    samplers: dict[str, subprocess.Popen[bytes]] | None = None
    server_sampler: subprocess.Popen[bytes] | None = None
    server_skipped: str | None = None
    """Why PostgreSQL's functions were not sampled (no perf), when they were not."""

    async def begin(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        conn = await self.server.superuser_connect(self.database)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await conn.execute("SELECT pg_stat_statements_reset()")
        finally:
            await conn.close()
        spy = py_spy()
        self.samplers = {}
        for name in COMPONENTS:
            pid = self.components.get(name)
            if pid is None:
                continue
            self.samplers[name] = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(SAMPLE_RATE),
                    # (native frames can only be read from a paused process)
                    *(["--native"] if self.native else ["--nonblocking"]),
                    "--format",
                    "raw",
                    "--output",
                    str(self.out / f"{name}.stacks"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        self._begin_server_sampler()

    def _begin_server_sampler(self) -> None:
        perf = shutil.which("perf")
        if perf is None:
            self.server_skipped = "postgres: not sampled (perf is not on the path)"
            return
        self.server_sampler = subprocess.Popen(
            [
                perf,
                "record",
                "--all-cpus",
                "--freq",
                str(PERF_RATE),
                "--call-graph",
                f"dwarf,{PERF_STACK_BYTES}",
                "--output",
                str(self.out / "postgres.perf.data"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def _end_server_sampler(self) -> list[dict[str, Any]] | str:
        """Stop perf and write postgres.stacks and postgres.txt; the top functions by
        samples where they ran, or why there are none."""
        proc = self.server_sampler
        if proc is None:
            return self.server_skipped or "postgres: not sampled"
        proc.send_signal(signal.SIGINT)  # perf writes its file out on an interrupt
        try:
            _, err = proc.communicate(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        data = self.out / "postgres.perf.data"
        if not data.exists():
            return f"postgres: perf failed: {err.decode(errors='replace').strip()[-200:]}"
        script = subprocess.run(
            ["perf", "script", "--input", str(data), "--comm", POSTGRES, "--fields", "comm,ip,sym"],
            capture_output=True,
            timeout=600,
            check=False,
        )
        collapsed = collapse_perf_script(script.stdout.decode(errors="replace"))
        (self.out / "postgres.stacks").write_text(collapsed)
        by_self = top_functions(collapsed)
        by_total = top_functions(collapsed, rank="total", limit=TOP_SERVER_FUNCTIONS)
        (self.out / "postgres.txt").write_text(
            "\n".join(
                [
                    *function_table("postgres", by_self),
                    "",
                    *function_table("postgres, by samples under them", by_total),
                ]
            )
            + "\n"
        )
        return by_self[:5]

    async def end(self, runs: int) -> dict[str, Any]:
        """Stop the samplers, read the statements; the summary the report prints."""
        for proc in (self.samplers or {}).values():
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on an interrupt
        failed = []
        for name, proc in (self.samplers or {}).items():
            try:
                _, err = proc.communicate(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if not (self.out / f"{name}.stacks").exists():
                failed.append(f"{name}: {err.decode(errors='replace').strip()[-200:]}")
        conn = await self.server.superuser_connect(self.database)
        try:
            rows = [dict(r) for r in await conn.fetch(_STATEMENTS, self.database)]
        finally:
            await conn.close()
        statements = per_run(rows, runs)
        (self.out / "statements.json").write_text(json.dumps(statements, indent=2) + "\n")
        (self.out / "statements.txt").write_text("\n".join(statement_table(statements)) + "\n")
        functions = {}
        server = self._end_server_sampler()
        if isinstance(server, str):
            failed.append(server)
        else:
            functions[POSTGRES] = server
        for name in self.samplers or {}:
            stacks = self.out / f"{name}.stacks"
            if stacks.exists():
                top = top_functions(stacks.read_text(errors="replace"))
                (self.out / f"{name}.txt").write_text("\n".join(function_table(name, top)) + "\n")
                functions[name] = top[:5]
        return {
            "folder": str(self.out),
            "statements": statements[:TOP_STATEMENTS],
            "functions": functions,
            "sampler_failures": failed,
        }


# ------------------------------------------------------------------------------ pure parts


def per_run(rows: list[dict[str, Any]], runs: int) -> list[dict[str, Any]]:
    """pg_stat_statements rows as figures per run, the statement text shortened to one
    line; statements under a thousandth of a millisecond per run are left out."""
    out = []
    for row in rows:
        total = float(row["total_exec_time"])
        if total / runs < 0.001:
            continue
        out.append(
            {
                "id": row["id"],
                "toplevel": bool(row["toplevel"]),
                "calls_per_run": round(row["calls"] / runs, 2),
                "ms_per_run": round(total / runs, 4),
                "mean_ms": round(float(row["mean_exec_time"]), 4),
                "rows_per_run": round(row["rows"] / runs, 2),
                "buffers_per_run": {
                    "hit": round(row["shared_blks_hit"] / runs, 1),
                    "read": round(row["shared_blks_read"] / runs, 1),
                    "dirtied": round(row["shared_blks_dirtied"] / runs, 1),
                    "written": round(row["shared_blks_written"] / runs, 1),
                },
                "wal_records_per_run": round(row["wal_records"] / runs, 1),
                "query": " ".join(str(row["query"]).split())[:300],
            }
        )
    return out


def statement_table(statements: list[dict[str, Any]]) -> list[str]:
    """The top statements by time, as an aligned table (``statements.txt``)."""
    top = statements[:TOP_STATEMENTS]
    whole = sum(s["ms_per_run"] for s in statements if s["toplevel"])
    lines = [
        f"PostgreSQL time per run in top-level statements: {whole:.3f} ms "
        "(nested ones are inside it, marked ' ')",
        f"{'ms/run':>8} {'calls':>6} {'mean ms':>8} {'rows':>6} {'hit':>7} {'dirtied':>7}"
        "  statement",
    ]
    for s in top:
        mark = "*" if s["toplevel"] else " "
        buffers = s["buffers_per_run"]
        lines.append(
            f"{s['ms_per_run']:>8.3f} {s['calls_per_run']:>6.2f} {s['mean_ms']:>8.4f} "
            f"{s['rows_per_run']:>6.2f} {buffers['hit']:>7.1f} {buffers['dirtied']:>7.1f} "
            f"{mark} {s['query'][:110]}"
        )
    return lines


IDLE: Final = frozenset(
    {
        "epoll_wait",
        "epoll_pwait",
        "poll",
        "ppoll",
        "select",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "sem_timedwait",
        "nanosleep",
        "clock_nanosleep",
    }
)
"""Native leaf frames of a thread waiting for work (``--profile-native`` samples them, since
a paused process's waiting threads are not told apart): left out of the counts."""


def top_functions(
    collapsed: str, rank: Literal["self", "total"] = "self", limit: int = TOP_FUNCTIONS
) -> list[dict[str, Any]]:
    """From collapsed stacks (``frame;frame;… count`` per line, py-spy's or
    :func:`collapse_perf_script`'s), the functions by samples: ``self`` where they were
    running, ``total`` anywhere on the stack, ranked by ``rank``. Samples of a thread waiting
    in the kernel for work (:data:`IDLE`) are left out; the first ``limit`` are answered."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        if frames[-1].split(" (", 1)[0] in IDLE:
            continue
        count = int(count_text)
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            under[frame] += count
    if samples == 0:
        return []
    return [
        {
            "function": name,
            "self_percent": round(100.0 * own[name] / samples, 1),
            "total_percent": round(100.0 * under[name] / samples, 1),
        }
        for name, _ in (own if rank == "self" else under).most_common(limit)
    ]


def collapse_perf_script(text: str, comm: str = POSTGRES) -> str:
    """``perf script --fields comm,ip,sym`` output (a line naming the process, then one
    line per frame, innermost first, then a blank line) as collapsed stacks, outermost
    frame first, of the samples of processes named ``comm``; identical stacks are counted
    once with their number. An address without a symbol is ``[unknown]``."""
    counts: Counter[str] = Counter()
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if len(lines) < 2 or lines[0].split()[0] != comm:
            continue
        frames = []
        for line in lines[1:]:
            parts = line.split(None, 1)
            symbol = parts[1] if len(parts) == 2 else "[unknown]"
            frames.append(symbol.split(" (", 1)[0].split("+0x", 1)[0].strip() or "[unknown]")
        counts[";".join(reversed(frames))] += 1
    return "".join(f"{stack} {count}\n" for stack, count in counts.items())


def function_table(component: str, top: list[dict[str, Any]]) -> list[str]:
    lines = [f"{component}: functions by samples where they ran (self) and under them (total)"]
    lines.append(f"{'self %':>7} {'total %':>7}  function")
    for entry in top:
        lines.append(
            f"{entry['self_percent']:>7.1f} {entry['total_percent']:>7.1f}  {entry['function']}"
        )
    return lines


def profile_text(summary: Mapping[str, Any]) -> list[str]:
    """The report's lines of a profiled run: the five costliest statements and functions."""
    lines = [f"profile: written to {summary['folder']} (figures of a profiled run: not comparable)"]
    for s in summary["statements"][:5]:
        lines.append(
            f"  {s['ms_per_run']:.3f} ms/run, {s['calls_per_run']:.2f} calls/run: {s['query'][:80]}"
        )
    for name, top in summary["functions"].items():
        if top:
            first = top[0]
            lines.append(
                f"  {name}: most samples in {first['function'][:70]} ({first['self_percent']} %)"
            )
    for failure in summary["sampler_failures"]:
        lines.append(f"  sampler failed: {failure}")
    return lines
