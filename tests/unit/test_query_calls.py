"""Product code runs a named query only through its typed call in core/db/statements.py.

mypy checks each call's name, keywords and types against the generated module; this walks
the source of every product module for the other ways a query could still be run and
refuses them: indexing the queries (``store.queries["run_read"]``, ``load()["…"]``),
rendering a query with identifiers by hand, running a query's text read with
``query_text``, or running SQL written in Python. Only the loader and the generated module
index the queries; the schema's own files (schema.sql, transitions.sql) are run whole by
core/db/schema.py, which is none of these.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("admission", "auditd", "cli", "core", "dispatcher", "gateway", "recovery")
# The loader and the generated calls are where the queries are indexed.
ALLOWED = {ROOT / "core" / "db" / "queries.py", ROOT / "core" / "db" / "statements.py"}
RUNS = frozenset({"execute", "fetch", "fetchrow", "fetchval", "executemany", "prepare"})
QUERY_NAMES = frozenset({"q", "queries"})
QUERY_ATTRIBUTES = frozenset({"queries", "_queries"})


def _called_name(node: ast.Call) -> str:
    called = node.func
    return called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")


def _is_queries(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in QUERY_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in QUERY_ATTRIBUTES
    if isinstance(node, ast.Call):
        return _called_name(node) in {"load", "Queries", "Statements"}
    return False


def _is_sql_text(node: ast.expr) -> bool:
    """A string written in Python: a literal, an f-string, a sum or ``.format`` of them."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, ast.BinOp):
        return _is_sql_text(node.left) or _is_sql_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "format" and _is_sql_text(node.func.value)
    return False


def check_source(source: str, origin: str) -> list[str]:
    """What one module does that runs a query other than by its typed call."""
    problems: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, origin)):
        line = getattr(node, "lineno", 0)
        where = f"{origin}:{line}"
        if isinstance(node, ast.Subscript) and _is_queries(node.value):
            problems.append((line, f"{where}: indexes the queries; call the query's typed call"))
        elif isinstance(node, ast.Call) and _called_name(node) == "with_identifiers":
            problems.append((line, f"{where}: renders identifiers by hand; use the typed call"))
        elif isinstance(node, ast.Call) and _called_name(node) in RUNS and node.args:
            query = node.args[0]
            if _is_sql_text(query):
                problems.append(
                    (line, f"{where}: runs SQL written in Python; name it in a .sql file")
                )
            elif isinstance(query, ast.Call) and _called_name(query) == "query_text":
                problems.append(
                    (line, f"{where}: runs a query's text; call the query's typed call")
                )
    return [problem for _, problem in sorted(problems)]


def test_product_code_runs_queries_only_through_their_typed_calls() -> None:
    problems: list[str] = []
    modules = 0
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in ALLOWED or "_pb2" in path.name:
                continue
            modules += 1
            problems += check_source(path.read_text("utf-8"), str(path.relative_to(ROOT)))
    assert modules > 100, "the walk no longer finds the product's modules"
    assert problems == []


def test_the_check_reports_each_other_way_of_running_a_query() -> None:
    source = (
        "async def f(conn, store, queries):\n"
        '    await conn.fetchrow(store.queries["run_read"], "run")\n'
        '    await conn.execute(queries.with_identifiers("role_create", role="x"))\n'
        '    await conn.fetchval("SELECT current_user")\n'
        '    await conn.execute(f"SELECT {1}")\n'
        '    await conn.execute(query_text("role_set"), "r")\n'
        '    sql = load()["grants_reset"]\n'
        '    await store.queries.run_read(conn, run_id="run")\n'
        "    await conn.execute(render_schema(store.namespace))\n"
        "    await call.execute(env, claimed)\n"
    )
    assert check_source(source, "probe.py") == [
        "probe.py:2: indexes the queries; call the query's typed call",
        "probe.py:3: renders identifiers by hand; use the typed call",
        "probe.py:4: runs SQL written in Python; name it in a .sql file",
        "probe.py:5: runs SQL written in Python; name it in a .sql file",
        "probe.py:6: runs a query's text; call the query's typed call",
        "probe.py:7: indexes the queries; call the query's typed call",
    ]
