"""Every named query the product runs exists and is given as many arguments as it takes.

mypy refuses an unknown literal name wherever the lookup is typed; this walks the source of
every product module for the calls that run a query, typed or not, such as
``conn.fetchrow(self.store.queries["run_read"], run_id)``, and checks the name against
``core/db/query_names.py``: the positional arguments after the query must number its
highest ``$n``, and a query with ``{{word}}`` placeholders must be rendered by
``with_identifiers`` with exactly those words. A call that runs SQL written in Python is
refused too: every statement lives in a named query.

What counts as the named queries is what the code uses: ``load()``, ``Queries(...)``, a
name ``q`` or ``queries``, or an attribute ``.queries`` / ``._queries`` (``store.queries``,
``self._queries``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from core.db import query_names

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("admission", "auditd", "cli", "core", "dispatcher", "gateway", "recovery")
# The loader itself looks queries up by a variable name.
LOADER = ROOT / "core" / "db" / "queries.py"
RUNS = frozenset({"execute", "fetch", "fetchrow", "fetchval", "executemany"})
QUERY_NAMES = frozenset({"q", "queries"})
QUERY_ATTRIBUTES = frozenset({"queries", "_queries"})
# The generated tables, by plain name: the walk meets names as text.
PARAMETERS: dict[str, int] = dict(query_names.PARAMETERS.items())
IDENTIFIERS: dict[str, tuple[str, ...]] = dict(query_names.IDENTIFIERS.items())
# Calls whose arguments are unpacked (*args) cannot be counted; a few are tolerated.
UNCOUNTED_ALLOWED = 5
# Fewer checked calls than this means the walk no longer recognises the code's patterns.
CHECKED_AT_LEAST = 100


@dataclass
class Findings:
    """What the walk saw: the problems, how many calls it checked and could not count."""

    problems: list[str] = field(default_factory=list)
    checked: int = 0
    uncounted: list[str] = field(default_factory=list)


def _is_queries(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in QUERY_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in QUERY_ATTRIBUTES
    if isinstance(node, ast.Call):
        called = node.func
        name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")
        return name in {"load", "Queries"}
    return False


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _is_sql_text(node: ast.expr) -> bool:
    """A string written in Python: a literal, an f-string, a sum or ``.format`` of them."""
    if isinstance(node, ast.JoinedStr) or _literal(node) is not None:
        return True
    if isinstance(node, ast.BinOp):
        return _is_sql_text(node.left) or _is_sql_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "format" and _is_sql_text(node.func.value)
    return False


def _check_run(call: ast.Call, where: str, found: Findings) -> None:
    """One ``<x>.execute(<query>, ...)`` call."""
    query = call.args[0]
    words: tuple[str, ...] | None = ()
    if isinstance(query, ast.Subscript) and _is_queries(query.value):
        name = _literal(query.slice)
        what = "lookup"
    elif (
        isinstance(query, ast.Call)
        and isinstance(query.func, ast.Attribute)
        and query.func.attr == "with_identifiers"
        and _is_queries(query.func.value)
    ):
        name = _literal(query.args[0]) if query.args else None
        what = "with_identifiers"
        given = [keyword.arg for keyword in query.keywords]
        words = None if None in given else tuple(sorted(str(word) for word in given))
    else:
        if _is_sql_text(query):
            found.problems.append(f"{where}: runs SQL written in Python; name it in a .sql file")
        return
    if name is None:
        found.problems.append(f"{where}: the query name is not a literal")
        return
    if name not in PARAMETERS:
        found.problems.append(f"{where}: there is no query named {name}")
        return
    takes = IDENTIFIERS.get(name, ())
    if what == "lookup" and takes:
        found.problems.append(f"{where}: {name} takes identifiers; use with_identifiers")
    elif what == "with_identifiers" and words is not None and words != takes:
        found.problems.append(
            f"{where}: {name} takes the identifiers {list(takes)}, given {list(words)}"
        )
    arguments = call.args[1:]
    if words is None or any(isinstance(argument, ast.Starred) for argument in arguments):
        found.uncounted.append(where)
        return
    method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if method == "executemany":
        rows = arguments[0] if len(arguments) == 1 else None
        if not isinstance(rows, ast.List | ast.Tuple) or not all(
            isinstance(row, ast.Tuple) for row in rows.elts
        ):
            found.uncounted.append(where)
            return
        counts = {len(row.elts) for row in rows.elts if isinstance(row, ast.Tuple)}
    else:
        counts = {len(arguments)}
    found.checked += 1
    for count in counts:
        if count != PARAMETERS[name]:
            found.problems.append(
                f"{where}: {name} takes {PARAMETERS[name]} argument(s), given {count}"
            )


def check_source(source: str, origin: str, found: Findings) -> None:
    """Check every query-running call in one module's source, and the name of every other
    lookup (one whose text is read rather than run)."""
    tree = ast.parse(source, origin)
    run: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RUNS
            and node.args
        ):
            run.add(id(node.args[0]))
            _check_run(node, f"{origin}:{node.lineno}", found)
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_queries(node.value) and id(node) not in run:
            name = _literal(node.slice)
            if name is not None and name not in PARAMETERS:
                found.problems.append(f"{origin}:{node.lineno}: there is no query named {name}")


def product_findings() -> Findings:
    found = Findings()
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == LOADER or "_pb2" in path.name:
                continue
            check_source(path.read_text("utf-8"), str(path.relative_to(ROOT)), found)
    return found


def test_every_query_call_names_a_query_with_its_argument_count() -> None:
    found = product_findings()
    assert found.problems == []
    assert found.checked >= CHECKED_AT_LEAST, "the walk no longer finds the query calls"
    assert len(found.uncounted) <= UNCOUNTED_ALLOWED, found.uncounted


def test_the_check_reports_a_wrong_name_and_a_wrong_count() -> None:
    source = (
        "async def f(conn, store, queries):\n"
        '    await conn.fetchrow(store.queries["run_read"], "run")\n'
        '    await conn.fetchrow(store.queries["run_raed"], "run")\n'
        '    await conn.execute(queries["deployment_insert"], "id")\n'
        '    await conn.execute(queries.with_identifiers("role_create", rol="x"))\n'
        '    await conn.execute(queries["role_create"])\n'
        '    await conn.fetchval("SELECT current_user")\n'
        '    await conn.execute(queries["activation_set"], *row)\n'
        '    sql = load()["grants_rest"]\n'
    )
    found = Findings()
    check_source(source, "probe.py", found)
    assert found.problems == [
        "probe.py:3: there is no query named run_raed",
        "probe.py:4: deployment_insert takes 2 argument(s), given 1",
        "probe.py:5: role_create takes the identifiers ['role'], given ['rol']",
        "probe.py:6: role_create takes identifiers; use with_identifiers",
        "probe.py:7: runs SQL written in Python; name it in a .sql file",
        "probe.py:9: there is no query named grants_rest",
    ]
    assert found.checked == 4
    assert found.uncounted == ["probe.py:8"]
