"""The soak's pure parts (bench/soak.py): its options and their bounds, the minutes of the
flow, one minute's line, and the verdicts."""

from __future__ import annotations

import math

import pytest

from bench.soak import (
    MinuteLine,
    Verdict,
    count_within,
    flat,
    format_line,
    parse_args,
    planned_starts,
    summarise,
    verdicts,
    windows,
)

# ------------------------------------------------------------------------------ options


def test_the_defaults_are_fifty_a_second_for_ten_minutes_among_a_million() -> None:
    args = parse_args([])
    assert (args.rate, args.minutes, args.waiting_runs) == (50.0, 10.0, 1_000_000)
    assert args.out.parts[-3:] == ("var", "soak", "results.json")
    assert args.state.is_absolute()


@pytest.mark.parametrize(
    ("argv", "rate", "minutes", "waiting"),
    [
        (["--rate", "200", "--minutes", "120"], 200.0, 120.0, 1_000_000),
        (["--rate", "0.5", "--minutes", "0.25"], 0.5, 0.25, 1_000_000),
        (["--minutes", "3", "--waiting-runs", "1_000_000"], 50.0, 3.0, 1_000_000),
        (["--waiting-runs", "0"], 50.0, 10.0, 0),
    ],
)
def test_options_within_their_bounds_are_taken(
    argv: list[str], rate: float, minutes: float, waiting: int
) -> None:
    args = parse_args(argv)
    assert (args.rate, args.minutes, args.waiting_runs) == (rate, minutes, waiting)


@pytest.mark.parametrize(
    "argv",
    [
        ["--rate", "0"],
        ["--rate", "-1"],
        ["--rate", "200.5"],
        ["--rate", "nan"],
        ["--rate", "fast"],
        ["--minutes", "0"],
        ["--minutes", "120.1"],
        ["--minutes", "-3"],
        ["--waiting-runs", "-1"],
        ["--waiting-runs", "1e6"],
    ],
)
def test_options_out_of_bounds_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


# ------------------------------------------------------------------------------ the flow


def test_the_flow_is_bounded_in_count_and_cut_into_minutes() -> None:
    assert planned_starts(50, 10) == 30_000
    assert planned_starts(50, 3) == 9_000
    assert windows(3) == [(0.0, 60.0), (60.0, 120.0), (120.0, 180.0)]
    # A flow that is not a whole number of minutes ends with a shorter one.
    assert windows(1.5) == [(0.0, 60.0), (60.0, 90.0)]
    assert windows(0.25) == [(0.0, 15.0)]


def test_an_instant_belongs_to_the_minute_it_starts_and_not_the_one_it_ends() -> None:
    assert count_within([0.0, 59.999, 60.0, 61.0], 0.0, 60.0) == 2
    assert count_within([0.0, 59.999, 60.0, 61.0], 60.0, 120.0) == 2
    assert count_within([], 0.0, 60.0) == 0


def _minute(p99: float, started: int = 3000, measured: int = 3000) -> MinuteLine:
    return MinuteLine(
        label="min 1",
        started=started,
        ended=started,
        measured=measured,
        running=0,
        send_to_accepted_ms={"p50": 5.0, "p90": 8.0, "p99": p99, "max": p99, "mean": 5.0},
        created_to_prepared_ms={"p50": 1.0, "p90": 1.0, "p99": 1.0, "max": 1.0, "mean": 1.0},
        lag_p99_ms=0.2,
        rss_mib={"dispatcher": 80.0},
        postgres_mib=None,
        seconds=62.0,
    )


def test_a_minute_counts_the_runs_it_started_and_those_that_ended_in_it() -> None:
    # a started in the minute before and ended in this one; b and c started in this one,
    # b ended in it and c in the next; d is still running; e starts in the next minute.
    sent = {"a": 59.9, "b": 60.0, "c": 119.95, "d": 100.0, "e": 120.0}
    ended = {"a": 60.1, "b": 60.2, "c": 120.05}
    line = summarise(
        "min 2",
        sent,
        ended,
        60.0,
        120.0,
        to_accepted=[4.0, 6.0],
        to_prepared=[1.0, 2.0],
        lags_ms=[0.1, 0.3, 0.2],
        rss_mib={"launcher": 50.0, "dispatcher": 80.5},
        postgres_mib=300.0,
        seconds=122.0,
        match_ms=12.34,
    )
    assert (line.started, line.ended, line.measured, line.running) == (3, 2, 2, 1)
    assert line.match_ms == 12.3
    assert line.send_to_accepted_ms["p50"] == 4.0
    assert line.send_to_accepted_ms["p99"] == 6.0
    assert line.lag_p99_ms == 0.3
    text = format_line(line)
    assert "started     3 ended     2 (1 running)" in text
    assert "p50 4.0 / p99 6.0 ms (2)" in text
    assert text.endswith("RSS MiB launcher 50.0 dispatcher 80.5 postgres 300.0")


def test_the_start_line_shows_memory_only() -> None:
    line = summarise("start", {}, {}, 0.0, 0.0, [], [], [], {"dispatcher": 80.0}, None, 0.0)
    assert (line.started, line.ended, line.measured, line.lag_p99_ms) == (0, 0, 0, 0.0)
    assert math.isnan(line.send_to_accepted_ms["p99"])
    assert format_line(line) == "soak:  start | RSS MiB dispatcher 80.0"


def test_a_minute_with_nothing_measured_says_so() -> None:
    line = summarise("end", {}, {"a": 200.0}, 180.0, math.inf, [], [], [], {}, None, 200.0)
    assert line.ended == 1
    assert "start->first command -" in format_line(line)


# ------------------------------------------------------------------------------ verdicts


def _by_key(found: list[Verdict]) -> dict[str, bool | None]:
    return {v.key: v.ok for v in found}


def test_a_quiet_soak_passes_every_goal() -> None:
    found = verdicts(80.0, 89.9, [_minute(12.0), _minute(29.9)], (5, 20), (30, 70))
    assert _by_key(found) == {"rss": True, "p99": True, "claim": True, "settle": True}
    assert found[0].achieved == "80.0 -> 89.9 (+9.9)"
    assert found[1].achieved == "29.9"


def test_the_worst_minute_is_judged_not_the_average() -> None:
    found = verdicts(80.0, 80.0, [_minute(5.0), _minute(30.1), _minute(5.0)], (5, 5), None)
    assert _by_key(found) == {"rss": True, "p99": False, "claim": True, "settle": None}
    assert found[3].achieved == "not measured"


def test_growth_of_ten_mib_misses_and_buffers_past_twice_plus_ten_miss() -> None:
    found = verdicts(80.0, 90.0, [_minute(10.0)], (5, 21), (30, 71))
    assert _by_key(found) == {"rss": False, "p99": True, "claim": False, "settle": False}


def test_a_minute_whose_runs_were_never_measured_misses_the_latency_goal() -> None:
    found = verdicts(80.0, 80.0, [_minute(10.0), _minute(math.nan, measured=0)], (5, 5), None)
    assert _by_key(found)["p99"] is False
    assert "stalled" in found[1].achieved


def test_nothing_measured_is_not_judged() -> None:
    found = verdicts(80.0, 80.0, [], (5, 5), None)
    assert _by_key(found)["p99"] is None


@pytest.mark.parametrize(
    ("before", "after", "ok"), [(0, 10, True), (0, 11, False), (7, 24, True), (7, 25, False)]
)
def test_flat_means_at_most_twice_plus_ten(before: int, after: int, ok: bool) -> None:
    assert flat(before, after) is ok
