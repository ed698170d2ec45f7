"""The committed core/db/query_names.py and core/db/statements.py are exactly what the .sql
files give."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import get_args

from core.db import statements
from core.db.queries import load
from core.db.query_names import IDENTIFIERS, PARAMETERS, QueryName
from core.db.statements import Statements

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_modules_match_the_sql_files(tmp_path: Path) -> None:
    names, statements = tmp_path / "query_names.py", tmp_path / "statements.py"
    script = str(ROOT / "scripts" / "gen_query_names.py")
    subprocess.run(
        [sys.executable, script, "--out", str(names), "--statements", str(statements)],
        check=True,
        capture_output=True,
    )
    for fresh in (names, statements):
        committed = (ROOT / "core" / "db" / fresh.name).read_text("utf-8")
        assert committed == fresh.read_text("utf-8"), (
            f"core/db/{fresh.name} is stale: run make query-names"
        )


def test_every_query_has_one_typed_call() -> None:
    methods = {name for name in vars(Statements) if not name.startswith("_")}
    functions = {
        name
        for name, value in vars(statements).items()
        if inspect.iscoroutinefunction(value) and value.__module__ == statements.__name__
    }
    assert methods.isdisjoint(functions)
    assert methods | functions == set(load())


def test_the_names_the_parameters_and_the_identifiers_cover_the_same_queries() -> None:
    names = set(get_args(QueryName))
    assert names == set(load()) == set(PARAMETERS)
    assert set(IDENTIFIERS) <= names
