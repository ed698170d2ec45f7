"""Strict YAML: plain data only."""

from __future__ import annotations

import pytest

from core.errors import ConfigInvalid
from core.yamlsafe import load


def refuse(text: str) -> ConfigInvalid:
    with pytest.raises(ConfigInvalid) as raised:
        load(text, ConfigInvalid)
    return raised.value


def test_plain_document_loads() -> None:
    assert load("a: 1\nb: [x, 'y']\nc: {d: true}\n", ConfigInvalid) == {
        "a": 1,
        "b": ["x", "y"],
        "c": {"d": True},
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: &x 1\nb: *x\n", "anchors"),
        ("a: [1]\nb: *x\n", "aliases"),
        ("a: !secret value\n", "tags"),
        ("a: !!str 5\n", "tags"),
        ("a: 1\n---\nb: 2\n", "one YAML document"),
        ("a: [1\n", "not valid YAML"),
    ],
)
def test_refusals(text: str, words: str) -> None:
    assert words in refuse(text).reason


def test_duplicate_key_names_its_path() -> None:
    error = refuse("outer:\n  list:\n    - {k: 1, k: 2}\n")
    assert error.path == "outer.list[0].k"
    assert error.reason == "duplicate key (line 3, column 14; first at line 3)"


def test_timestamps_stay_strings() -> None:
    assert load("at: 2026-10-12T10:00:00Z\n", ConfigInvalid) == {"at": "2026-10-12T10:00:00Z"}


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "Yes", "NO"])
def test_yaml_1_1_booleans_stay_strings(word: str) -> None:
    assert load(f"v: {word}\n", ConfigInvalid) == {"v": word}


@pytest.mark.parametrize(("word", "value"), [("true", True), ("False", False), ("TRUE", True)])
def test_true_and_false_are_booleans(word: str, value: bool) -> None:
    assert load(f"v: {word}\n", ConfigInvalid) == {"v": value}


def test_parser_errors_do_not_echo_the_line() -> None:
    error = refuse("password: 's3cr3t-value\n")
    assert "s3cr3t" not in str(error)
