"""pip run the one way the development tools use it: every file pinned by hash, nothing
fetched beyond the list (``--no-deps``), quiet."""

from __future__ import annotations

import subprocess
from pathlib import Path


def pinned_pip(python: Path | str, command: str, requirements: Path, *extra: str) -> str | None:
    """``python -m pip COMMAND … -r requirements`` with ``--require-hashes --no-deps`` and
    ``extra``; answers the tail of pip's error output when it failed, ``None`` otherwise."""
    found = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            command,
            "--quiet",
            "--disable-pip-version-check",
            "--require-hashes",
            "--no-deps",
            *extra,
            "-r",
            str(requirements),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if found.returncode == 0 else found.stderr[-3000:]
