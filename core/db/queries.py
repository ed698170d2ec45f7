"""Named SQL queries: read once from ``core/db/queries/*.sql``, rendered per namespace.

A query file holds blocks that each start with a header line ``-- name: <query_name>``;
the comment lines right after the header describe the query and its ``$1..$n``, and the
rest up to the next header is the SQL. Every ``{{ns}}`` in the SQL stands for the
deployment's namespace; :meth:`Queries.__getitem__` puts the quoted identifier there, after
:func:`namespace_identifier` matched the name against the namespace pattern, so no query
text is ever assembled from unchecked input.

Callers use the typed wrappers next to their code (for example :mod:`core.db.schema`),
which name each parameter; nothing outside this module reads the files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType

from core.errors import CoordinatorError

QUERY_DIR = Path(__file__).with_name("queries")
PLACEHOLDER = "{{ns}}"

_HEADER = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_NAMESPACE = re.compile(r"coordinator_[a-z0-9_]+")
# PostgreSQL identifiers hold at most 63 bytes (longer ones are silently truncated).
NAMESPACE_MAX_BYTES = 63


def namespace_identifier(namespace: str) -> str:
    """The namespace as a quoted SQL identifier; refuses a name outside the pattern."""
    if not _NAMESPACE.fullmatch(namespace):
        raise CoordinatorError(
            "deployment.refused", "namespace must match ^coordinator_[a-z0-9_]+$"
        )
    if len(namespace.encode()) > NAMESPACE_MAX_BYTES:
        raise CoordinatorError(
            "deployment.refused",
            f"namespace is longer than {NAMESPACE_MAX_BYTES} bytes",
        )
    return '"' + namespace + '"'


def render(sql: str, namespace: str) -> str:
    """``sql`` with every ``{{ns}}`` replaced by the quoted namespace."""
    return sql.replace(PLACEHOLDER, namespace_identifier(namespace))


def parse_query_file(text: str, origin: str) -> dict[str, str]:
    """Split one query file into ``{name: sql}``; refuses duplicate or empty queries."""
    found: dict[str, str] = {}
    headers = list(_HEADER.finditer(text))
    preamble = text[: headers[0].start() if headers else len(text)]
    if any(line.strip() and not line.startswith("--") for line in preamble.splitlines()):
        raise ValueError(f"{origin}: SQL before the first '-- name:' header")
    for position, header in enumerate(headers):
        end = headers[position + 1].start() if position + 1 < len(headers) else len(text)
        body = text[header.end() : end].strip()
        name = header.group(1)
        if name in found:
            raise ValueError(f"{origin}: query {name} is defined twice")
        if not any(line.strip() and not line.startswith("--") for line in body.splitlines()):
            raise ValueError(f"{origin}: query {name} has no SQL")
        found[name] = body
    return found


@cache
def load() -> Mapping[str, str]:
    """Every named query of every file in ``core/db/queries``, read once per process."""
    queries: dict[str, str] = {}
    for path in sorted(QUERY_DIR.glob("*.sql")):
        for name, sql in parse_query_file(path.read_text("utf-8"), path.name).items():
            if name in queries:
                raise ValueError(f"{path.name}: query {name} is also defined in another file")
            queries[name] = sql
    return MappingProxyType(queries)


class Queries:
    """The named queries rendered for one namespace (rendered on first use, then kept)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.identifier = namespace_identifier(namespace)
        self._rendered: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        sql = self._rendered.get(name)
        if sql is None:
            sql = load()[name].replace(PLACEHOLDER, self.identifier)
            self._rendered[name] = sql
        return sql
