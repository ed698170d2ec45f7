"""The scale phase's pure parts (bench/scale.py): the ``--waiting-runs`` size list, the
seeding batches, and the figures read from an ``EXPLAIN (ANALYZE, BUFFERS)`` document."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from bench.run import parse_args
from bench.scale import SEED_BATCH, parse_sizes, plan_cost_of, seed_batches

# ------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("100000,1000000", [100_000, 1_000_000]),
        (" 100000 , 1_000_000 ", [100_000, 1_000_000]),
        ("5000", [5_000]),
        ("0", []),
    ],
)
def test_waiting_runs_are_increasing_sizes_or_zero_for_none(text: str, sizes: list[int]) -> None:
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "whole numbers"),
        ("100000,", "whole numbers"),
        ("1e6", "whole numbers"),
        ("100000;1000000", "whole numbers"),
        ("-5", "positive"),
        ("0,100000", "positive"),
        ("1000000,100000", "exceed"),
        ("100000,100000", "exceed"),
    ],
)
def test_a_size_list_that_cannot_be_seeded_cumulatively_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sizes(text)


def test_the_option_defaults_to_a_hundred_thousand_then_a_million() -> None:
    assert parse_args([]).waiting_runs == [100_000, 1_000_000]
    assert parse_args(["--waiting-runs", "0"]).waiting_runs == []
    assert parse_args([]).burst_runs == 200


@pytest.mark.parametrize("argv", [["--waiting-runs", "1000000,100000"], ["--burst-runs", "0"]])
def test_the_options_refuse_what_cannot_run(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


# ------------------------------------------------------------------------------ batches


def test_seeding_goes_on_from_the_runs_already_seeded_in_whole_batches() -> None:
    assert seed_batches(0, 250, batch=100) == [(0, 100), (100, 100), (200, 50)]
    assert seed_batches(250, 300, batch=100) == [(250, 50)]
    assert seed_batches(300, 300, batch=100) == []
    million = seed_batches(100_000, 1_000_000)
    assert sum(count for _, count in million) == 900_000
    assert all(count <= SEED_BATCH for _, count in million)
    # Each batch starts where the one before ended: no run is seeded twice or skipped.
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(million))


def test_a_batch_holds_at_least_one_run() -> None:
    with pytest.raises(ValueError):
        seed_batches(0, 10, batch=0)


# ------------------------------------------------------------------------------ EXPLAIN


def test_a_claim_costs_the_execution_buffers_of_the_top_node() -> None:
    explained = {
        "Plan": {
            "Node Type": "Sort",
            "Actual Rows": 0,
            "Shared Hit Blocks": 7,
            "Shared Read Blocks": 2,
            "Plans": [
                {"Node Type": "CTE Scan", "CTE Name": "claimed", "Actual Rows": 0},
                {"Node Type": "ModifyTable", "Subplan Name": "CTE claimed", "Relation Name": "step",
                 "Shared Hit Blocks": 6, "Actual Rows": 0, "Plans": [
                     {"Node Type": "Index Scan", "Relation Name": "step",
                      "Index Name": "step_due", "Actual Rows": 0},
                 ]},
            ],
        },
        "Planning": {"Shared Hit Blocks": 300},
        "Execution Time": 0.25,
    }  # fmt: skip
    cost = plan_cost_of(explained)
    # The CTE is read by the main query, so its buffers are already in the top node's.
    assert (cost.shared_hit, cost.shared_read, cost.buffers) == (7, 2, 9)
    assert cost.execution_ms == 0.25
    assert cost.rows == 0
    assert cost.plan == "step: Index Scan step_due (0 rows)"
    assert cost.to_json()["buffers"] == 9


def test_a_modifying_cte_nothing_reads_adds_its_own_buffers() -> None:
    # PostgreSQL runs such a CTE after the main query: the top node never covered it.
    explained: dict[str, Any] = {
        "Plan": {
            "Node Type": "CTE Scan",
            "CTE Name": "ended",
            "Actual Rows": 1,
            "Shared Hit Blocks": 20,
            "Shared Read Blocks": 1,
            "Plans": [
                {"Node Type": "ModifyTable", "Subplan Name": "CTE ended", "Relation Name": "step",
                 "Shared Hit Blocks": 12, "Plans": [
                     {"Node Type": "Index Scan", "Relation Name": "run",
                      "Index Name": "run_pkey", "Actual Rows": 1},
                 ]},
                {"Node Type": "ModifyTable", "Subplan Name": "CTE next", "Relation Name": "step",
                 "Shared Hit Blocks": 9, "Shared Read Blocks": 3, "Plans": [
                     {"Node Type": "CTE Scan", "CTE Name": "ended", "Actual Rows": 1},
                 ]},
                {"Node Type": "ModifyTable", "Subplan Name": "CTE progress", "Relation Name": "run",
                 "Shared Hit Blocks": 5, "Plans": [
                     {"Node Type": "Index Scan", "Relation Name": "run",
                      "Index Name": "run_pkey", "Actual Rows": 1},
                 ]},
            ],
        },
        "Execution Time": 1.5,
    }  # fmt: skip
    cost = plan_cost_of(explained, ("step", "run"))
    assert (cost.shared_hit, cost.shared_read) == (20 + 9 + 5, 1 + 3)
    assert cost.rows == 1
    # Only scans are named, not the ModifyTable nodes.
    assert cost.plan == "run: Index Scan run_pkey (1 rows), run: Index Scan run_pkey (1 rows)"


def test_a_bitmap_heap_scan_is_named_by_the_indexes_under_it() -> None:
    explained = {
        "Plan": {"Node Type": "Bitmap Heap Scan", "Relation Name": "step", "Actual Rows": 2,
                 "Plans": [{"Node Type": "Bitmap Index Scan", "Index Name": "step_uncertain"}]},
    }  # fmt: skip
    assert plan_cost_of(explained).plan == "step: Bitmap Heap Scan step_uncertain (2 rows)"
    explained = {"Plan": {"Node Type": "Seq Scan", "Relation Name": "step", "Actual Rows": 9}}
    assert plan_cost_of(explained).plan == "step: Seq Scan (9 rows)"


def test_a_plan_without_a_scan_of_the_tables_says_so() -> None:
    cost = plan_cost_of({"Plan": {"Node Type": "Result"}}, ("step", "run"))
    assert (cost.buffers, cost.rows, cost.execution_ms) == (0, 0, 0.0)
    assert cost.plan == "no scan of step or run"
