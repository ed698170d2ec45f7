"""A real PostgreSQL server with TLS on, for tests and the local stack.

``PostgresServer.start()`` runs ``initdb`` and ``pg_ctl`` from the pinned build (see
``devstack.fetch_postgres``) or from ``COORDINATOR_POSTGRES_BIN``, in a private temporary
folder. The server:

- serves TCP on 127.0.0.1 only, with TLS from a private CA made for this server; plain-text
  TCP is rejected by ``pg_hba.conf`` and TCP logins use SCRAM-SHA-256;
- has a Unix socket, reachable only by its OS user (and root), on which the bootstrap
  superuser logs in without a password; nobody else may use the socket;
- has two login roles: the migration role (owns each database, may create roles for
  ``apply``, not a superuser) and ``coordinator_runtime`` (no attributes, CONNECT only).

As root (CI), PostgreSQL refuses to run, so the server runs as the unprivileged OS user
``coordinator-pg``, created on first use. ``ExternalPostgres`` offers the same database API
over a server that someone else runs (``COORDINATOR_TEST_DATABASE_URL``).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import concurrent.futures
import contextlib
import hashlib
import hmac
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

import asyncpg

from core.db.connect import connect, quote_ident
from devstack import fetch_postgres
from devstack.postgres_tls import CertificateAuthority

BIN_ENV = "COORDINATOR_POSTGRES_BIN"
MAJOR_ENV = "COORDINATOR_POSTGRES_MAJOR"
TMPDIR_ENV = "COORDINATOR_POSTGRES_TMPDIR"
OS_USER = "coordinator-pg"
BOOTSTRAP_USER = "postgres"
MIGRATION_ROLE = "coordinator_migrator"
RUNTIME_ROLE = "coordinator_runtime"
DEFAULT_DATABASE = "coordinator"
LOOPBACK = "127.0.0.1"
_START_TIMEOUT_S = 60
_WAIT_TEXT = str(_START_TIMEOUT_S)
_PORT_ATTEMPTS = 5
_SHM_MINIMUM_BYTES = 2 << 30

# Characters that all mean something inside a URL; every generated password carries several so
# that any code which forgets to percent-encode or decode breaks in tests, not in production.
_URL_METACHARACTERS = "@:/?#%&=+$,;[]!*'()~ "
_PLAIN = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"

T = TypeVar("T")


class HarnessError(RuntimeError):
    """The PostgreSQL harness could not do what was asked (never carries a password)."""


# --------------------------------------------------------------------------- small helpers


def make_password(length: int = 32) -> str:
    """A random password that mixes letters with URL metacharacters (ASCII, SASLprep-neutral)."""
    rng = secrets.SystemRandom()
    chars = [rng.choice(_PLAIN) for _ in range(length - 8)]
    chars += [rng.choice(_URL_METACHARACTERS) for _ in range(8)]
    rng.shuffle(chars)
    return "".join(chars)


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores, computed here so the password never
    reaches the server (or its logs) in clear."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def postgres_url(
    user: str,
    password: str,
    host: str,
    port: int,
    database: str,
    sslmode: str = "verify-full",
    *,
    more_hosts: tuple[tuple[str, int], ...] = (),
) -> str:
    """A ``postgresql://`` URL with every part percent-encoded; with ``more_hosts``, the
    servers to try after the first (libpq's form, with ``target_session_attrs=read-write``)."""

    def q(text: str) -> str:
        return urllib.parse.quote(text, safe="")

    def shown(host: str, port: int) -> str:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    hosts = ",".join(shown(h, p) for h, p in ((host, port), *more_hosts))
    query = f"sslmode={sslmode}" + ("&target_session_attrs=read-write" if more_hosts else "")
    return f"postgresql://{q(user)}:{q(password)}@{hosts}/{q(database)}?{query}"


def _write_private(path: Path, data: bytes) -> None:
    # Created 0600 from the start, never briefly readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from async code (e.g. an async fixture): use a private loop in a worker thread.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# --------------------------------------------------------------------------- database handles


@dataclass(frozen=True)
class SecretFiles:
    """Where ``write_secret_files`` put things (names match the runtime file examples)."""

    migration_url: Path
    runtime_url: Path
    trusted_root: Path | None  # None when the server's certificate chains to system roots


@dataclass(frozen=True)
class DatabaseHandle:
    """One database on a harness server and the two login roles' credentials for it."""

    database: str
    host: str
    port: int
    ca_pem: bytes | None = field(repr=False)
    migration_role: str
    runtime_role: str
    migration_password: str = field(repr=False)
    runtime_password: str = field(repr=False)
    more_hosts: tuple[tuple[str, int], ...] = ()
    """Servers to try after ``host`` (a standby a failover may promote), in order."""

    @property
    def migration_url(self) -> str:
        return postgres_url(
            self.migration_role,
            self.migration_password,
            self.host,
            self.port,
            self.database,
            more_hosts=self.more_hosts,
        )

    @property
    def runtime_url(self) -> str:
        return postgres_url(
            self.runtime_role,
            self.runtime_password,
            self.host,
            self.port,
            self.database,
            more_hosts=self.more_hosts,
        )

    def write_secret_files(self, secret_dir: Path, prefix: str = "") -> SecretFiles:
        """Write both URLs and the CA into ``secret_dir`` (0700), each file 0600.

        Files: ``<prefix>migration-db-url``, ``<prefix>runtime-db-url`` and, when the server
        has a private CA, ``<prefix>db-root.pem``. URL files hold the URL alone, no newline.
        """
        secret_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(secret_dir, 0o700)
        files = SecretFiles(
            migration_url=secret_dir / f"{prefix}migration-db-url",
            runtime_url=secret_dir / f"{prefix}runtime-db-url",
            trusted_root=secret_dir / f"{prefix}db-root.pem" if self.ca_pem else None,
        )
        _write_private(files.migration_url, self.migration_url.encode("utf-8"))
        _write_private(files.runtime_url, self.runtime_url.encode("utf-8"))
        if files.trusted_root is not None and self.ca_pem:
            _write_private(files.trusted_root, self.ca_pem)
        return files


class PostgresCluster(Protocol):
    """What tests need from a server, whether the harness runs it or someone else does."""

    host: str
    port: int
    ca_pem: bytes | None

    async def acreate_database(
        self, name: str, *, template: str | None = None
    ) -> DatabaseHandle: ...
    async def adrop_database(self, name: str) -> None: ...
    def create_database(self, name: str, *, template: str | None = None) -> DatabaseHandle: ...
    def drop_database(self, name: str) -> None: ...
    def stop(self) -> None: ...


async def _create_database_sql(
    conn: asyncpg.Connection, name: str, owner: str, runtime_role: str, template: str | None
) -> None:
    # CREATE DATABASE copies contents from the template but not the database's ACL, so the
    # CONNECT-only grant is set again on each new database.
    db = quote_ident(name)
    clause = f" TEMPLATE {quote_ident(template)} STRATEGY FILE_COPY" if template else ""
    await conn.execute(f"CREATE DATABASE {db} OWNER {quote_ident(owner)}{clause}")
    await conn.execute(f"REVOKE ALL ON DATABASE {db} FROM PUBLIC")
    await conn.execute(f"GRANT CONNECT ON DATABASE {db} TO {quote_ident(runtime_role)}")


# --------------------------------------------------------------------------- OS user and paths


@dataclass(frozen=True)
class OsUser:
    name: str
    uid: int
    gid: int


def ensure_os_user(name: str = OS_USER) -> OsUser:
    """The unprivileged user the server runs as when we are root; created if missing."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        result = subprocess.run(
            [
                useradd,
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        try:  # a concurrent session may have created it first
            entry = pwd.getpwnam(name)
        except KeyError:
            raise HarnessError(
                f"could not create OS user {name!r} (useradd: {result.stderr.strip()})"
            ) from None
    return OsUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _traversable_by_others(folder: Path) -> bool:
    """True when other users may pass through ``folder`` and every folder above it."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [folder, *folder.parents])


def _is_postmaster(pid: int) -> bool:
    # Guards against signalling an unrelated process that reused a stale pid.
    try:
        return Path(f"/proc/{pid}/comm").read_text("utf-8").strip() == "postgres"
    except OSError:
        return False


def find_bin_dir() -> Path:
    """``COORDINATOR_POSTGRES_BIN`` if set, else the pinned build (fetched if not cached)."""
    override = os.environ.get(BIN_ENV)
    if override:
        path = Path(override).resolve()
    else:
        major = int(os.environ.get(MAJOR_ENV, "17"))
        path = fetch_postgres.ensure_postgres(major)
    for tool in ("initdb", "pg_ctl", "postgres"):
        if not (path / tool).is_file():
            raise HarnessError(f"{path} holds no {tool} (set {BIN_ENV} to a PostgreSQL bin folder)")
    return path


def _scratch_parent(durable: bool) -> str | None:
    """Where a throw-away cluster goes: ``COORDINATOR_POSTGRES_TMPDIR``, else a roomy
    ``/dev/shm`` for non-durable clusters, else the system temporary folder."""
    override = os.environ.get(TMPDIR_ENV)
    if override:
        return override
    # Creating a database copies hundreds of small files; on this project's disks that takes
    # ~10x longer than in memory, and a test cluster need not survive a reboot.
    shm = "/dev/shm"  # noqa: S108 - a memory file system on purpose, used only when roomy
    if not durable and os.path.isdir(shm):
        with contextlib.suppress(OSError):
            fs = os.statvfs(shm)
            if fs.f_bavail * fs.f_frsize >= _SHM_MINIMUM_BYTES and os.access(shm, os.W_OK):
                return shm
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


# Runs in its own session beside the test process; if that process dies without stopping the
# server (SIGKILL, crash), stdin closes without the word "stopped" and the watchdog shuts the
# postmaster down (SIGQUIT = immediate shutdown) and removes the temporary folder.
_WATCHDOG = r"""
import os, select, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
pid, base, remove = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if sys.stdin.readline().strip() == "stopped":
    sys.exit(0)
try:
    handle = os.pidfd_open(pid)
    with open(f"/proc/{pid}/comm") as comm:
        if comm.read().strip() != "postgres":
            raise ProcessLookupError
    os.kill(pid, signal.SIGQUIT)
    select.select([handle], [], [], 30)
except OSError:  # already gone, or not a postmaster any more
    pass
if remove:
    shutil.rmtree(base, ignore_errors=True)
"""


# --------------------------------------------------------------------------- the server


class PostgresServer:
    """A running PostgreSQL server owned by this process. Use ``start()``; always ``stop()``."""

    host: str
    port: int
    ca_pem: bytes | None

    def __init__(
        self,
        *,
        bin_dir: Path,
        base_dir: Path,
        remove_base: bool,
        os_user: OsUser | None,
        durable: bool,
        max_connections: int,
        statement_statistics: bool = False,
    ) -> None:
        self.bin_dir = bin_dir
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.socket_dir = base_dir / "run"
        self.log_file = base_dir / "postgres.log"
        self.host = LOOPBACK
        self.port = 0
        self.ca_pem = None
        self.os_user = os_user
        self.migration_role = MIGRATION_ROLE
        self.runtime_role = RUNTIME_ROLE
        self._migration_password = make_password()
        self._runtime_password = make_password()
        self._remove_base = remove_base
        self._durable = durable
        self._max_connections = max_connections
        self._statement_statistics = statement_statistics
        self._running = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._default: DatabaseHandle | None = None

    # ---- lifecycle

    @classmethod
    def start(
        cls,
        workdir: Path | None = None,
        *,
        bin_dir: Path | None = None,
        durable: bool = False,
        max_connections: int = 200,
        default_database: str | None = DEFAULT_DATABASE,
        statement_statistics: bool = False,
    ) -> PostgresServer:
        """Create a cluster under ``workdir`` (default: a new temporary folder) and start it.

        ``durable=False`` turns off fsync, synchronous commit and full-page writes: a test
        setting that trades crash safety for speed. ``workdir`` is removed on stop only when
        the harness made it. ``statement_statistics`` preloads pg_stat_statements, counting
        the statements inside functions too (the bench's ``--profile``).
        """
        bins = bin_dir or find_bin_dir()
        user = ensure_os_user() if os.geteuid() == 0 else None
        if workdir is None:
            base = Path(tempfile.mkdtemp(prefix="coordinator-pg-", dir=_scratch_parent(durable)))
            remove = True
        else:
            base = workdir.resolve()
            base.mkdir(parents=True, exist_ok=True)
            remove = False
        os.chmod(base, 0o700)
        server = cls(
            bin_dir=bins,
            base_dir=base,
            remove_base=remove,
            os_user=user,
            durable=durable,
            max_connections=max_connections,
            statement_statistics=statement_statistics,
        )
        atexit.register(server.stop)
        try:
            server._prepare()
            server._launch()
            _run_coroutine(server._bootstrap(default_database))
        except BaseException:
            server.stop()
            raise
        return server

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut the server down (fast mode) and remove its folder if the harness made it."""
        atexit.unregister(self.stop)
        # Also when start() failed half-way: a postmaster may be up without pg_ctl saying so.
        if self._running or self._postmaster_pid() is not None:
            result = self._run_as_user(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "stop",
                    "-D",
                    str(self.data_dir),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    str(_START_TIMEOUT_S),
                ],
                check=False,
            )
            if result.returncode != 0 and self._postmaster_pid() is not None:
                self._kill_postmaster()
            self._running = False
        if self._watchdog is not None:
            with contextlib.suppress(OSError, ValueError):
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.write(b"stopped\n")
                self._watchdog.stdin.close()
            self._watchdog.wait(timeout=30)
            self._watchdog = None
        if self._remove_base:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self._remove_base = False

    def halt(self) -> None:
        """Stop the server (fast mode) but keep its folder, settings and port, so that
        :meth:`start_again` can bring the same cluster back (database-outage tests)."""
        pg_ctl = str(self.bin_dir / "pg_ctl")
        self._run_as_user(
            [pg_ctl, "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", _WAIT_TEXT]
        )
        self._running = False

    def start_again(self) -> None:
        """Start the cluster :meth:`halt` stopped, on the same port and data folder."""
        pg_ctl = str(self.bin_dir / "pg_ctl")
        log = str(self.log_file)
        self._run_as_user(
            [pg_ctl, "start", "-D", str(self.data_dir), "-l", log, "-w", "-t", _WAIT_TEXT],
            new_session=True,
        )
        self._running = True
        # The watchdog knows the old postmaster's pid: tell it that one stopped cleanly and
        # watch the new one instead.
        if self._watchdog is not None:
            with contextlib.suppress(OSError, ValueError):
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.write(b"stopped\n")
                self._watchdog.stdin.close()
            self._watchdog.wait(timeout=30)
        self._start_watchdog()

    # ---- connection details

    @property
    def superuser_dsn(self) -> str:
        """Bootstrap superuser over the Unix socket (no TLS, no password; socket is private)."""
        query = urllib.parse.urlencode({"host": str(self.socket_dir), "port": str(self.port)})
        return f"postgresql://{BOOTSTRAP_USER}@/postgres?{query}"

    async def superuser_connect(self, database: str = "postgres") -> asyncpg.Connection:
        """A superuser connection over the Unix socket, for harness and test set-up only."""
        return await asyncpg.connect(
            host=str(self.socket_dir),
            port=self.port,
            user=BOOTSTRAP_USER,
            database=database,
            ssl=False,
        )

    def handle(self, database: str) -> DatabaseHandle:
        """Credentials for an existing database on this server."""
        return DatabaseHandle(
            database=database,
            host=self.host,
            port=self.port,
            ca_pem=self.ca_pem,
            migration_role=self.migration_role,
            runtime_role=self.runtime_role,
            migration_password=self._migration_password,
            runtime_password=self._runtime_password,
        )

    @property
    def default(self) -> DatabaseHandle:
        """The database made at start (``coordinator`` unless told otherwise)."""
        if self._default is None:
            raise HarnessError("this server was started without a default database")
        return self._default

    def write_secret_files(self, secret_dir: Path, prefix: str = "") -> SecretFiles:
        """Secret files for the default database (see ``DatabaseHandle.write_secret_files``)."""
        return self.default.write_secret_files(secret_dir, prefix)

    # ---- databases

    async def acreate_database(self, name: str, *, template: str | None = None) -> DatabaseHandle:
        """Create a database owned by the migration role; the runtime role may only CONNECT."""
        conn = await self.superuser_connect()
        try:
            await _create_database_sql(conn, name, self.migration_role, self.runtime_role, template)
        finally:
            await conn.close()
        return self.handle(name)

    async def adrop_database(self, name: str) -> None:
        conn = await self.superuser_connect()
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
        finally:
            await conn.close()

    def create_database(self, name: str, *, template: str | None = None) -> DatabaseHandle:
        return _run_coroutine(self.acreate_database(name, template=template))

    def drop_database(self, name: str) -> None:
        _run_coroutine(self.adrop_database(name))

    # ---- internals

    def _run_as_user(
        self, args: list[str], *, check: bool = True, new_session: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.base_dir),
            "LC_ALL": "C",
            "LANG": "C",
            "TZ": "UTC",
        }
        extra: dict[str, Any] = {}
        if self.os_user is not None:
            extra = {"user": self.os_user.uid, "group": self.os_user.gid, "extra_groups": []}
        result = subprocess.run(
            args,
            cwd=self.base_dir,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            umask=0o077,
            start_new_session=new_session,
            **extra,
        )
        if check and result.returncode != 0:
            raise HarnessError(
                f"{Path(args[0]).name} failed ({result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-2000:]}\n{self._log_tail()}"
            )
        return result

    def _chown(self, path: Path) -> None:
        if self.os_user is not None:
            os.chown(path, self.os_user.uid, self.os_user.gid)

    def _prepare(self) -> None:
        if self.os_user is not None:
            self._chown(self.base_dir)
            if not _traversable_by_others(self.base_dir.parent):
                raise HarnessError(
                    f"{self.base_dir.parent} is not reachable by OS user {self.os_user.name}; "
                    "pick a workdir under a world-traversable folder"
                )
            postgres = self.bin_dir / "postgres"
            if not (
                _traversable_by_others(self.bin_dir)
                and postgres.stat().st_mode & stat.S_IROTH
                and postgres.stat().st_mode & stat.S_IXOTH
            ):
                # e.g. a clone under /root: give the server its own readable copy.
                copy = self.base_dir / "pgsql"
                shutil.copytree(self.bin_dir.parent, copy, symlinks=True)
                self.bin_dir = copy / self.bin_dir.name
        self.socket_dir.mkdir(mode=0o700)
        self._chown(self.socket_dir)
        self._run_as_user(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                BOOTSTRAP_USER,
                "--encoding=UTF8",
                "--locale=C",
                "--auth-local=trust",
                "--auth-host=reject",
                "--no-sync",
                "--no-instructions",
            ]
        )
        ca = CertificateAuthority.create()
        cert_pem, key_pem = ca.issue_server(("localhost", LOOPBACK))
        self.ca_pem = ca.pem
        (self.base_dir / "ca.pem").write_bytes(ca.pem)
        for name, data in (("server.crt", cert_pem), ("server.key", key_pem)):
            _write_private(self.data_dir / name, data)
            self._chown(self.data_dir / name)
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text(
            "# Written by devstack.postgres: TLS-only TCP with SCRAM, superuser on the socket.\n"
            f"local     all  {BOOTSTRAP_USER}  trust\n"
            "local     all  all        reject\n"
            "hostnossl all  all        0.0.0.0/0  reject\n"
            "hostnossl all  all        ::/0       reject\n"
            f"hostssl   all  {BOOTSTRAP_USER}  0.0.0.0/0  reject\n"
            f"hostssl   all  {BOOTSTRAP_USER}  ::/0       reject\n"
            "hostssl   all  all        127.0.0.1/32  scram-sha-256\n"
            "hostssl   all  all        ::1/128       scram-sha-256\n",
            "utf-8",
        )
        self._chown(hba)
        with (self.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\ninclude_if_exists = 'coordinator.conf'\n")

    def _write_settings(self) -> None:
        lines = [
            f"listen_addresses = '{LOOPBACK}'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.socket_dir}'",
            "unix_socket_permissions = 0700",
            "ssl = on",
            "ssl_cert_file = 'server.crt'",
            "ssl_key_file = 'server.key'",
            "ssl_min_protocol_version = 'TLSv1.2'",
            "password_encryption = 'scram-sha-256'",
            f"max_connections = {self._max_connections}",
            "log_connections = off",
        ]
        if not self._durable:
            # Test setting: a crash of the test machine may corrupt this throw-away cluster.
            lines += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        if self._statement_statistics:
            lines += [
                "shared_preload_libraries = 'pg_stat_statements'",
                "pg_stat_statements.track = all",
                "pg_stat_statements.max = 5000",
            ]
        path = self.data_dir / "coordinator.conf"
        path.write_text("\n".join(lines) + "\n", "utf-8")
        self._chown(path)

    def _launch(self) -> None:
        for _attempt in range(_PORT_ATTEMPTS):
            self.port = _free_port()
            self._write_settings()
            result = self._run_as_user(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "start",
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-w",
                    "-t",
                    str(_START_TIMEOUT_S),
                ],
                check=False,
                new_session=True,
            )
            if result.returncode == 0:
                self._running = True
                self._start_watchdog()
                return
            if "could not bind" not in self._log_tail():
                raise HarnessError(
                    f"pg_ctl start failed: {result.stderr.strip()}\n{self._log_tail()}"
                )
        raise HarnessError("no free port found for PostgreSQL after several attempts")

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text("utf-8").splitlines()[0]
            return int(first)
        except (OSError, ValueError, IndexError):
            return None

    def _kill_postmaster(self) -> None:
        pid = self._postmaster_pid()
        if pid is None or not _is_postmaster(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            handle = os.pidfd_open(pid)
            try:
                os.kill(pid, signal.SIGQUIT)
                select.select([handle], [], [], _START_TIMEOUT_S)
            finally:
                os.close(handle)

    def _start_watchdog(self) -> None:
        pid = self._postmaster_pid()
        if pid is None:
            raise HarnessError("the server started but left no postmaster.pid")
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WATCHDOG,
                str(pid),
                str(self.base_dir),
                "1" if self._remove_base else "0",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_file.read_text("utf-8", "replace").splitlines()[-20:])
        except OSError:
            return ""

    async def _bootstrap(self, default_database: str | None) -> None:
        conn = await self.superuser_connect()
        try:
            await conn.execute(
                f"CREATE ROLE {quote_ident(self.migration_role)} LOGIN NOSUPERUSER NOBYPASSRLS "
                f"NOCREATEDB CREATEROLE PASSWORD '{scram_verifier(self._migration_password)}'"
            )
            # NOINHERIT: memberships granted later (component roles) act only after SET ROLE.
            await conn.execute(
                f"CREATE ROLE {quote_ident(self.runtime_role)} LOGIN NOSUPERUSER NOBYPASSRLS "
                f"NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT "
                f"PASSWORD '{scram_verifier(self._runtime_password)}'"
            )
            # The stock databases stay reserved for the harness.
            for stock in ("postgres", "template1"):
                await conn.execute(f"REVOKE ALL ON DATABASE {stock} FROM PUBLIC")
        finally:
            await conn.close()
        if default_database is not None:
            self._default = await self.acreate_database(default_database)


# --------------------------------------------------------------------------- someone else's server


class ExternalPostgres:
    """The harness API over a running PostgreSQL 17+ reached through a migration URL.

    Limits: the URL's role must have CREATEDB (one database per test) and CREATEROLE (to
    create ``coordinator_runtime``, or reset its password if this role administers it). The
    migration role is the URL's own role. ``stop()`` drops nothing it did not create.
    """

    def __init__(self, migration_url: str, ca_pem: bytes | None) -> None:
        from core.db.connect import parse_database_url

        parsed = parse_database_url(migration_url, label="COORDINATOR_TEST_DATABASE_URL")
        self._url = migration_url
        self.host = parsed.host
        self.port = parsed.port
        self.ca_pem = ca_pem
        self.migration_role = parsed.user
        self._migration_password = parsed.password or ""
        self.runtime_role = RUNTIME_ROLE
        self._runtime_password = make_password()
        self._created: list[str] = []

    @classmethod
    def open(cls, migration_url: str, ca_pem: bytes | None) -> ExternalPostgres:
        """Check the server and the role's rights, and set up the runtime role."""
        server = cls(migration_url, ca_pem)
        _run_coroutine(server._prepare())
        return server

    async def _prepare(self) -> None:
        from core.db.connect import require_server_version

        conn = await connect(self._url, self.ca_pem)
        try:
            await require_server_version(conn)
            may_create = await conn.fetchrow(
                "SELECT rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user"
            )
            if may_create is None or not (may_create[0] and may_create[1]):
                raise HarnessError(
                    "the role in COORDINATOR_TEST_DATABASE_URL needs CREATEDB and CREATEROLE"
                )
            verifier = scram_verifier(self._runtime_password)
            exists = await conn.fetchval(
                "SELECT 1 FROM pg_roles WHERE rolname = $1", self.runtime_role
            )
            verb = "ALTER" if exists else "CREATE"
            try:
                await conn.execute(
                    f"{verb} ROLE {quote_ident(self.runtime_role)} LOGIN NOSUPERUSER "
                    f"NOBYPASSRLS NOCREATEDB NOCREATEROLE NOINHERIT PASSWORD '{verifier}'"
                )
            except asyncpg.InsufficientPrivilegeError:
                raise HarnessError(
                    f"the role in COORDINATOR_TEST_DATABASE_URL cannot {verb.lower()} role "
                    f"{self.runtime_role} (it must have created it, or be granted it WITH ADMIN)"
                ) from None
        finally:
            await conn.close()

    def handle(self, database: str) -> DatabaseHandle:
        return DatabaseHandle(
            database=database,
            host=self.host,
            port=self.port,
            ca_pem=self.ca_pem,
            migration_role=self.migration_role,
            runtime_role=self.runtime_role,
            migration_password=self._migration_password,
            runtime_password=self._runtime_password,
        )

    async def acreate_database(self, name: str, *, template: str | None = None) -> DatabaseHandle:
        conn = await connect(self._url, self.ca_pem)
        try:
            await _create_database_sql(conn, name, self.migration_role, self.runtime_role, template)
        finally:
            await conn.close()
        self._created.append(name)
        return self.handle(name)

    async def adrop_database(self, name: str) -> None:
        conn = await connect(self._url, self.ca_pem)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
        finally:
            await conn.close()
        if name in self._created:
            self._created.remove(name)

    def create_database(self, name: str, *, template: str | None = None) -> DatabaseHandle:
        return _run_coroutine(self.acreate_database(name, template=template))

    def drop_database(self, name: str) -> None:
        _run_coroutine(self.adrop_database(name))

    def stop(self) -> None:
        """Drop the databases this harness created; the server itself keeps running."""
        for name in list(self._created):
            self.drop_database(name)
