"""The coordinator's test clock for in-process integration tests, pinned to :data:`T0`.

``tests/integration/conftest.py`` offers :func:`fake_clock` to every integration test.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.clock import ENV_VAR, write_test_clock

T0 = datetime(2027, 3, 1, 8, 0, tzinfo=UTC)
"""Where the test clock starts."""


@pytest.fixture
def fake_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[datetime], None]:
    """Turn the test clock on at T0; the returned function moves it."""
    path = tmp_path / "clock"
    write_test_clock(path, T0)
    monkeypatch.setenv(ENV_VAR, str(path))
    return lambda instant: write_test_clock(path, instant)
