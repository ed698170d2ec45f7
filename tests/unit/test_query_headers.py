"""The structured header of a query: its ``-- $n name (type)`` and ``-- returns:`` lines,
from which scripts/gen_query_names.py writes one typed call per query."""

from __future__ import annotations

import pytest

from core.db.queries import (
    QUERY_DIR,
    SqlType,
    composite_specs,
    composite_types,
    load,
    query_spec,
)


def test_a_header_names_and_types_every_parameter_and_the_result() -> None:
    spec = query_spec(
        "probe",
        "-- Ends a step.\n"
        "-- $1 run_id (text): the run\n"
        "-- $2 names (text[], null items)\n"
        "-- $3 reason (text, null for a retry)\n"
        "-- returns: value (bigint, null)\n"
        "SELECT count(*) FROM t WHERE a = $1 AND b = ANY($2) AND c = $3",
    )
    assert [(p.number, p.name) for p in spec.parameters] == [
        (1, "run_id"),
        (2, "names"),
        (3, "reason"),
    ]
    assert [p.type.python(accepting=True) for p in spec.parameters] == [
        "str",
        "Sequence[str | None]",
        "str | None",
    ]
    assert spec.returns == "value"
    assert spec.value_type is not None
    assert spec.value_type.python(accepting=False) == "int | None"
    # The parameter descriptions join the prose the wrapper's docstring is made of.
    assert spec.doc == "Ends a step. ``run_id``: the run."


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ("-- $1 run_id (text)\n-- returns: row\n", "uses 2 parameters, names 1"),
        ("-- $2 run_id (text)\n-- $1 b (text)\n-- returns: row\n", r"\$2 is out of order"),
        ("-- $1 a (text)\n-- $2 a (text)\n-- returns: row\n", "'a' is taken"),
        ("-- $1 conn (text)\n-- $2 b (text)\n-- returns: row\n", "'conn' is taken"),
        ("-- $1 a (varchar)\n-- $2 b (text)\n-- returns: row\n", "unknown type 'varchar'"),
        ("-- $1 a (text, null items)\n-- $2 b (text)\n-- returns: row\n", "needs a list"),
        ("-- $1 (text) the run\n-- $2 b (text)\n-- returns: row\n", "malformed parameter"),
        ("-- $1 a (text)\n-- $2 b (text)\n-- returns: value\n", "malformed or repeated"),
        ("-- $1 a (text)\n-- $2 b (text)\n-- returns: many\n", "malformed or repeated"),
        ("-- $1 a (text)\n-- $2 b (text)\n-- returns: row\n-- returns: row\n", "repeated"),
        ("-- $1 a (text)\n-- $2 b (text)\n", "no '-- returns:' line"),
    ],
)
def test_a_header_that_does_not_fit_its_statement_is_refused(header: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        query_spec("probe", header + "SELECT $1, $2")


def test_a_list_type_is_a_sequence_accepted_and_a_list_given() -> None:
    declared = SqlType.parse("bigint[], null", "probe")
    assert declared.python(accepting=True) == "Sequence[int] | None"
    assert declared.python(accepting=False) == "list[int] | None"


def test_every_shipped_query_has_a_structured_header() -> None:
    specs = [query_spec(name, sql) for name, sql in load().items()]
    # Every "-- name:" line of the files is one query read (the floor the count once was,
    # over 100, fell as transitions moved into transitions.sql's functions: 87 in issue 39).
    named = sum(
        text.count("\n-- name: ") + text.startswith("-- name: ")
        for text in (path.read_text("utf-8") for path in sorted(QUERY_DIR.glob("*.sql")))
    )
    assert len(specs) == named > 80
    assert {spec.returns for spec in specs} == {"rows", "row", "status", "value"}


TYPE = (
    "-- type: probe_args\n"
    "-- What a probe takes.\n"
    "-- field run_id (text): the run\n"
    "-- field names (text[])\n"
    "-- field inner (inner_args, null)\n"
    "DO $probe$ BEGIN\n"
    "    CREATE TYPE {{ns}}.probe_args AS (\n"
    "        run_id text, names text[],\n"
    "        inner {{ns}}.inner_args);\n"
    "END $probe$;\n"
    "-- type: inner_args\n"
    "-- field n (integer)\n"
    "CREATE TYPE {{ns}}.inner_args AS (n integer);\n"
)


def test_a_composite_type_is_declared_by_its_header_and_taken_as_its_named_tuple() -> None:
    specs = composite_specs(TYPE, "probe.sql")
    probe = specs["probe_args"]
    assert probe.doc == "What a probe takes."
    assert [(f.name, f.type.python(accepting=True), f.doc) for f in probe.fields] == [
        ("run_id", "str", "the run"),
        ("names", "Sequence[str]", ""),
        ("inner", "InnerArgs | None", ""),
    ]
    declared = SqlType.parse("probe_args[]", "probe", {"probe_args"})
    assert declared.composite
    assert declared.python(accepting=True) == "Sequence[ProbeArgs]"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("-- field names (text[])\n", ""), "are not its attributes"),
        (("names text[]", "names integer[]"), "are not its attributes"),
        (("CREATE TYPE {{ns}}.probe_args", "CREATE TYPE {{ns}}.other_args"), "no 'CREATE TYPE"),
        (("-- field names (text[])", "-- field names text[]"), "malformed field"),
        (("(inner_args, null)", "(outer_args, null)"), "unknown type 'outer_args'"),
    ],
)
def test_a_composite_header_that_does_not_fit_its_type_is_refused(
    change: tuple[str, str], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        composite_specs(TYPE.replace(*change), "probe.sql")


def test_the_shipped_composite_types_are_the_ones_the_queries_take() -> None:
    types = composite_types()
    assert set(types) == {"settle_args", "binding_args", "start_args"}
    taken = {
        p.type.name for spec in map(query_spec, load(), load().values()) for p in spec.parameters
    }
    assert {"settle_args", "start_args"} <= taken
