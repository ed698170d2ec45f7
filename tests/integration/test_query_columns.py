"""The result columns a query's header declares (``-- column name (type)``) are the ones the
server answers, in order and of the declared type: a typed row (``core/db/statements.py``)
is made from a record by position, so this is what keeps every one true.

Each such query is prepared (planned, never run) in a namespace with the schema installed,
and the server's description of its result is compared with the header. Nullability is the
header's word alone: the server does not say whether an expression can be null.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.db.queries import Queries, SqlType, identifier_words, load, query_spec
from devstack.postgres import DatabaseHandle
from tests.helpers.dispatching import DispatchKit, dispatch_kit

pytestmark = pytest.mark.postgres

# How the server (through asyncpg) names each declared type; a list is the item's name and "[]".
SERVER_NAMES = {
    "text": "text",
    "bigint": "int8",
    "integer": "int4",
    "smallint": "int2",
    "boolean": "bool",
    "bytea": "bytea",
    "float8": "float8",
    "numeric": "numeric",
    "timestamptz": "timestamptz",
    "interval": "interval",
    "jsonb": "jsonb",
    "oid": "oid",
    "name": "name",
}


def server_name(declared: SqlType) -> str:
    name = SERVER_NAMES[declared.name]
    return f"{name}[]" if declared.array else name


@pytest.fixture
async def kit(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[DispatchKit]:
    async with dispatch_kit(tmp_path, database) as made:
        yield made


async def test_declared_columns_are_the_ones_the_server_answers(kit: DispatchKit) -> None:
    queries = Queries(kit.deployment.namespace)
    checked, wrong = [], {}
    for name, sql in sorted(load().items()):
        spec = query_spec(name, sql)
        if not spec.columns or identifier_words(sql):
            continue
        statement = await kit.db.prepare(queries[name])
        answered = [(a.name, a.type.name) for a in statement.get_attributes()]
        declared = [(c.name, server_name(c.type)) for c in spec.columns]
        checked.append(name)
        if answered != declared:
            wrong[name] = (declared, answered)
    assert checked  # (the check itself must not go quiet)
    assert wrong == {}, "\n".join(f"{n}: declared {d}, answered {a}" for n, (d, a) in wrong.items())


async def test_the_check_sees_a_column_out_of_place(kit: DispatchKit) -> None:
    sql = "-- returns: row\n-- column b (text)\n-- column a (integer)\nSELECT 1 AS a, 'x' AS b"
    spec = query_spec("probe", sql)
    statement = await kit.db.prepare(sql)
    answered = [(a.name, a.type.name) for a in statement.get_attributes()]
    assert answered != [(c.name, server_name(c.type)) for c in spec.columns]
