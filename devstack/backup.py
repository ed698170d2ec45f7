"""An online physical backup of a local PostgreSQL server, and a restore into a fresh one.

The embedded PostgreSQL build ships ``initdb``, ``pg_ctl`` and ``postgres`` only — no
``pg_dump`` or ``pg_basebackup`` — and the distribution's client tools are older than the
server and refuse it. So the backup uses the server's low-level API, which is what
``pg_basebackup`` itself wraps. The order of things:

1. On one superuser session (the two calls must share it): ``pg_backup_start(label,
   fast => true)`` — an immediate checkpoint; from here the server writes full pages to the
   WAL even where ``full_page_writes`` is off, so pages torn by the copy are repaired on
   replay.
2. Copy the data folder while the server keeps serving. Left out: the postmaster's own
   files, and the contents of the folders the server rebuilds at start (``pg_wal`` comes
   later; ``pg_stat_tmp``, ``pg_replslot``, ``pg_dynshmem``, ``pg_notify``, ``pg_serial``,
   ``pg_snapshots``, ``pg_subtrans``) — the folders themselves are kept. A file that
   vanishes meanwhile (a dropped relation) is simply not copied.
3. ``pg_backup_stop(wait_for_archive => false)`` answers the backup label (written as
   ``backup_label`` in the copy) and the tablespace map (written only when not empty).
4. Copy ``pg_wal`` now, so the WAL from the backup's checkpoint to its end is there and
   the copy can reach a consistent state without an archive.
5. The copy belongs to the server's unprivileged OS user, folders mode 0700.

:func:`restore` starts a new :class:`RestoredServer` on a second copy of the backup (the
backup stays reusable): a new folder, a new port, the settings file rewritten for them,
and everything else — TLS certificate and key, roles, passwords, databases — as the backup
holds it. The server replays the WAL the backup carries before it accepts connections.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from devstack.postgres import (
    HarnessError,
    OsUser,
    PostgresServer,
    _run_coroutine,
    _scratch_parent,
    _traversable_by_others,
    ensure_os_user,
    find_bin_dir,
)

DEFAULT_LABEL = "coordinator-backup"
# The postmaster's own files: a copy holding them would look like a running server.
_SKIPPED_FILES = frozenset({"postmaster.pid", "postmaster.opts", "backup_label", "tablespace_map"})
# Folders whose contents the server rebuilds at start (pg_wal is copied after the stop).
_EMPTIED_DIRS = frozenset(
    {
        "pg_wal",
        "pg_stat_tmp",
        "pg_replslot",
        "pg_dynshmem",
        "pg_notify",
        "pg_serial",
        "pg_snapshots",
        "pg_subtrans",
    }
)


@dataclass(frozen=True)
class BaseBackup:
    """One online base backup: the copied data folder and what a restore needs with it."""

    folder: Path
    """The copied data folder (holds ``backup_label``), owned by the server's OS user."""
    label: str
    start_lsn: str
    stop_lsn: str
    ca_pem: bytes | None = field(repr=False)
    """The private CA of the backed-up server, whose certificate the copy carries."""
    migration_role: str
    runtime_role: str
    migration_password: str = field(repr=False)
    runtime_password: str = field(repr=False)
    default_database: str | None
    os_user: OsUser | None

    def remove(self) -> None:
        """Delete the backup's folder."""
        shutil.rmtree(self.folder.parent, ignore_errors=True)


# --------------------------------------------------------------------------------- copying


def _chown_tree(root: Path, user: OsUser | None) -> None:
    if user is None:
        return
    os.chown(root, user.uid, user.gid)
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), user.uid, user.gid, follow_symlinks=False)


def _copy_file(source: Path, target: Path) -> None:
    # A file removed while the server ran on (a dropped relation, a recycled segment) is
    # not needed: the WAL replay knows it is gone.
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(source, target, follow_symlinks=False)


def _copy_data_folder(source: Path, target: Path) -> None:
    """Step 2: everything but the postmaster's files and the rebuilt folders' contents."""
    target.mkdir(mode=0o700)
    for folder, dirs, files in os.walk(source):
        relative = Path(folder).relative_to(source)
        destination = target / relative
        if relative.parts and relative.parts[0] in _EMPTIED_DIRS:
            dirs[:] = []
            continue
        for name in dirs:
            (destination / name).mkdir(mode=0o700, exist_ok=True)
        for name in files:
            if relative == Path(".") and name in _SKIPPED_FILES:
                continue
            if name.startswith("pgsql_tmp"):
                continue
            _copy_file(Path(folder) / name, destination / name)
    for name in _EMPTIED_DIRS:
        if (source / name).is_dir():
            (target / name).mkdir(mode=0o700, exist_ok=True)


def _copy_wal(source: Path, target: Path) -> None:
    """Step 4: the WAL written up to now, with its sub-folders (archive status, summaries)."""
    for folder, dirs, files in os.walk(source / "pg_wal"):
        relative = Path(folder).relative_to(source)
        for name in dirs:
            (target / relative / name).mkdir(mode=0o700, exist_ok=True)
        for name in files:
            _copy_file(Path(folder) / name, target / relative / name)


