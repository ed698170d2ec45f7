"""The run list's statements (core/db/queries/recovery.sql) filter alike.

A list's page, its oldest-first variant and its total are separate statements, because each
needs its own ORDER BY (and the attention ones a literal condition for their partial
indexes). Their filters must stay the same lines, or a page would show runs its total does
not count: this compares them."""

from __future__ import annotations

import pytest

from core.db.queries import load, without_comments
from core.db.query_names import QueryName

GROUPS: dict[str, tuple[QueryName, ...]] = {
    "every run": ("recovery_run_list", "recovery_run_list_oldest", "recovery_run_count"),
    "attention": (
        "recovery_run_list_attention",
        "recovery_run_list_attention_oldest",
        "recovery_run_count_attention",
    ),
    "by id": ("recovery_run_list_by_id", "recovery_run_count_by_id"),
}


def filters(name: QueryName) -> list[str]:
    """The statement's WHERE lines, up to the cursor's condition or the ORDER BY."""
    lines = [line.strip() for line in without_comments(load()[name]).splitlines()]
    # (the first WHERE on the run itself; the lateral step look-up names s.run_id)
    start = next(
        n for n, line in enumerate(lines) if line.startswith("WHERE r.") and "s.run_id" not in line
    )
    found: list[str] = []
    for line in lines[start:]:
        cursor = "::timestamptz IS NULL OR (r." in line
        if cursor or line.startswith(("ORDER BY", "LIMIT")):
            break
        found.append(line)
    return found


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_page_and_its_total_filter_alike(group: str) -> None:
    first, *others = GROUPS[group]
    expected = filters(first)
    assert len(expected) >= 3, expected  # (the comparison must not go empty)
    for name in others:
        assert filters(name) == expected, name
