"""The headless Chromium the console's browser tests drive, pinned and checked like the rest.

``playwright install`` would fetch a browser build from Playwright's own download host: a
build we neither pin nor check against a digest we keep. The browser comes from the npm
registry instead, through the same door as the OpenID provider (:mod:`devstack.npm_tree`):
``devstack/browser/package.json`` pins ``@sparticuz/chromium`` at exactly 153.0.0 and
``devstack/browser/package-lock.json`` records every package of its tree with a sha512
``integrity``; ``npm ci --ignore-scripts`` installs that tree into ``.cache/browser/`` (or
the folder ``COORDINATOR_BROWSER_CACHE`` names), npm checking each tarball against the lock.

The package is made for serverless functions, which start from a bare Linux image, so it
carries everything a headless browser needs beyond the C library, each file compressed with
brotli in its ``bin/`` folder: ``chromium.br`` (Chromium's headless shell, x86_64 Linux),
``al2023.tar.br`` (the NSS, NSPR and expat libraries the shell links against),
``swiftshader.tar.br`` (software GL and Vulkan, which the shell loads from its own folder)
and ``fonts.tar.br`` (Open Sans). The package's JavaScript, which would unpack these into
``/tmp`` on every start, never runs here (its ``engines`` asks for Node.js 22, a warning
only for ``npm ci``). Instead, once per install and under the cache's flock,
:func:`ensure_installed` inflates them with the brotli decoder built into Node.js (Python's
standard library has none), unpacks the tars with :mod:`tarfile`'s ``data`` filter and
writes a fontconfig file of our own that names the unpacked fonts. Everything is assembled
in a staging folder, checked by asking the browser its version, and renamed into place
beside ``node_modules``::

    .cache/browser/153.0.0-<lock digest>/
        node_modules/@sparticuz/chromium/bin/*.br   what npm ci installed
        chromium/bin/chromium                       the browser, with SwiftShader beside it
        chromium/al2023/lib/                        libnss3.so and the rest
        chromium/fonts/fonts/Open_Sans/             the fonts
        chromium/fonts.conf, chromium/fonts-cache/  fontconfig's settings and cache
        chromium/.coordinator-inflated.json         the marker, written before the rename

:class:`Browser` names the executable and the environment it needs: ``LD_LIBRARY_PATH``
(the libraries, then the browser's folder) and ``FONTCONFIG_FILE`` (without it the renderer
aborts as soon as it lays out text). Playwright launches it with ``executable_path`` and
:meth:`Browser.launch_env`, with its default arguments.

``python -m devstack.browser`` installs it (``make browser``) and prints the executable.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devstack.npm_tree import NpmTree, find_node, locked

PACKAGE = "@sparticuz/chromium"
VERSION = "153.0.0"
"""The pinned package version; ``devstack/browser/package.json`` names exactly this."""
CACHE_ENV = "COORDINATOR_BROWSER_CACHE"
SOURCE_DIR = Path(__file__).resolve().parent / "browser"
NODE_MAJOR_MINIMUM = 20
FOLDER_NAME = "chromium"
MARKER_NAME = ".coordinator-inflated.json"
# The package's tarball is about 70 MB, more than the OpenID provider's whole tree.
INSTALL_TIMEOUT_SECONDS = 1200.0
INFLATE_TIMEOUT_SECONDS = 600.0
VERSION_TIMEOUT_SECONDS = 30.0
SWIFTSHADER_FILES = (
    "libEGL.so",
    "libGLESv2.so",
    "libvk_swiftshader.so",
    "libvulkan.so.1",
    "vk_swiftshader_icd.json",
)

# Each pair of arguments is a .br file and where its inflated bytes go; all run at once.
_INFLATE_JS = """
const fs = require("node:fs");
const zlib = require("node:zlib");
const { pipeline } = require("node:stream/promises");
const paths = process.argv.slice(1);
const jobs = [];
for (let i = 0; i < paths.length; i += 2) {
  jobs.push(pipeline(fs.createReadStream(paths[i]), zlib.createBrotliDecompress(),
    fs.createWriteStream(paths[i + 1], { mode: 0o700 })));
}
Promise.all(jobs).catch((error) => { console.error(String(error)); process.exit(1); });
"""


class BrowserError(RuntimeError):
    """The browser could not be installed, inflated or started."""


TREE = NpmTree(
    package=PACKAGE,
    version=VERSION,
    source=SOURCE_DIR,
    default_cache_root=Path(__file__).resolve().parents[1] / ".cache" / "browser",
    cache_env=CACHE_ENV,
    error=BrowserError,
    install_timeout=INSTALL_TIMEOUT_SECONDS,
    # Its engines field names Node.js 22 for its JavaScript, which we never run.
    ignore_engines=True,
)


@dataclass(frozen=True)
class Browser:
    """An inflated browser, ready for ``executable_path`` and ``env`` of a launch."""

    executable: Path
    env: dict[str, str]
    """Only the variables the browser needs added to the environment."""
    version: str
    """Chromium's own version, as ``chromium --version`` says it (``153.0.8010.0``)."""

    def launch_env(self) -> dict[str, str]:
        """This process's environment with :attr:`env` added (our libraries searched first)."""
        env = {**os.environ, **self.env}
        inherited = os.environ.get("LD_LIBRARY_PATH")
        if inherited:
            env["LD_LIBRARY_PATH"] = f"{self.env['LD_LIBRARY_PATH']}:{inherited}"
        return env


