"""Debian packages a test tier needs on its host, installed by the make target that needs them.

Only root may install, and only with ``apt-get``; anyone else is told the command to run.
Nothing is installed that is already there, so a second run costs a ``dpkg-query`` a package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


class PackagesMissing(RuntimeError):
    """Packages are missing and this process may not install them."""


def installed(name: str) -> bool:
    """Whether Debian package ``name`` is installed."""
    found = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", name],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.returncode == 0 and found.stdout.endswith(" installed")


def ensure(packages: Sequence[str], *, needed_by: str, make_target: str) -> None:
    """Install whichever of ``packages`` is missing (root only), with no recommended extras.

    ``needed_by`` ("the deploy tests") and ``make_target`` ("deploy-host") word the refusal
    that anyone but root gets.
    """
    missing = [name for name in packages if not installed(name)]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PackagesMissing(
            f"{needed_by} need Debian's packages "
            + " and ".join(missing)
            + f": run `make {make_target}` as root (apt-get install --no-install-recommends "
            + " ".join(missing)
            + ")"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
