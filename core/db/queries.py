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

The header also names and types what the query takes and gives, one line each::

    -- $1 run_id (text): what it is, said briefly
    -- $2 names (text[], null items)       a list whose items may be NULL
    -- $3 reason (text, null)              a value that may be NULL
    -- returns: rows | row | status | value (<type>[, null])

:func:`query_spec` reads those lines and refuses a header that does not match its statement
(every ``$n`` named once, in order, with a type it knows).

A query that takes many values takes them as one value of a composite type of the namespace
(``-- $4 settle (settle_args)``), declared in ``core/db/transitions.sql`` under a header of the
same kind, one ``-- field name (type)`` line per attribute of its ``CREATE TYPE``::

    -- type: settle_args
    -- How a step ends.
    -- field state (text): what it is, said briefly
    -- field effect (text, null)

:func:`composite_types` reads those and refuses a header whose fields are not the
attributes its ``CREATE TYPE`` declares, in order; the typed call then takes a ``NamedTuple``
of the same fields (asyncpg encodes a composite from a tuple, by position). From them
``scripts/gen_query_names.py`` writes two committed modules: ``core/db/query_names.py``
(the :data:`~core.db.query_names.QueryName` literal type) and ``core/db/statements.py``, one
``async`` call per query with keyword-only, typed parameters and a typed result: a method of
:class:`~core.db.statements.Statements` (a :class:`Queries` with the calls; ``store.queries``
is one) for a query that uses the namespace, a module function for one that does not.
Product code runs queries only through those calls; ``tests/unit/test_query_calls.py``
refuses any other way.
"""

from __future__ import annotations

import itertools
import keyword
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, cast

from core.codes import Code
from core.errors import CoordinatorError

if TYPE_CHECKING:
    # Only for the type: scripts/gen_query_names.py reads the files through this module,
    # so it must import while the generated file is stale or missing.
    from core.db.query_names import QueryName

QUERY_DIR = Path(__file__).with_name("queries")
TYPES_FILE = Path(__file__).with_name("transitions.sql")
"""Where the composite types that queries take are declared (and created, by apply)."""
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


# The structured lines of a query's header, read by scripts/gen_query_names.py:
#   -- $3 step_id (text): what it is         one per parameter, in order
#   -- $4 names (text[], null items)         a list whose items may be null
#   -- $5 reason (text, null): ...           a value that may be null
#   -- returns: rows | row | status | value (bigint[, null])
#   -- column state (text): what it is       after rows or row: each result column, in
#   -- column ended_at (timestamptz, null)   order; the call then answers a typed row
_PARAMETER_LINE = re.compile(r"^-- \$([1-9][0-9]*) ([a-z][a-z0-9_]*) \(([^)]*)\)(?::.*)?$")
_COLUMN_LINE = re.compile(r"^-- column ([a-z][a-z0-9_]*) \(([^)]*)\)(?::(.*))?$")
_RETURNS_LINE = re.compile(r"^-- returns: (rows|row|status|value \(([^)]*)\))\s*$")
_RESERVED = frozenset({"conn", "self", "cls"}) | frozenset(keyword.kwlist)

_TYPE_HEADER = re.compile(r"^-- type: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_FIELD_LINE = re.compile(r"^-- field ([a-z][a-z0-9_]*) \(([^)]*)\)(?::(.*))?$")
_CREATE_TYPE = re.compile(r"CREATE TYPE \{\{ns\}\}\.([a-z][a-z0-9_]*) AS \((.*?)\);", re.DOTALL)
_ATTRIBUTE = re.compile(r"([a-z][a-z0-9_]*) ((?:\{\{ns\}\}\.)?[a-z][a-z0-9_]*(?:\[\])?)")

# PostgreSQL type -> the Python type asyncpg takes or gives for it.
PYTHON_TYPES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "text": "str",
        "bigint": "int",
        "integer": "int",
        "smallint": "int",
        "boolean": "bool",
        "bytea": "bytes",
        "float8": "float",
        "numeric": "Decimal",
        "timestamptz": "datetime",
        "interval": "timedelta",
        "jsonb": "str",
        "oid": "int",
        "name": "str",
    }
)


@dataclass(frozen=True)
class SqlType:
    """A declared type: the PostgreSQL type, whether it is a list, and what may be null."""

    name: str
    array: bool
    nullable: bool
    items_nullable: bool

    @classmethod
    def parse(cls, text: str, where: str, composites: Collection[str] | None = None) -> SqlType:
        """``text[], null items`` and the like; refuses (``ValueError``) an unknown type. A
        type is a built-in one of :data:`PYTHON_TYPES` or one of ``composites`` (by default
        the composite types declared in :data:`TYPES_FILE`)."""
        first, *rest = (part.strip() for part in text.split(","))
        array = first.endswith("[]")
        base = first.removesuffix("[]")
        known = composite_names() if composites is None else composites
        if base not in PYTHON_TYPES and base not in known:
            raise ValueError(f"{where}: unknown type {first!r}")
        items_nullable = any(part.startswith("null items") for part in rest)
        nullable = any(
            part.startswith("null") and not part.startswith("null items") for part in rest
        )
        if items_nullable and not array:
            raise ValueError(f"{where}: 'null items' needs a list type")
        return cls(base, array, nullable, items_nullable)

    @property
    def composite(self) -> bool:
        """A composite type of the namespace rather than a built-in one."""
        return self.name not in PYTHON_TYPES

    def python(self, *, accepting: bool) -> str:
        """The Python annotation: a list accepted is any ``Sequence``, one given a ``list``;
        a composite type is its ``NamedTuple`` (:func:`composite_class`)."""
        named = composite_class(self.name) if self.composite else PYTHON_TYPES[self.name]
        item = named + (" | None" if self.items_nullable else "")
        text = (f"Sequence[{item}]" if accepting else f"list[{item}]") if self.array else item
        return text + (" | None" if self.nullable else "")


@dataclass(frozen=True)
class Parameter:
    """One ``$n`` of a query, as its header names and types it."""

    number: int
    name: str
    type: SqlType


@dataclass(frozen=True)
class Column:
    """One result column of a query that answers rows, as its header names and types it."""

    name: str
    type: SqlType
    doc: str = ""


@dataclass(frozen=True)
class QuerySpec:
    """What a query's header says: its prose, its parameters and what it returns."""

    name: str
    doc: str
    parameters: tuple[Parameter, ...]
    returns: str
    """``rows``, ``row``, ``status`` or ``value``."""
    value_type: SqlType | None
    columns: tuple[Column, ...] = ()
    """The result columns the header declares, in order (rows and row only; none
    declared: the call answers asyncpg's ``Record``)."""


