"""What the failover tier (``tests/ha``) needs on its host, fetched by ``make ha-host``.

- **etcd**, Patroni's consensus store: Debian's ``etcd-server`` (root installs it; the
  tier starts ``etcd`` itself, with no service manager).
- **The complete PostgreSQL 17.10 build** (:mod:`devstack.pg_complete`): Patroni clones a
  standby with ``pg_basebackup``, reads ``pg_controldata`` and rejoins a former primary
  with ``pg_rewind``, none of which the npm build has.
- **Patroni** 4.1.5 in a virtual environment of its own, ``.cache/ha/patroni``, installed
  from ``devstack/ha/requirements.lock`` (every file pinned by hash; ``make ha-lock``
  writes it again from ``requirements.in``). Patroni runs PostgreSQL, which refuses to run
  as root, so it runs as the server's unprivileged user: its environment is made from
  Debian's ``/usr/bin/python3`` (``python3-venv`` installed when missing), whose files
  that user may read, never from a Python under ``/root``.

Run ``python -m devstack.ha_host``; a second run finds everything in place and returns.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from devstack import debian
from devstack.pg_complete import CompleteBuildError, ensure_complete_build
from devstack.pinned_pip import pinned_pip

CHECKOUT: Final = Path(__file__).resolve().parents[1]
CACHE: Final = CHECKOUT / ".cache" / "ha"
LOCK: Final = Path(__file__).with_name("ha") / "requirements.lock"
SYSTEM_PYTHON: Final = Path("/usr/bin/python3")
PACKAGES: Final = ("etcd-server", "python3-venv")
PATRONI_VENV: Final = CACHE / "patroni"


class HaHostError(RuntimeError):
    """Something the failover tier needs is missing and could not be installed."""


@dataclass(frozen=True)
class HaTools:
    """Where the failover tier's programs are."""

    etcd: Path
    patroni: Path
    patronictl: Path
    postgres_bin: Path
    """The complete build's ``bin`` folder (``postgres``, ``pg_basebackup``, ``pg_rewind``...)."""


def _stamp() -> Path:
    return PATRONI_VENV / ".installed-from"


def _patroni_venv() -> None:
    lock_text = LOCK.read_text("utf-8")
    if _stamp().is_file() and _stamp().read_text("utf-8") == lock_text:
        return
    if not SYSTEM_PYTHON.is_file():
        raise HaHostError(f"the failover tier needs {SYSTEM_PYTHON} (Debian's python3)")
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--clear", str(PATRONI_VENV)], check=True)
    # python-etcd and ydiff exist as source archives alone (pure Python): they are built with
    # the environment's own setuptools, so nothing is fetched that the lock does not pin.
    failed = pinned_pip(PATRONI_VENV / "bin" / "python", "install", LOCK, "--no-build-isolation")
    if failed is not None:
        raise HaHostError(f"pip could not install Patroni:\n{failed}")
    # Readable and runnable by the server's unprivileged user, like the build.
    for path in [CACHE, *CACHE.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    _stamp().write_text(lock_text, "utf-8")


def ensure_ha_tools() -> HaTools:
    """Everything the failover tier runs, installed or fetched when missing."""
    try:
        debian.ensure(PACKAGES, needed_by="the failover tests", make_target="ha-host")
        build = ensure_complete_build()
    except (debian.PackagesMissing, CompleteBuildError) as exc:
        raise HaHostError(str(exc)) from None
    CACHE.mkdir(parents=True, exist_ok=True)
    _patroni_venv()
    return ha_tools(build / "bin")


def ha_tools(postgres_bin: Path) -> HaTools:
    """The tools' paths once :func:`ensure_ha_tools` ran."""
    return HaTools(
        etcd=Path("/usr/bin/etcd"),
        patroni=PATRONI_VENV / "bin" / "patroni",
        patronictl=PATRONI_VENV / "bin" / "patronictl",
        postgres_bin=postgres_bin,
    )


def main() -> int:
    """Install or fetch what is missing; print where each tool is."""
    try:
        tools = ensure_ha_tools()
    except (HaHostError, subprocess.CalledProcessError) as exc:
        print(f"ha-host: {exc}", file=sys.stderr)
        return 1
    for name, path in vars(tools).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
