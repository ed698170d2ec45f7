"""A pinned npm package tree, installed with ``npm ci`` into a cache folder of the checkout.

The harness takes two things from the npm registry this way: the OpenID provider of the
reliability tests (:mod:`devstack.oidc_provider`) and the browser of the console's tests
(:mod:`devstack.browser`). Each has a source folder in ``devstack/`` holding a
``package.json`` that names one package at one exact version and a ``package-lock.json``
that records the whole tree, every package with its sha512 ``integrity``. :class:`NpmTree`
refuses a source folder that pins less than that (:meth:`NpmTree.check_pins`), then installs
exactly that tree with ``npm ci --ignore-scripts``: npm checks every tarball against the
lock, and no package script runs. Nothing else is fetched, then or later.

An install lives in ``<cache root>/<version>-<lock digest>/node_modules``, beside a marker
file written once ``npm ci`` has finished; the digest covers both files, so a changed lock
names another folder and an install is never taken for another lock's. ``npm ci`` works in a
staging folder that is renamed into place. Two processes installing at once (two ``make``
targets, two test sessions) take turns on an flock of ``<cache root>/.lock``
(:func:`locked`): one installs, the other waits and then finds the marker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MARKER_NAME = ".coordinator-complete.json"
INSTALL_TIMEOUT_SECONDS = 600.0
LOCK_FILES = ("package.json", "package-lock.json")


@dataclass(frozen=True)
class NpmTree:
    """One pinned tree: what it installs, from where, into which cache."""

    package: str
    """The one dependency ``package.json`` names."""
    version: str
    """Its exact version, in ``package.json`` and in the lock."""
    source: Path
    """The folder holding ``package.json`` and ``package-lock.json``."""
    default_cache_root: Path
    """Where installs go unless :attr:`cache_env` or the caller names another folder."""
    cache_env: str
    """The environment variable that moves the cache."""
    error: type[Exception]
    """What every refusal and failure raises (the caller's own error class)."""
    install_timeout: float = INSTALL_TIMEOUT_SECONDS
    ignore_engines: bool = False
    """Install even where the package's ``engines`` names another Node.js (and a user's
    ``engine-strict`` setting would refuse): for trees whose JavaScript never runs."""

    def cache_root(self, override: Path | None = None) -> Path:
        """``override``, else the folder :attr:`cache_env` names, else the default."""
        if override is not None:
            return override.resolve()
        named = os.environ.get(self.cache_env)
        if named:
            return Path(named).resolve()
        return self.default_cache_root.resolve()

    def lock_digest(self, source: Path | None = None) -> str:
        """SHA-256 over ``package.json`` and ``package-lock.json``: names one install."""
        folder = source or self.source
        digest = hashlib.sha256()
        for name in LOCK_FILES:
            data = (folder / name).read_bytes()
            digest.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
        return digest.hexdigest()

    def check_pins(self, source: Path | None = None) -> None:
        """Refuse unless ``package.json`` pins exactly :attr:`version` and the lock holds an
        integrity hash for every package it installs (so ``npm ci`` checks every tarball)."""
        folder = source or self.source
        try:
            manifest = json.loads((folder / "package.json").read_text("utf-8"))
            lock = json.loads((folder / "package-lock.json").read_text("utf-8"))
            pinned = manifest["dependencies"][self.package]
            packages = lock["packages"]
            locked_version = packages[f"node_modules/{self.package}"]["version"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise self.error(f"{folder}: package.json or package-lock.json is unreadable") from exc
        if pinned != self.version or locked_version != self.version:
            raise self.error(f"{folder}: {self.package} must be pinned to exactly {self.version}")
        unchecked = [
            name
            for name, entry in packages.items()
            if name and not str(entry.get("integrity", "")).startswith("sha512-")
        ]
        if unchecked:
            raise self.error(f"{folder}: no sha512 integrity in the lock for {unchecked[0]}")

    def install_dir(self, cache_root: Path | None = None, source: Path | None = None) -> Path:
        """The folder of the install of ``source``'s lock (``node_modules`` and the marker)."""
        return self.cache_root(cache_root) / f"{self.version}-{self.lock_digest(source)[:16]}"

    def modules_dir(self, cache_root: Path | None = None, source: Path | None = None) -> Path:
        """The ``node_modules`` folder of the install of ``source``'s lock."""
        return self.install_dir(cache_root, source) / "node_modules"

    def is_installed(self, cache_root: Path | None = None, source: Path | None = None) -> bool:
        """True when a finished install of exactly this lock is in the cache."""
        modules = self.modules_dir(cache_root, source)
        try:
            marker = json.loads((modules.parent / MARKER_NAME).read_text("utf-8"))
            installed = json.loads((modules / self.package / "package.json").read_text("utf-8"))
        except (OSError, ValueError):
            return False
        return bool(
            marker.get("lockDigest") == self.lock_digest(source)
            and marker.get("version") == self.version
            and installed.get("version") == self.version
        )

    def ensure_installed(self, cache_root: Path | None = None, source: Path | None = None) -> Path:
        """Install the locked tree with ``npm ci`` if needed; return its ``node_modules``."""
        folder = source or self.source
        self.check_pins(folder)
        modules = self.modules_dir(cache_root, folder)
        if self.is_installed(cache_root, folder):
            return modules
        npm = shutil.which("npm")
        if npm is None:
            raise self.error(f"npm is needed to install {self.package} and is not on PATH")
        root = modules.parent.parent
        root.mkdir(parents=True, exist_ok=True)
        with locked(root):
            if self.is_installed(cache_root, folder):  # another process finished meanwhile
                return modules
            for leftover in root.glob(".install-*"):  # from a killed run; we hold the lock
                shutil.rmtree(leftover, ignore_errors=True)
            final = modules.parent
            with tempfile.TemporaryDirectory(prefix=".install-", dir=root) as work:
                staging = Path(work) / "tree"
                staging.mkdir()
                for name in LOCK_FILES:
                    shutil.copyfile(folder / name, staging / name)
                self._npm_ci(npm, staging)
                if final.exists():  # an unfinished earlier attempt (no marker)
                    shutil.rmtree(final)
                staging.rename(final)
            marker = {
                "package": self.package,
                "version": self.version,
                "lockDigest": self.lock_digest(folder),
            }
            (final / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", "utf-8")
        if not self.is_installed(cache_root, folder):
            raise self.error(f"npm ci did not install {self.package}@{self.version}")
        return modules

    def _npm_ci(self, npm: str, staging: Path) -> None:
        command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
        if self.ignore_engines:
            command.append("--engine-strict=false")
        try:
            result = subprocess.run(
                command,
                cwd=staging,
                capture_output=True,
                text=True,
                check=False,
                timeout=self.install_timeout,
            )
        except subprocess.TimeoutExpired:
            raise self.error(
                f"npm ci for {self.package}@{self.version} took over "
                f"{self.install_timeout:.0f} s and was stopped"
            ) from None
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-8:])
            raise self.error(f"npm ci for {self.package}@{self.version} failed:\n{tail}")


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the cache's flock (``root/.lock``); not reentrant: never nest two."""
    # Two `make` runs or test sessions may install at once: one works, the other waits.
    with (root / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def find_node(minimum_major: int, error: type[Exception]) -> str:
    """The machine's ``node``; ``error`` when missing or older than ``minimum_major``."""
    node = shutil.which("node")
    if node is None:
        raise error(f"node (Node.js {minimum_major} or later) is needed and is not on PATH")
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    try:
        major = int(version.removeprefix("v").split(".")[0])
    except ValueError:
        raise error(f"cannot tell the version of {node}") from None
    if major < minimum_major:
        raise error(f"{node} is Node.js {version}; {minimum_major} or later needed")
    return node