def query_spec(name: str, sql: str) -> QuerySpec:
    """The structured header of query ``name``. Refuses (``ValueError``) a header that is
    malformed or does not match the statement: a ``returns:`` line, and each ``$1..$n`` the
    statement uses named once, in order, with a known type."""
    header = list(itertools.takewhile(lambda line: line.startswith("--"), sql.splitlines()))
    if not any(line.startswith("-- returns:") for line in header):
        raise ValueError(f"query {name}: its header has no '-- returns:' line")
    parameters: list[Parameter] = []
    columns: list[Column] = []
    prose: list[str] = []
    returns: str | None = None
    value_type: SqlType | None = None
    for line in header:
        if line.startswith("-- $"):
            match = _PARAMETER_LINE.match(line)
            if match is None:
                raise ValueError(f"query {name}: malformed parameter line {line!r}")
            number, word, declared = int(match[1]), match[2], match[3]
            if number != len(parameters) + 1:
                raise ValueError(f"query {name}: ${number} is out of order")
            if word in _RESERVED or word in {p.name for p in parameters}:
                raise ValueError(f"query {name}: parameter name {word!r} is taken")
            parameters.append(Parameter(number, word, SqlType.parse(declared, f"query {name}")))
            description = line[match.end(3) + 1 :].removeprefix(":").strip()
            if description:
                end = "" if description.endswith((".", ";", "?", "!")) else "."
                prose.append(f"``{word}``: {description}{end}")
        elif line.startswith("-- column "):
            match = _COLUMN_LINE.match(line)
            if match is None:
                raise ValueError(f"query {name}: malformed column line {line!r}")
            if returns not in ("row", "rows"):
                raise ValueError(f"query {name}: columns follow 'returns: row' or 'rows'")
            if match[1] in _RESERVED or match[1] in {c.name for c in columns}:
                raise ValueError(f"query {name}: column name {match[1]!r} is taken")
            kind = SqlType.parse(match[2], f"query {name}")
            columns.append(Column(match[1], kind, (match[3] or "").strip()))
        elif line.startswith("-- returns:"):
            match = _RETURNS_LINE.match(line)
            if match is None or returns is not None:
                raise ValueError(f"query {name}: malformed or repeated returns line {line!r}")
            returns = match[1].split(" ")[0]
            if match[2] is not None:
                value_type = SqlType.parse(match[2], f"query {name}")
        else:
            prose.append(line.removeprefix("--").strip())
    assert returns is not None  # a returns line is there
    used = parameter_count(sql)
    if len(parameters) != used:
        raise ValueError(f"query {name}: uses {used} parameters, names {len(parameters)}")
    doc = " ".join(part for part in prose if part)
    return QuerySpec(name, doc, tuple(parameters), returns, value_type, tuple(columns))


