"""deployment.logging in the runtime file: level and format, with their defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import check_runtime_file
from core.config.model import Logging
from tests.helpers.runtime_files import assert_refused_at, complete_runtime, put, write_runtime


def test_absent_means_notice_and_text(tmp_path: Path) -> None:
    document = complete_runtime(tmp_path)
    checked = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert checked.config.deployment.logging == Logging(level="notice", format="text")


def test_level_and_format_are_read(tmp_path: Path) -> None:
    document = complete_runtime(tmp_path)
    put(("deployment", "logging"), {"level": "info", "format": "json"})(document, tmp_path)
    checked = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert checked.config.deployment.logging == Logging(level="info", format="json")


@pytest.mark.parametrize(
    ("block", "path"),
    [
        ({"level": "verbose"}, "deployment.logging.level"),
        ({"format": "xml"}, "deployment.logging.format"),
        ({"colour": True}, "deployment.logging.colour"),
    ],
)
def test_an_unknown_level_format_or_key_is_refused_by_path(
    tmp_path: Path, block: dict[str, object], path: str
) -> None:
    assert_refused_at(tmp_path, put(("deployment", "logging"), block), path)
