"""The local steps a settled step leads through (core.execution.onward): what a settle
records besides its own step, decided from the run's values alone."""

from __future__ import annotations

from typing import Any

from core.execution.onward import MAX_LOCAL_STEPS, onward
from core.workflow.expr import Scope
from core.workflow.model import Workflow
from core.workflow.parse import load_marked_document, parse_document
from core.yamlsafe import Problems
from tests.helpers import dispatching


def parse_source(source: bytes) -> Workflow:
    """Workflow source read for its structure alone, without the checker's cross-checks: a
    loop of chooses below is one the checker would refuse, and the dispatcher still bounds."""
    document, marks = load_marked_document(source)
    problems = Problems(marks)
    draft = parse_document(document, problems)
    problems.raise_first()
    return draft.workflow()


def scope(steps: dict[str, Any] | None = None, run_input: Any = None) -> Scope:
    return Scope(
        input=run_input or {},
        steps=steps or {},
        run_id="run-1",
        run_started_at="2027-03-01T08:00:00.000Z",
    )


def test_a_choose_on_the_kept_value_and_its_finish_are_both_passed() -> None:
    wf = parse_source(dispatching.WORKFLOWS["notice-checked"])
    way = onward(wf, scope({"send": {"messageId": "m-1"}}), "check")
    assert way.passed == (("check", "choose"), ("kept", "finish"))
    assert (way.next_step, way.next_kind, way.outcome) == (None, None, "kept")
    assert (way.step_ids, way.step_types) == (["check", "kept"], ["choose", "finish"])


def test_without_the_kept_value_the_choose_takes_otherwise() -> None:
    wf = parse_source(dispatching.WORKFLOWS["notice-checked"])
    way = onward(wf, scope(), "check")
    assert way.passed == (("check", "choose"), ("lost", "finish"))
    assert way.outcome == "lost"


def test_a_step_that_needs_a_dispatcher_stops_the_way_and_is_made_due() -> None:
    wf = parse_source(dispatching.WORKFLOWS["notice"])
    way = onward(wf, scope(), "send")
    assert way.passed == ()
    assert (way.next_step, way.next_kind, way.outcome) == ("send", "call", None)
    pause = parse_source(dispatching.WORKFLOWS["pause"])
    assert onward(pause, scope(), "nap").next_kind == "wait-until"


def test_a_loop_of_chooses_is_cut_after_the_bound_and_continued_by_a_claim() -> None:
    source = dispatching._workflow(
        "loop",
        ["never"],
        "a",
        {
            "a": {"choose": [{"when": {"exists": "${input.kind}"}, "next": "z"}], "otherwise": "b"},
            "b": {"choose": [{"when": {"exists": "${input.kind}"}, "next": "z"}], "otherwise": "a"},
            "z": {"finish": {"outcome": "never"}},
        },
    )
    way = onward(parse_source(source), scope(), "a")
    assert len(way.passed) == MAX_LOCAL_STEPS
    assert way.step_ids[:3] == ["a", "b", "a"]
    assert (way.next_step, way.next_kind, way.outcome) == ("a", "choose", None)