@dataclass(frozen=True)
class Field:
    """One attribute of a composite type, as its header names and types it."""

    name: str
    type: SqlType
    doc: str = ""


@dataclass(frozen=True)
class CompositeSpec:
    """What a composite type's header says: its prose and its fields, in order."""

    name: str
    doc: str
    fields: tuple[Field, ...]


def composite_class(name: str) -> str:
    """The name of the ``NamedTuple`` that mirrors composite type ``name``."""
    return "".join(part.capitalize() for part in name.split("_"))


def composite_names(text: str | None = None) -> frozenset[str]:
    """The composite types declared (``-- type: name``) in ``text``, by default in
    :data:`TYPES_FILE`."""
    if text is None:
        return _declared_names()
    return frozenset(_TYPE_HEADER.findall(text))


@cache
def _declared_names() -> frozenset[str]:
    return composite_names(TYPES_FILE.read_text("utf-8"))


def composite_specs(text: str, origin: str) -> dict[str, CompositeSpec]:
    """Every composite type declared in ``text``: each ``-- type: name`` header with its
    prose and ``-- field`` lines, followed by the ``CREATE TYPE {{ns}}.name AS (...)`` it
    describes. Refuses (``ValueError``) a header without its ``CREATE TYPE`` and fields
    that are not that statement's attributes (names and types, in order)."""
    names = composite_names(text)
    found: dict[str, CompositeSpec] = {}
    headers = list(_TYPE_HEADER.finditer(text))
    for position, header in enumerate(headers):
        name = header[1]
        where = f"{origin}: type {name}"
        if name in found:
            raise ValueError(f"{where} is declared twice")
        end = headers[position + 1].start() if position + 1 < len(headers) else len(text)
        body = text[header.end() : end].lstrip("\n")
        comments = list(itertools.takewhile(lambda line: line.startswith("--"), body.splitlines()))
        fields: list[Field] = []
        prose: list[str] = []
        for line in comments:
            if not line.startswith("-- field "):
                prose.append(line.removeprefix("--").strip())
                continue
            match = _FIELD_LINE.match(line)
            if match is None:
                raise ValueError(f"{where}: malformed field line {line!r}")
            if match[1] in _RESERVED or match[1] in {f.name for f in fields}:
                raise ValueError(f"{where}: field name {match[1]!r} is taken")
            kind = SqlType.parse(match[2], where, names)
            fields.append(Field(match[1], kind, (match[3] or "").strip()))
        created = _CREATE_TYPE.search(without_comments(body))
        if created is None or created[1] != name:
            raise ValueError(f"{where}: no 'CREATE TYPE {{{{ns}}}}.{name} AS (...)' follows")
        attributes: list[tuple[str, str]] = []
        for part in created[2].split(","):
            attribute = _ATTRIBUTE.fullmatch(" ".join(part.split()))
            if attribute is None:
                raise ValueError(f"{where}: unreadable attribute {part.strip()!r}")
            attributes.append((attribute[1], attribute[2].replace(PLACEHOLDER + ".", "")))
        declared = [(f.name, f.type.name + "[]" * f.type.array) for f in fields]
        if attributes != declared:
            raise ValueError(f"{where}: its fields {declared} are not its attributes {attributes}")
        doc = " ".join(part for part in prose if part)
        found[name] = CompositeSpec(name, doc, tuple(fields))
    return found


@cache
def composite_types() -> Mapping[str, CompositeSpec]:
    """Every composite type declared in :data:`TYPES_FILE`, in the order declared."""
    return MappingProxyType(composite_specs(TYPES_FILE.read_text("utf-8"), TYPES_FILE.name))


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


def query_text(name: QueryName) -> str:
    """The text of query ``name`` as its file holds it, placeholders and all: for code that
    reads a statement rather than running it (the grants table of core/db/roles.py)."""
    return load()[name]


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
