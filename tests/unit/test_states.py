"""The state types name exactly what the schema allows (core.states against schema.sql), and
the transition outcomes exactly what transitions.sql answers."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

import pytest

from core.products.http import TLS_REFUSED
from core.runs import RUN_STATES
from core.states import ENDED_RUN_STATES, Effect, RunState, SentNothing, StepState, Transition

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "core" / "db"
SCHEMA = (SCHEMA_DIR / "schema.sql").read_text()


def rules(table: str) -> str:
    """The body of ``table``'s rules function (the one CHECK of the table calls it)."""
    body = re.search(
        rf"CREATE FUNCTION {{{{ns}}}}\.{table}_rules\(.*?\$\$(.*?)\$\$", SCHEMA, re.DOTALL
    )
    assert body, table
    assert f"CHECK ({{{{ns}}}}.{table}_rules(" in SCHEMA, table
    return body[1]


def allowed(table: str, column: str) -> set[str]:
    """The values ``table``'s rules let ``column`` take: its ``WHEN NOT (x.column IN (...))``."""
    check = re.search(rf"WHEN NOT \(\w\.{column} IN \(([^)]*)\)\)", rules(table))
    assert check, (table, column)
    return set(re.findall(r"'([a-z0-9-]+)'", check[1]))


@pytest.mark.parametrize(
    ("kind", "table", "column"),
    [(RunState, "run", "state"), (StepState, "step", "state"), (Effect, "step", "effect")],
)
def test_each_type_has_exactly_the_schemas_values(
    kind: type[StrEnum], table: str, column: str
) -> None:
    assert {member.value for member in kind} == allowed(table, column)


def test_run_states_and_ended_states() -> None:
    assert tuple(RunState) == RUN_STATES
    assert {state for state in RunState if state.ended} == ENDED_RUN_STATES
    ended = re.search(
        r"WHEN NOT \(\(r\.state IN \(([^)]*)\)\)\s+= \(r\.ended_at IS NOT NULL\)\)", rules("run")
    )
    assert ended
    assert set(re.findall(r"'([a-z]+)'", ended[1])) == {str(s) for s in ENDED_RUN_STATES}


def test_each_transition_is_an_outcome_the_functions_answer() -> None:
    functions = (SCHEMA_DIR / "transitions.sql").read_text()
    answered = set(re.findall(r"\b(?:outcome|verdict) := '([a-z-]+)'", functions))
    assert answered - {"ours"} == {member.value for member in Transition}
    assert {t for t in Transition if not t.moved} == {
        Transition.LEASE_LOST,
        Transition.RESTORE_HELD,
        Transition.ALREADY_SETTLED,
        Transition.CHANGED,
    }


def test_the_causes_of_sending_nothing_are_the_schemas_one_list() -> None:
    # sent_nothing() is the one list the step table's rules and every attention rule read.
    body = re.search(
        r"CREATE FUNCTION \{\{ns\}\}\.sent_nothing\(cause text\).*?\$\$(.*?)\$\$", SCHEMA, re.DOTALL
    )
    assert body
    assert set(re.findall(r"'([a-z-]+)'", body[1])) == {str(cause) for cause in SentNothing}
    assert {str(cause) for cause in SentNothing} <= allowed("step", "cause")
    assert re.search(
        r"\{\{ns\}\}\.sent_nothing\(s\.cause\)\s+OR s\.effect = 'unknown'", rules("step")
    )
    # The HTTP client's failure of a TLS handshake is the very cause a step shows.
    assert str(SentNothing.TLS_REFUSED) == TLS_REFUSED


def test_no_statement_spells_a_cause_of_sending_nothing_itself() -> None:
    # Every rule about them asks sent_nothing() or step_wants_attention(): a cause added
    # to the list is then treated alike everywhere.
    texts = [SCHEMA_DIR / "transitions.sql", *sorted((SCHEMA_DIR / "queries").glob("*.sql"))]
    for path in texts:
        code = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        for cause in SentNothing:
            assert f"'{cause}'" not in code, (path.name, str(cause))