def _write_owned(path: Path, text: str, user: OsUser | None) -> None:
    path.write_text(text, "utf-8")
    os.chmod(path, 0o600)
    if user is not None:
        os.chown(path, user.uid, user.gid)


# ---------------------------------------------------------------------------------- backup


async def abackup(
    server: PostgresServer, destination: Path | None = None, *, label: str = DEFAULT_LABEL
) -> BaseBackup:
    """Take an online base backup of ``server`` into ``destination`` (a new folder)."""
    if destination is None:
        scratch = _scratch_parent(False)
        destination = Path(tempfile.mkdtemp(prefix="coordinator-backup-", dir=scratch))
    else:
        destination.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(destination, 0o700)
    copy = destination / "data"
    conn = await server.superuser_connect()
    try:
        start_lsn = str(
            await conn.fetchval("SELECT pg_backup_start($1, fast => true)::text", label)
        )
        try:
            await asyncio.to_thread(_copy_data_folder, server.data_dir, copy)
        finally:
            # Always end the backup, or the server keeps forcing full-page writes.
            stop = await conn.fetchrow(
                "SELECT lsn::text AS lsn, labelfile, spcmapfile"
                " FROM pg_backup_stop(wait_for_archive => false)"
            )
    finally:
        await conn.close()
    if stop is None:
        raise HarnessError("pg_backup_stop answered nothing")
    await asyncio.to_thread(_copy_wal, server.data_dir, copy)
    user = server.os_user
    _write_owned(copy / "backup_label", str(stop["labelfile"]), user)
    if stop["spcmapfile"]:
        _write_owned(copy / "tablespace_map", str(stop["spcmapfile"]), user)
    os.chmod(copy, 0o700)
    _chown_tree(destination, user)
    default = server._default
    return BaseBackup(
        folder=copy,
        label=label,
        start_lsn=start_lsn,
        stop_lsn=str(stop["lsn"]),
        ca_pem=server.ca_pem,
        migration_role=server.migration_role,
        runtime_role=server.runtime_role,
        migration_password=server._migration_password,
        runtime_password=server._runtime_password,
        default_database=None if default is None else default.database,
        os_user=user,
    )


def backup(
    server: PostgresServer, destination: Path | None = None, *, label: str = DEFAULT_LABEL
) -> BaseBackup:
    """Synchronous :func:`abackup`."""
    return _run_coroutine(abackup(server, destination, label=label))


# --------------------------------------------------------------------------------- restore


class RestoredServer(PostgresServer):
    """A server started on a copy of a :class:`BaseBackup` instead of a fresh ``initdb``."""

    @classmethod
    def from_backup(cls, source: BaseBackup, *, max_connections: int = 200) -> RestoredServer:
        """Copy the backup into a new folder, start a server on it and wait until it serves."""
        user = ensure_os_user() if os.geteuid() == 0 else None
        base = Path(tempfile.mkdtemp(prefix="coordinator-pg-restored-", dir=_scratch_parent(False)))
        os.chmod(base, 0o700)
        server = cls(
            bin_dir=find_bin_dir(),
            base_dir=base,
            remove_base=True,
            os_user=user,
            durable=False,
            max_connections=max_connections,
        )
        # The roles and their verifiers are in the copy; the harness needs the passwords.
        server.migration_role = source.migration_role
        server.runtime_role = source.runtime_role
        server._migration_password = source.migration_password
        server._runtime_password = source.runtime_password
        server.ca_pem = source.ca_pem
        atexit.register(server.stop)
        try:
            server._prepare_from(source)
            server._launch()
        except BaseException:
            server.stop()
            raise
        if source.default_database is not None:
            server._default = server.handle(source.default_database)
        return server

    def _prepare_from(self, source: BaseBackup) -> None:
        if self.os_user is not None:
            self._chown(self.base_dir)
            # The same readable-binaries rule as a fresh server (e.g. a clone under /root).
            postgres = self.bin_dir / "postgres"
            if not (
                _traversable_by_others(self.bin_dir)
                and postgres.stat().st_mode & stat.S_IROTH
                and postgres.stat().st_mode & stat.S_IXOTH
            ):
                copy = self.base_dir / "pgsql"
                shutil.copytree(self.bin_dir.parent, copy, symlinks=True)
                self.bin_dir = copy / self.bin_dir.name
        self.socket_dir.mkdir(mode=0o700)
        self._chown(self.socket_dir)
        shutil.copytree(source.folder, self.data_dir, symlinks=True)
        os.chmod(self.data_dir, 0o700)
        _chown_tree(self.data_dir, self.os_user)
        if self.ca_pem:
            (self.base_dir / "ca.pem").write_bytes(self.ca_pem)


def restore(source: BaseBackup) -> RestoredServer:
    """Start a fresh server on a copy of ``source`` (see the module docstring)."""
    return RestoredServer.from_backup(source)


async def is_primary(server: PostgresServer) -> bool:
    """True once the server has left recovery and accepts writes."""
    conn = await server.superuser_connect()
    try:
        return not bool(await conn.fetchval("SELECT pg_is_in_recovery()"))
    finally:
        await conn.close()
