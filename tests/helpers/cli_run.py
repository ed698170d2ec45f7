"""Run ``coordinatorctl`` in process, as its console script would, and read what it said."""

from __future__ import annotations

import pytest

from cli.main import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``coordinatorctl ARGS``: its exit status, standard output and standard error."""
    with pytest.raises(SystemExit) as exited:
        main(args)
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), out, err
