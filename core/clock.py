"""The service's notion of "now", the test clock that replaces it across processes, and
the RFC 3339 text of instants.

Production reads the wall clock and never sets anything. Tests that must move time across
real processes (leases, timers, retention) point the environment variable
``COORDINATOR_TEST_CLOCK_FILE`` at a file holding one RFC 3339 instant; every process of the
stack then reads that instant instead of the wall clock, and :func:`apply_to` makes
PostgreSQL agree by setting ``coordinator.fake_now`` for the current transaction, which the
namespace's ``now()`` function answers.

The file is read again on every call rather than cached on its modification time: two quick
writes can share a timestamp on coarse file systems, and a stale instant would make a test
flaky. It is tiny and only ever used in tests.

Instants are written in one form, UTC with ``Z``: documents and journal lines show
milliseconds (:func:`timestamp`), the test clock keeps microseconds (:func:`format_instant`).
"""

from __future__ import annotations

import os
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from core.db import statements

ENV_VAR: Final = "COORDINATOR_TEST_CLOCK_FILE"
SETTING: Final = "coordinator.fake_now"

# What an API body's instant must look like: a full date-time with an offset.
_OFFSET_INSTANT: Final = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)


class ClockFileInvalid(RuntimeError):
    """The test clock file is missing or does not hold an RFC 3339 instant (names the file)."""


def clock_file() -> Path | None:
    """The test clock file named by the environment, or ``None`` in production."""
    value = os.environ.get(ENV_VAR)
    return Path(value) if value else None


def enabled() -> bool:
    """Whether the test clock replaces the wall clock in this process."""
    return clock_file() is not None


def parse_instant(text: str) -> datetime:
    """An aware UTC datetime from RFC 3339 text (``Z`` or a numeric offset required)."""
    value = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError("the instant has no offset")
    return value.astimezone(UTC)


def parse_offset_instant(text: str) -> datetime | None:
    """An API body's RFC 3339 date-time with an offset, as aware UTC; ``None`` when ``text``
    is not one (no offset, a date alone, a day or hour out of range).

    Digits finer than microseconds are dropped (truncated).
    """
    if not _OFFSET_INSTANT.fullmatch(text):
        return None
    try:
        return parse_instant(text)
    except ValueError:
        return None


def format_instant(
    instant: datetime, timespec: Literal["milliseconds", "microseconds"] = "microseconds"
) -> str:
    """RFC 3339 UTC with ``Z``, e.g. ``2027-01-15T08:00:00.000000Z`` (digits truncated)."""
    if instant.tzinfo is None:
        raise ValueError("format_instant needs an aware datetime")
    return instant.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def timestamp(instant: datetime) -> str:
    """The form documents and journal lines show: milliseconds, ``2026-05-01T09:00:00.123Z``."""
    return format_instant(instant, "milliseconds")


def pinned_instant() -> datetime | None:
    """The instant in the test clock file, or ``None`` when the test clock is off."""
    path = clock_file()
    if path is None:
        return None
    try:
        return parse_instant(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ClockFileInvalid(
            f"{path}: the test clock file must hold one RFC 3339 instant"
        ) from exc


def now() -> datetime:
    """The current instant (aware, UTC): the test clock's when it is on, else the wall clock."""
    instant = pinned_instant()
    return instant if instant is not None else datetime.now(UTC)


async def apply_to(conn: Any) -> None:
    """Make ``now()`` in SQL agree with :func:`now` for the current transaction.

    Call it first inside every transaction. It does nothing when the test clock is off;
    outside a transaction the setting would not stick (``set_config(..., true)`` is local).
    """
    instant = pinned_instant()
    if instant is None:
        return
    await statements.clock_fake_now_set(conn, setting=SETTING, instant=format_instant(instant))


def write_test_clock(path: Path, instant: datetime) -> None:
    """Set the test clock file to ``instant`` atomically (for tests and test harnesses)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".clock-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(format_instant(instant) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
