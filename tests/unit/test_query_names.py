"""The committed core/db/query_names.py is exactly what the .sql files give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_args

from core.db.queries import load
from core.db.query_names import IDENTIFIERS, PARAMETERS, QueryName

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_query_names_match_the_sql_files(tmp_path: Path) -> None:
    fresh = tmp_path / "query_names.py"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_query_names.py"), "--out", str(fresh)],
        check=True,
        capture_output=True,
    )
    committed = (ROOT / "core" / "db" / "query_names.py").read_text("utf-8")
    assert committed == fresh.read_text("utf-8"), (
        "core/db/query_names.py is stale: run python scripts/gen_query_names.py"
    )


def test_the_names_the_parameters_and_the_identifiers_cover_the_same_queries() -> None:
    names = set(get_args(QueryName))
    assert names == set(load()) == set(PARAMETERS)
    assert set(IDENTIFIERS) <= names
