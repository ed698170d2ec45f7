"""The pure parts of ``make bench --profile`` (bench/profile.py): statements per run and
functions by samples."""

from __future__ import annotations

from bench.profile import (
    collapse_perf_script,
    function_table,
    per_run,
    statement_table,
    top_functions,
)


def _row(query: str, calls: int, total: float, *, toplevel: bool = True) -> dict[str, object]:
    return {
        "id": "1",
        "toplevel": toplevel,
        "calls": calls,
        "total_exec_time": total,
        "mean_exec_time": total / calls,
        "rows": calls,
        "shared_blks_hit": 40 * calls,
        "shared_blks_read": 0,
        "shared_blks_dirtied": calls,
        "shared_blks_written": 0,
        "wal_records": 3 * calls,
        "query": query,
    }


def test_statements_are_counted_per_run_and_a_trace_is_left_out() -> None:
    rows = [
        _row("SELECT step_settle($1,\n   $2)", 200, 500.0),
        _row("INSERT INTO step VALUES ($1)", 200, 100.0, toplevel=False),
        _row("SELECT 1", 1, 0.05),
    ]
    figures = per_run(rows, 100)
    assert [f["query"] for f in figures] == [
        "SELECT step_settle($1, $2)",
        "INSERT INTO step VALUES ($1)",
    ]
    first = figures[0]
    assert (first["calls_per_run"], first["ms_per_run"], first["mean_ms"]) == (2.0, 5.0, 2.5)
    assert first["buffers_per_run"] == {"hit": 80.0, "read": 0.0, "dirtied": 2.0, "written": 0.0}
    table = statement_table(figures)
    # Only top-level statements add up: a nested one is inside its caller's time.
    assert table[0].startswith("PostgreSQL time per run in top-level statements: 5.000 ms")
    assert table[2].split()[:2] == ["5.000", "2.00"] and " * SELECT step_settle" in table[2]
    assert "   INSERT INTO step" in table[3]


def test_functions_are_ranked_by_samples_where_they_ran_and_under_them() -> None:
    collapsed = "\n".join(
        [
            "main (a.py:1);run (a.py:5);settle (b.py:9) 6",
            "main (a.py:1);run (a.py:5);derive (c.py:2) 3",
            "main (a.py:1);idle (a.py:7) 1",
            "main (a.py:1);run_forever (base_events.py:9);epoll_wait (libc.so.6) 40",
            "not a sample line",
        ]
    )
    top = top_functions(collapsed)
    assert top[0] == {"function": "settle (b.py:9)", "self_percent": 60.0, "total_percent": 60.0}
    assert top[1]["function"] == "derive (c.py:2)" and top[1]["self_percent"] == 30.0
    assert top_functions("") == []
    lines = function_table("dispatcher", top)
    assert lines[2].split() == ["60.0", "60.0", "settle", "(b.py:9)"]


PERF_SCRIPT = """postgres
\t    55d0c6a1b2c3 ExecInterpExpr
\t    55d0c6a1b2c4 ExecConstraints+0x1f
\t    55d0c6a1b2c5 PostgresMain (/usr/lib/postgresql/bin/postgres)

python3
\t    7f00000000aa _PyEval_EvalFrameDefault

postgres
\t    55d0c6a1b2c6 pg_strtok
\t    55d0c6a1b2c7 ExecConstraints
\t    55d0c6a1b2c8 PostgresMain

postgres
\t    55d0c6a1b2c3 ExecInterpExpr
\t    55d0c6a1b2c4 ExecConstraints
\t    55d0c6a1b2c5 PostgresMain

postgres
\t    ffffffff8100
\t    55d0c6a1b2c9 epoll_wait
\t    55d0c6a1b2ca PostgresMain
"""


def test_perf_samples_of_the_server_are_collapsed_and_ranked_by_self_and_by_total() -> None:
    collapsed = collapse_perf_script(PERF_SCRIPT)
    # Only the server's samples, outermost frame first, offsets and libraries dropped,
    # identical stacks counted once.
    assert collapsed.splitlines() == [
        "PostgresMain;ExecConstraints;ExecInterpExpr 2",
        "PostgresMain;ExecConstraints;pg_strtok 1",
        "PostgresMain;epoll_wait;[unknown] 1",
    ]
    by_self = top_functions(collapsed)
    assert [(f["function"], f["self_percent"]) for f in by_self[:2]] == [
        ("ExecInterpExpr", 50.0),
        ("pg_strtok", 25.0),
    ]
    by_total = top_functions(collapsed, rank="total")
    assert [(f["function"], f["total_percent"]) for f in by_total[:2]] == [
        ("PostgresMain", 100.0),
        ("ExecConstraints", 75.0),
    ]
    assert collapse_perf_script("") == ""
