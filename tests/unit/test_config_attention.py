"""deployment.attention in the runtime file: when a call that keeps being retried makes its
run ask for attention (CONTRACT §5, §8.4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import check_runtime_file
from core.config.model import Attention
from core.errors import ConfigInvalid
from tests.helpers.runtime_files import assert_refused_at, complete_runtime, put, write_runtime

KEY = "deployment.attention.retryingAfterSeconds"


def test_absent_means_ten_minutes(tmp_path: Path) -> None:
    document = complete_runtime(tmp_path)
    checked = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert checked.config.deployment.attention == Attention(retrying_after_seconds=600)


@pytest.mark.parametrize("seconds", [60, 601, 86400])
def test_a_value_in_bounds_is_read(tmp_path: Path, seconds: int) -> None:
    document = complete_runtime(tmp_path)
    put(("deployment", "attention"), {"retryingAfterSeconds": seconds})(document, tmp_path)
    checked = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert checked.config.deployment.attention.retrying_after_seconds == seconds


def test_an_empty_block_keeps_the_default(tmp_path: Path) -> None:
    document = complete_runtime(tmp_path)
    put(("deployment", "attention"), {})(document, tmp_path)
    checked = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert checked.config.deployment.attention.retrying_after_seconds == 600


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (59, "must be between 60 and 86400"),
        (86401, "must be between 60 and 86400"),
        (0, "must be between 60 and 86400"),
        (-600, "must be between 60 and 86400"),
        (600.5, "must be an integer"),
        ("600", "must be an integer"),
        (True, "must be an integer"),
        (None, "must be an integer"),
    ],
)
def test_a_value_out_of_bounds_or_not_an_integer_is_refused_naming_the_key(
    tmp_path: Path, value: object, says: str
) -> None:
    mutation = put(("deployment", "attention"), {"retryingAfterSeconds": value})
    assert_refused_at(tmp_path / "one", mutation, KEY)
    document = complete_runtime(tmp_path / "two")
    mutation(document, tmp_path / "two")
    with pytest.raises(ConfigInvalid) as caught:
        check_runtime_file(write_runtime(tmp_path / "two" / "runtime.yaml", document))
    assert caught.value.cli_line() == f"coordinator.config.invalid: {KEY}: {says}"


@pytest.mark.parametrize(
    ("block", "path"),
    [
        ({"retryingAfter": 600}, "deployment.attention.retryingAfter"),
        ("600", "deployment.attention"),
    ],
)
def test_an_unknown_key_or_a_block_that_is_no_mapping_is_refused_by_path(
    tmp_path: Path, block: object, path: str
) -> None:
    assert_refused_at(tmp_path, put(("deployment", "attention"), block), path)
