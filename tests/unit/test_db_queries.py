"""The named query files and their loader."""

from __future__ import annotations

import itertools
import re

import pytest

from core.db.queries import (
    NAMESPACE_MAX_BYTES,
    Queries,
    load,
    parameter_count,
    parse_query_file,
    render,
    without_comments,
)
from core.db.query_names import IDENTIFIERS
from core.db.roles import COMPONENTS, GRANTS, component_roles
from core.errors import CoordinatorError


def test_a_query_file_splits_into_named_queries() -> None:
    text = (
        "-- A file comment.\n\n"
        "-- name: first\n-- What it does; $1 is a thing.\nSELECT $1;\n\n"
        "-- name: second\nSELECT * FROM {{ns}}.run;\n"
    )
    assert parse_query_file(text, "x.sql") == {
        "first": "-- What it does; $1 is a thing.\nSELECT $1;",
        "second": "SELECT * FROM {{ns}}.run;",
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("SELECT 1;\n-- name: a\nSELECT 2;", "before the first"),
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;", "defined twice"),
        ("-- name: a\n-- only a comment\n", "has no SQL"),
    ],
)
def test_malformed_query_files_are_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_query_file(text, "x.sql")


def test_every_shipped_query_is_described_and_uses_only_the_namespace_placeholder() -> None:
    queries = load()
    assert {"activation_list", "catalog_dump", "role_schema_rights"} <= set(queries)
    for name, sql in queries.items():
        # The few statements that need other identifiers name them as {{word}}s.
        for word in IDENTIFIERS.get(name, ()):
            sql = sql.replace("{{" + word + "}}", "")
        assert sql.replace("{{ns}}", "").count("{{") == 0, name
        # The comment under the header is the query's documentation, $1..$n included.
        assert sql.startswith("-- "), name


def test_every_parameter_is_used_in_order_and_described_in_the_header() -> None:
    for name, sql in load().items():
        header = "\n".join(
            itertools.takewhile(lambda line: line.startswith("--"), sql.splitlines())
        )
        used = {int(n) for n in re.findall(r"\$([1-9][0-9]*)", without_comments(sql))}
        assert used == set(range(1, parameter_count(sql) + 1)), name
        for n in used:
            assert re.search(rf"\${n}(?![0-9])", header), f"{name} does not describe ${n}"


def test_parameters_in_comments_do_not_count() -> None:
    assert parameter_count("-- $1 and $2\nSELECT $1 -- not $3\n") == 1
    assert parameter_count("SELECT 1") == 0


def test_identifiers_are_quoted_and_must_all_be_given() -> None:
    queries = Queries("coordinator_a")
    assert queries.with_identifiers("role_create", role="coordinator_a_audit").endswith(
        'CREATE ROLE "coordinator_a_audit" NOLOGIN NOINHERIT;'
    )
    for unfit in ('we"ird', "x$grants$", "Upper", "", "a" * 64):
        with pytest.raises(ValueError, match="must match"):
            queries.with_identifiers("role_create", role=unfit)
    with pytest.raises(ValueError, match="takes the identifiers role"):
        queries.with_identifiers("role_create")
    with pytest.raises(ValueError, match="takes the identifiers role"):
        queries.with_identifiers("role_create", role="x", other="y")
    with pytest.raises(ValueError, match="use with_identifiers"):
        queries["role_create"]
    with pytest.raises(ValueError, match="takes the identifiers none"):
        queries.with_identifiers("activation_list", role="x")


def test_the_grants_table_is_read_from_the_grants_query() -> None:
    assert set(GRANTS) == set(COMPONENTS)
    for tables in GRANTS.values():
        assert tables["schema_version"][0] == "SELECT"
    assert GRANTS["admission"]["step"] == (
        "SELECT",
        "INSERT",
        "UPDATE (due_at, next_check_at, updated_at)",
    )
    assert GRANTS["recovery"]["hold"] == ("SELECT", "UPDATE")
    # Doctor's token refusals: the dispatcher keeps them, recovery only reads them.
    assert GRANTS["dispatcher"]["token_refusal"] == ("SELECT", "INSERT", "UPDATE", "DELETE")
    assert GRANTS["recovery"]["token_refusal"] == ("SELECT",)
    assert "token_refusal" not in GRANTS["admission"]
    assert "token_refusal" not in GRANTS["audit"]


def test_rendering_puts_the_quoted_namespace_in() -> None:
    assert render("SELECT * FROM {{ns}}.run", "coordinator_prod") == (
        'SELECT * FROM "coordinator_prod".run'
    )
    assert '"coordinator_a".activation' in Queries("coordinator_a")["activation_list"]


@pytest.mark.parametrize(
    "namespace",
    ['coordinator_x"; DROP TABLE y; --', "public", "Coordinator_x", "coordinator_" + "a" * 60],
)
def test_a_namespace_outside_the_pattern_is_refused(namespace: str) -> None:
    with pytest.raises(CoordinatorError) as refused:
        render("SELECT {{ns}}", namespace)
    assert refused.value.code == "deployment.refused"
    assert namespace not in refused.value.detail


def test_the_longest_namespace_is_accepted_and_its_role_names_fit() -> None:
    longest = "coordinator_" + "a" * (NAMESPACE_MAX_BYTES - len("coordinator_"))
    assert len(longest) == 63
    assert render("{{ns}}", longest) == f'"{longest}"'
    roles = component_roles(longest)
    assert all(len(name) <= 63 for name in roles.values())
    assert len(set(roles.values())) == len(roles)
    other = longest[:-1] + "b"
    assert not set(roles.values()) & set(component_roles(other).values())
    assert component_roles("coordinator_prod")["dispatcher"] == "coordinator_prod_dispatcher"


def test_a_namespace_over_63_bytes_is_refused() -> None:
    with pytest.raises(CoordinatorError):
        render("{{ns}}", "coordinator_" + "a" * 52)
