"""core.clock: the wall clock in production, the test clock file across processes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core import clock
from core.db.queries import query_text, without_comments

INSTANT = datetime(2027, 3, 1, 8, 0, 0, 250000, tzinfo=UTC)


class RecordingConnection:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def execute(self, *args: Any) -> str:
        self.calls.append(args)
        return "SELECT 1"


def test_without_the_variable_now_is_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(clock.ENV_VAR, raising=False)
    before = datetime.now(UTC)
    current = clock.now()
    assert before <= current <= datetime.now(UTC)
    assert current.tzinfo is not None
    assert not clock.enabled()
    assert clock.pinned_instant() is None


def test_the_test_clock_file_gives_now_and_is_read_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "clock"
    clock.write_test_clock(path, INSTANT)
    monkeypatch.setenv(clock.ENV_VAR, str(path))
    assert clock.enabled()
    assert clock.now() == INSTANT
    later = INSTANT + timedelta(milliseconds=1)
    clock.write_test_clock(path, later)  # same size, possibly the same mtime
    assert clock.now() == later


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2027-03-01T08:00:00Z\n", datetime(2027, 3, 1, 8, tzinfo=UTC)),
        ("2027-03-01T10:00:00+02:00", datetime(2027, 3, 1, 8, tzinfo=UTC)),
        ("2027-03-01t08:00:00.5z", datetime(2027, 3, 1, 8, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_instants_in_any_offset_read_as_utc(text: str, expected: datetime) -> None:
    assert clock.parse_instant(text) == expected


def test_an_unreadable_clock_file_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "clock"
    path.write_text("tomorrow morning")
    monkeypatch.setenv(clock.ENV_VAR, str(path))
    with pytest.raises(clock.ClockFileInvalid, match="clock"):
        clock.now()
    path.write_text("2027-03-01T08:00:00")  # no offset
    with pytest.raises(clock.ClockFileInvalid):
        clock.now()
    path.unlink()
    with pytest.raises(clock.ClockFileInvalid):
        clock.now()


async def test_apply_to_sets_the_transaction_local_fake_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "clock"
    clock.write_test_clock(path, INSTANT)
    monkeypatch.setenv(clock.ENV_VAR, str(path))
    conn = RecordingConnection()
    await clock.apply_to(conn)
    sql = query_text("clock_fake_now_set")
    assert without_comments(sql).strip() == "SELECT set_config($1, $2, true);"
    assert conn.calls == [(sql, "coordinator.fake_now", "2027-03-01T08:00:00.250000Z")]


async def test_apply_to_does_nothing_in_production(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(clock.ENV_VAR, raising=False)
    conn = RecordingConnection()
    await clock.apply_to(conn)
    assert conn.calls == []


def test_format_instant_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="aware"):
        clock.format_instant(datetime(2027, 3, 1))
    assert clock.format_instant(INSTANT) == "2027-03-01T08:00:00.250000Z"
