"""The browser of the console's tests (``devstack.browser``): pinned exactly, every package
integrity-checked, and inflated into the layout its launch depends on."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from devstack import npm_tree
from devstack.browser import (
    FOLDER_NAME,
    MARKER_NAME,
    PACKAGE,
    SOURCE_DIR,
    SWIFTSHADER_FILES,
    VERSION,
    Browser,
    BrowserError,
    browser_dir,
    check_pins,
    ensure_installed,
    installed,
)


@pytest.fixture(scope="module")
def browser() -> Browser:
    """The real inflated browser (``make browser`` made it; installed here otherwise)."""
    return ensure_installed()


def _copy_source(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(SOURCE_DIR, folder)
    return folder


def test_the_checked_in_pins_are_exact_and_every_package_carries_a_sha512() -> None:
    check_pins()
    manifest = json.loads((SOURCE_DIR / "package.json").read_text())
    assert manifest["private"] is True
    assert manifest["dependencies"] == {PACKAGE: VERSION}


def test_a_range_instead_of_the_exact_version_is_refused(tmp_path: Path) -> None:
    ranged = _copy_source(tmp_path, "ranged")
    manifest = json.loads((ranged / "package.json").read_text())
    manifest["dependencies"][PACKAGE] = f"^{VERSION}"
    (ranged / "package.json").write_text(json.dumps(manifest))

    with pytest.raises(BrowserError, match=f"must be pinned to exactly {VERSION}"):
        check_pins(ranged)


def test_a_lock_entry_without_its_integrity_is_refused(tmp_path: Path) -> None:
    unchecked = _copy_source(tmp_path, "unchecked")
    lock = json.loads((unchecked / "package-lock.json").read_text())
    del lock["packages"]["node_modules/tar-fs"]["integrity"]
    (unchecked / "package-lock.json").write_text(json.dumps(lock))

    with pytest.raises(BrowserError, match=r"no sha512 integrity in the lock for .*/tar-fs$"):
        check_pins(unchecked)
    # Another lock is another install: the browser of the checked-in lock is not its.
    assert installed(source=unchecked) is None


def test_without_npm_the_install_stops_with_one_line_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BrowserError) as refused:
        ensure_installed(tmp_path / "cache")
    assert str(refused.value) == f"npm is needed to install {PACKAGE} and is not on PATH"
    with pytest.raises(BrowserError, match=r"^node \(Node.js 20 or later\) is needed"):
        npm_tree.find_node(20, BrowserError)


def test_the_browser_sits_beside_its_swiftshader_libraries(browser: Browser) -> None:
    folder = browser.executable.parent
    assert browser.executable.name == "chromium"
    assert os.access(browser.executable, os.X_OK)
    for name in SWIFTSHADER_FILES:
        assert (folder / name).is_file(), name
    assert (folder / "libGLESv2.so").stat().st_size > 0
    # Inflated beside the npm tree, in the folder of exactly this lock.
    assert folder.parent == browser_dir()
    assert (folder.parent.parent / "node_modules" / PACKAGE / "bin" / "chromium.br").is_file()


def test_its_environment_names_the_libraries_and_a_fontconfig_file_naming_the_fonts(
    browser: Browser,
) -> None:
    assert set(browser.env) == {"LD_LIBRARY_PATH", "FONTCONFIG_FILE"}
    libraries, beside = browser.env["LD_LIBRARY_PATH"].split(":")
    assert (Path(libraries) / "libnss3.so").is_file()
    assert Path(beside) == browser.executable.parent

    settings = Path(browser.env["FONTCONFIG_FILE"]).read_text()
    [fonts] = re.findall(r"<dir>([^<]+)</dir>", settings)
    [cache] = re.findall(r"<cachedir>([^<]+)</cachedir>", settings)
    assert sorted(path.name for path in Path(fonts).rglob("*.ttf")) == [
        "OpenSans-Bold.ttf",
        "OpenSans-Italic.ttf",
        "OpenSans-Regular.ttf",
    ]
    assert Path(cache).is_dir()
    assert Path(fonts).is_relative_to(browser_dir()) and Path(cache).is_relative_to(browser_dir())


def test_the_launch_environment_keeps_the_process_environment_and_searches_ours_first(
    browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere/lib")
    monkeypatch.setenv("COORDINATOR_SOMETHING", "kept")

    env = browser.launch_env()

    assert env["COORDINATOR_SOMETHING"] == "kept"
    assert env["FONTCONFIG_FILE"] == browser.env["FONTCONFIG_FILE"]
    assert env["LD_LIBRARY_PATH"] == browser.env["LD_LIBRARY_PATH"] + ":/opt/elsewhere/lib"


def test_a_second_install_finds_the_first_and_changes_nothing(browser: Browser) -> None:
    marker = browser_dir() / MARKER_NAME
    before = marker.stat().st_mtime_ns

    again = ensure_installed()

    assert again == browser
    assert marker.stat().st_mtime_ns == before
    recorded = json.loads(marker.read_text())
    assert recorded["chromium"] == browser.version
    assert browser.version.startswith(VERSION.split(".")[0] + ".")
    assert browser_dir().name == FOLDER_NAME
