"""Named SQL queries: read once from ``core/db/queries/*.sql``, rendered per namespace.

A query file holds blocks that each start with a header line ``-- name: <query_name>``;
the comment lines right after the header describe the query, its ``$1..$n`` and its
placeholders, and the rest up to the next header is the SQL.

Placeholders stand for identifiers, which PostgreSQL cannot take as ``$n`` parameters:

- ``{{ns}}`` is the deployment's namespace. :meth:`Queries.__getitem__` puts the quoted
  identifier there, after :func:`namespace_identifier` matched the name against the
  namespace pattern.
- ``{{<word>}}``, any other lowercase word (``{{role}}``), is an identifier the caller
  names, for the few statements with no parameterised form (CREATE ROLE, GRANT).
  :meth:`Queries.with_identifiers` takes exactly the words the query uses and puts each
  value there quoted, after :func:`checked_identifier` matched it against the role name
  pattern (which also keeps ``$`` out of a dollar-quoted body); :meth:`Queries.__getitem__`
  refuses such a query.

So no query text is ever assembled from unchecked input.

``core/db/query_names.py`` is generated from the files (``scripts/gen_query_names.py``) and
committed: :data:`~core.db.query_names.QueryName` lets mypy refuse an unknown name, and
``tests/unit/test_query_calls.py`` checks every call's arguments against
:data:`~core.db.query_names.PARAMETERS` and :data:`~core.db.query_names.IDENTIFIERS`.
Callers use the typed wrappers next to their code (for example :mod:`core.db.schema`),
which name each parameter; nothing outside this module reads the files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

from core.codes import Code
from core.errors import CoordinatorError

if TYPE_CHECKING:
    # Only for the type: scripts/gen_query_names.py reads the files through this module,
    # so it must import while the generated file is stale or missing.
    from core.db.query_names import QueryName

QUERY_DIR = Path(__file__).with_name("queries")
PLACEHOLDER = "{{ns}}"

_HEADER = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_PLACEHOLDERS = re.compile(r"\{\{([a-z][a-z0-9_]*)\}\}")
_PARAMETER = re.compile(r"\$([1-9][0-9]*)")
_NAMESPACE = re.compile(r"coordinator_[a-z0-9_]+")
# The role names this service makes or accepts (the runtime file's runtimeRole pattern).
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# PostgreSQL identifiers hold at most 63 bytes (longer ones are silently truncated).
NAMESPACE_MAX_BYTES = 63


def namespace_identifier(namespace: str) -> str:
    """The namespace as a quoted SQL identifier; refuses a name outside the pattern."""
    if not _NAMESPACE.fullmatch(namespace):
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, "namespace must match ^coordinator_[a-z0-9_]+$"
        )
    if len(namespace.encode()) > NAMESPACE_MAX_BYTES:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"namespace is longer than {NAMESPACE_MAX_BYTES} bytes",
        )
    return '"' + namespace + '"'


def checked_identifier(name: str) -> str:
    """A role name as a quoted SQL identifier; refuses (``ValueError``) one outside
    ``[a-z_][a-z0-9_]*`` or longer than 63 bytes."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError("an identifier must match ^[a-z_][a-z0-9_]{0,62}$")
    return '"' + name + '"'


def render(sql: str, namespace: str) -> str:
    """``sql`` with every ``{{ns}}`` replaced by the quoted namespace."""
    return sql.replace(PLACEHOLDER, namespace_identifier(namespace))


def without_comments(sql: str) -> str:
    """``sql`` with every ``--`` comment removed: the text the server parses."""
    return "\n".join(line.partition("--")[0] for line in sql.splitlines())


def parameter_count(sql: str) -> int:
    """The highest ``$n`` the statement uses (its comments aside); 0 when it takes none."""
    return max((int(n) for n in _PARAMETER.findall(without_comments(sql))), default=0)


def identifier_words(sql: str) -> tuple[str, ...]:
    """The words of the ``{{word}}`` placeholders other than ``{{ns}}``, sorted."""
    return tuple(sorted(set(_PLACEHOLDERS.findall(sql)) - {"ns"}))


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


def read_query_files() -> dict[str, str]:
    """Every named query of every file in ``core/db/queries``, read now."""
    queries: dict[str, str] = {}
    for path in sorted(QUERY_DIR.glob("*.sql")):
        for name, sql in parse_query_file(path.read_text("utf-8"), path.name).items():
            if name in queries:
                raise ValueError(f"{path.name}: query {name} is also defined in another file")
            queries[name] = sql
    return queries


@cache
def load() -> Mapping[QueryName, str]:
    """Every named query, read once per process (its names are those of ``QueryName``,
    which a drift test keeps equal to the files)."""
    return MappingProxyType(cast("dict[QueryName, str]", read_query_files()))


class Queries:
    """The named queries rendered for one namespace (rendered on first use, then kept)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.identifier = namespace_identifier(namespace)
        self._rendered: dict[QueryName, str] = {}

    def __getitem__(self, name: QueryName) -> str:
        sql = self._rendered.get(name)
        if sql is None:
            sql = load()[name]
            if identifier_words(sql):
                raise ValueError(f"query {name} takes identifiers: use with_identifiers()")
            sql = sql.replace(PLACEHOLDER, self.identifier)
            self._rendered[name] = sql
        return sql

    def with_identifiers(self, name: QueryName, **identifiers: str) -> str:
        """Query ``name`` with each ``{{word}}`` replaced by the quoted identifier given
        for it; refuses (``ValueError``) a word missing, one the query does not use, and
        a value :func:`checked_identifier` refuses."""
        sql = load()[name]
        words = identifier_words(sql)
        if set(identifiers) != set(words):
            raise ValueError(f"query {name} takes the identifiers {', '.join(words) or 'none'}")

        def put(placeholder: re.Match[str]) -> str:
            word = placeholder.group(1)
            return self.identifier if word == "ns" else checked_identifier(identifiers[word])

        return _PLACEHOLDERS.sub(put, sql)
