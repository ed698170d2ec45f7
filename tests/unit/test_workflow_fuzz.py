"""The checker answers every malformed workflow with a refusal, never with a crash."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import PackageInvalid
from core.workflow.check import check_source
from tests.unit.test_workflow_refusals import BASE, dump


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for name, item in node.items():
            yield from _paths(item, (*prefix, name))
    elif isinstance(node, list):
        for position, item in enumerate(node):
            yield from _paths(item, (*prefix, position))


PATHS = list(_paths(BASE))
WORDS = [
    "",
    "x",
    "done",
    "notify",
    "review",
    "notices",
    "send-notice",
    "approved",
    "object",
    "string",
    "messaging",
    "casework-review-producer",
    "2026-01-01T00:00:00Z",
    "${",
    "}",
    "${input.who}",
    "${input.nested.inner}",
    "${steps.ask.reviewId}",
    "${steps.wait.outcome}",
    "${steps.notify.messageId}",
    "${response.reviewId}",
    "${run.id}",
]
KEYS = [
    "equals",
    "in",
    "exists",
    "all",
    "any",
    "not",
    "when",
    "next",
    "type",
    "call",
    "finish",
    "outcome",
    "input",
    "x",
]
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 100_000)
    | st.floats(allow_nan=False)
    | st.sampled_from(WORDS),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), VALUES, st.booleans()), min_size=1, max_size=3))
def test_random_edits_of_a_valid_workflow_are_accepted_or_refused(
    edits: list[tuple[tuple[Any, ...], Any, bool]],
) -> None:
    document = copy.deepcopy(BASE)
    for path, value, delete in edits:
        node: Any = document
        for name in path[:-1]:
            node = node[name] if isinstance(node, dict | list) and _has(node, name) else None
        if node is None or not _has(node, path[-1]):
            continue  # an earlier edit removed this place
        if delete and isinstance(node, dict):
            del node[path[-1]]
        else:
            node[path[-1]] = value
    try:
        workflow = check_source(dump(document))
    except PackageInvalid as refusal:
        assert refusal.code == "package.invalid"
        assert refusal.path
        assert refusal.reason
    else:
        assert workflow.id == "sample"


def _has(node: Any, name: Any) -> bool:
    if isinstance(node, dict):
        return name in node
    return isinstance(node, list) and isinstance(name, int) and 0 <= name < len(node)