def check_pins(source: Path = SOURCE_DIR) -> None:
    """Refuse unless the package is pinned exactly and every package of the lock carries a
    sha512 integrity (see :meth:`devstack.npm_tree.NpmTree.check_pins`)."""
    TREE.check_pins(source)


def browser_dir(cache_root: Path | None = None, source: Path = SOURCE_DIR) -> Path:
    """The folder the browser of ``source``'s lock is inflated into (beside node_modules)."""
    return TREE.install_dir(cache_root, source) / FOLDER_NAME


def _browser_in(folder: Path, version: str) -> Browser:
    bin_dir = folder / "bin"
    return Browser(
        executable=bin_dir / "chromium",
        env={
            "LD_LIBRARY_PATH": f"{folder / 'al2023' / 'lib'}:{bin_dir}",
            "FONTCONFIG_FILE": str(folder / "fonts.conf"),
        },
        version=version,
    )


def installed(cache_root: Path | None = None, source: Path = SOURCE_DIR) -> Browser | None:
    """The inflated browser of exactly this lock, or ``None`` when there is none yet."""
    folder = browser_dir(cache_root, source)
    try:
        marker = json.loads((folder / MARKER_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    browser = _browser_in(folder, str(marker.get("chromium", "")))
    complete = (
        marker.get("lockDigest") == TREE.lock_digest(source)
        # fonts.conf names absolute paths: a moved cache is inflated again.
        and marker.get("folder") == str(folder)
        and bool(browser.version)
        and browser.executable.is_file()
        and Path(browser.env["FONTCONFIG_FILE"]).is_file()
    )
    return browser if complete else None


def ensure_installed(cache_root: Path | None = None, source: Path = SOURCE_DIR) -> Browser:
    """Install the pinned package and inflate the browser if needed; return it."""
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux") or machine not in ("x86_64", "amd64"):
        raise BrowserError(
            f"{PACKAGE} {VERSION} holds an x86_64 Linux build only; this is {sys.platform} "
            f"on {machine or 'an unknown machine'}"
        )
    modules = TREE.ensure_installed(cache_root, source)
    found = installed(cache_root, source)
    if found is not None:
        return found
    node = find_node(NODE_MAJOR_MINIMUM, BrowserError)
    folder = browser_dir(cache_root, source)
    # Not nested in the install's flock (it is not reentrant): the same lock, taken again.
    with locked(folder.parent.parent):
        found = installed(cache_root, source)
        if found is not None:  # another process inflated it while we waited
            return found
        for leftover in folder.parent.glob(".inflate-*"):  # from a killed run; we hold the lock
            shutil.rmtree(leftover, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=".inflate-", dir=folder.parent) as work:
            staging = Path(work) / FOLDER_NAME
            version = _inflate(node, modules / PACKAGE / "bin", Path(work), staging, folder)
            marker = {
                "package": PACKAGE,
                "version": VERSION,
                "lockDigest": TREE.lock_digest(source),
                "folder": str(folder),
                "chromium": version,
            }
            (staging / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", "utf-8")
            if folder.exists():  # an unfinished or moved earlier inflate
                shutil.rmtree(folder)
            staging.rename(folder)
    found = installed(cache_root, source)
    if found is None:
        raise BrowserError(f"the browser inflated into {folder} is incomplete")
    return found


def _inflate(node: str, packed: Path, work: Path, staging: Path, final: Path) -> str:
    """Assemble the browser in ``staging`` (its fonts.conf naming ``final``); its version."""
    bin_dir = staging / "bin"
    bin_dir.mkdir(parents=True)
    tars = {name: work / f"{name}.tar" for name in ("al2023", "swiftshader", "fonts")}
    pairs = [(packed / "chromium.br", bin_dir / "chromium")]
    pairs += [(packed / f"{name}.tar.br", tar) for name, tar in tars.items()]
    missing = [source.name for source, _ in pairs if not source.is_file()]
    if missing:
        raise BrowserError(f"{PACKAGE} {VERSION} has no {missing[0]} in {packed}")
    try:
        result = subprocess.run(
            [node, "-e", _INFLATE_JS, "--", *(str(path) for pair in pairs for path in pair)],
            capture_output=True,
            text=True,
            check=False,
            timeout=INFLATE_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        limit = f"{INFLATE_TIMEOUT_SECONDS:.0f} s"
        raise BrowserError(f"inflating {packed} took over {limit}") from None
    if result.returncode != 0:
        raise BrowserError(f"inflating {packed} failed: {result.stderr.strip()[-300:]}")

    _untar(tars["al2023"], staging / "al2023")
    _untar(tars["swiftshader"], bin_dir)  # the browser looks for these beside itself
    _untar(tars["fonts"], staging / "fonts")
    # The package's own fontconfig file names the folders of a serverless image.
    (staging / "fonts" / "fonts.conf").unlink(missing_ok=True)
    needed = [
        bin_dir / "chromium",
        *(bin_dir / name for name in SWIFTSHADER_FILES),
        staging / "al2023" / "lib" / "libnss3.so",
        staging / "fonts" / "fonts",
    ]
    absent = [path for path in needed if not path.exists()]
    if absent:
        raise BrowserError(f"{PACKAGE} {VERSION} unpacked without {absent[0].relative_to(staging)}")

    (staging / "fonts-cache").mkdir()
    (staging / "fonts.conf").write_text(
        '<?xml version="1.0"?>\n'
        '<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n'
        "<fontconfig>\n"
        f"  <dir>{final / 'fonts' / 'fonts'}</dir>\n"
        f"  <cachedir>{final / 'fonts-cache'}</cachedir>\n"
        "</fontconfig>\n",
        "utf-8",
    )
    return _version_of(_browser_in(staging, ""))


def _untar(tar: Path, destination: Path) -> None:
    if not hasattr(tarfile, "data_filter"):
        raise BrowserError("unpacking the browser needs Python 3.11.4 or later (tarfile filters)")
    destination.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tar) as archive:
            archive.extractall(destination, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise BrowserError(f"cannot unpack {tar.name}: {error}") from error
    tar.unlink()


def _version_of(browser: Browser) -> str:
    """Chromium's version, which also shows the browser starts with its libraries."""
    try:
        result = subprocess.run(
            [str(browser.executable), "--version"],
            env=browser.launch_env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=VERSION_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BrowserError(f"the inflated browser does not start: {error}") from error
    words = result.stdout.split()
    if result.returncode != 0 or len(words) < 2 or words[0] != "Chromium":
        said = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["nothing"]
        raise BrowserError(f"the inflated browser does not start: {said[0]}")
    return words[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Install the pinned browser (``make browser``) and print its executable."""
    parser = argparse.ArgumentParser(prog="python -m devstack.browser", description=main.__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: .cache/browser")
    args = parser.parse_args(argv)
    try:
        browser = ensure_installed(args.cache_dir)
    except (BrowserError, OSError, subprocess.SubprocessError) as error:
        print(f"browser: {error}", file=sys.stderr)
        return 1
    print(browser.executable)
    return 0


if __name__ == "__main__":
    sys.exit(main())
