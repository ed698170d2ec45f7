"""coordinatorctl --help: flags shown as flags, the operator's words instead of Python types,
a help text for every option, 80 columns, environment defaults and shell completion."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.rich_utils

from cli.main import app, main

CTL = Path(sys.executable).with_name("coordinatorctl")
# typer's type placeholders: <bool>, <str>, <path>, <list[str]>, <int range>, <text|json>…
PLACEHOLDER = re.compile(r"<[a-z][^<>]*>")


def commands(command: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group of the CLI with its path (the root is ``()``)."""
    yield prefix, command
    subcommands = getattr(command, "commands", None)
    if isinstance(subcommands, dict):
        for name, subcommand in sorted(subcommands.items()):
            yield from commands(subcommand, (*prefix, name))


ALL = list(commands(typer.main.get_command(app)))
IDS = [" ".join(path) or "coordinatorctl" for path, _ in ALL]


@pytest.fixture(autouse=True)
def _plain_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("COORDINATOR_URL", raising=False)
    monkeypatch.delenv("COORDINATOR_TOKEN_FILE", raising=False)
    # Whatever the environment running the tests says (TERMINAL_WIDTH, FORCE_COLOR).
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", False)


def help_text(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--help"])
    assert exited.value.code == 0
    out: str = capsys.readouterr().out
    return out


def test_every_command_is_covered() -> None:
    assert {"", "check", "workflow check", "complete-execution-recovery", "list"} <= set(
        " ".join(path) for path, _ in ALL
    )
    assert len(ALL) > 20


@pytest.mark.parametrize(("path", "command"), ALL, ids=IDS)
def test_help_fits_80_columns_and_shows_no_type_placeholders(
    path: tuple[str, ...], command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_text(path, capsys)
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert too_wide == []
    assert PLACEHOLDER.findall(text) == []
    assert "<bool>" not in text and "<list" not in text
    # Every option is shown whole (a squeezed column would cut it with an ellipsis).
    for param in command.get_params(typer.Context(command)):
        for name in param.opts:
            if name.startswith("--"):
                assert name in text, f"{name} is not shown whole"


@pytest.mark.parametrize(("path", "command"), ALL, ids=IDS)
def test_every_option_and_argument_has_help(path: tuple[str, ...], command: Any) -> None:
    params = command.get_params(typer.Context(command))
    assert params
    without = [param.name for param in params if not (getattr(param, "help", None) or "").strip()]
    assert without == []


def test_a_flag_takes_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(("complete-execution-recovery",), capsys)
    line = next(line for line in text.splitlines() if "--execution-history-complete" in line)
    # Nothing between the flag and its help: no placeholder of any kind.
    after = line.split("--execution-history-complete", 1)[1].strip(" │")
    assert after.startswith("State that")
    retain = help_text(("retain",), capsys)
    assert re.search(r"--before\s+INSTANT", retain)
    assert re.search(r"--limit\s+N\s", retain)


@pytest.mark.parametrize("command", ["doctor", "list", "retain", "cancel"])
def test_environment_defaults_are_shown(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text((command,), capsys)
    assert "COORDINATOR_URL" in text
    assert "COORDINATOR_TOKEN_FILE" in text


def test_list_options_say_what_they_do(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(("list",), capsys)
    for option in ("--attention", "--state", "--workflow", "--limit", "--cursor"):
        line = next(line for line in text.splitlines() if option in line)
        assert re.search(r"[A-Za-z]{3,}", line.split(option, 1)[1]), line


def test_completion_options_exist(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text((), capsys)
    assert "--install-completion" in text
    assert "--show-completion" in text


def _ctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CTL), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )


def test_show_completion_prints_a_bash_script() -> None:
    shown = _ctl(
        "--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    )
    assert shown.returncode == 0, shown.stderr
    assert "_COORDINATORCTL_COMPLETE=complete_bash" in shown.stdout
    assert "complete " in shown.stdout


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [
        ("coordinatorctl workflow ch", "2", "check"),
        ("coordinatorctl retain --dr", "2", "--dry-run"),
        ("coordinatorctl complete-exec", "1", "complete-execution-recovery"),
    ],
)
def test_completion_completes_commands_and_options(words: str, cword: str, expected: str) -> None:
    completed = _ctl(
        env={"_COORDINATORCTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword}
    )
    assert completed.returncode == 0, completed.stderr
    assert expected in completed.stdout.split()
