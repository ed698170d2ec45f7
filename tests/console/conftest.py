"""Fixtures of the browser tests (the console's, and the sign-in of ``coordinatorctl login``):
pytest-playwright driving the pinned Chromium.

``installed_browser`` is the headless Chromium of :mod:`devstack.browser` (inflated here if
``make browser`` has not run). A browser that cannot be installed or started fails the
tests that need it, with the installer's own words: it is never a skip, since a skipped
browser test would pass for a console nobody looked at. ``browser_type_launch_args``
points pytest-playwright's ``browser``, ``context`` and ``page`` fixtures at it, headless,
with Playwright's default arguments (nothing here turns web security or CSP off).

pytest-playwright keeps ``playwright`` and ``browser`` for the whole session. But the sync
Playwright API leaves its event loop marked as running in the test thread from its start to
its stop, and while it is so marked ``asyncio.run`` and every async test or fixture fail
("cannot be called from a running event loop"): the rest of the session, and this folder's
own module fixtures that start a stack, would break. So here ``playwright``, ``browser`` and
the fixtures built on them (``browser_type``, ``launch_browser``, ``browser_context_args``)
live for one test: fixtures of wider scope are set up before Playwright starts and torn down
after it stopped, and a browser that crashes takes no other test with it. It costs about
0.4 s a test. The tests here are sync; inside a test that has a ``page``, work that needs
an event loop goes to a thread of its own, as ``tests.helpers.thread_server`` does.

``artifacts_dir`` is a folder of this session's own under ``.cache/test-artifacts/console/``
for screenshots; the newest few sessions' folders are kept.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser as PlaywrightBrowser
from playwright.sync_api import BrowserType, Playwright, sync_playwright

from devstack.browser import Browser, BrowserError, ensure_installed
from tests.helpers.recovery_kit import CTL, RecoveryStack

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_ROOT = ROOT / ".cache" / "test-artifacts" / "console"
KEEP_SESSIONS = 3
CONSOLE_START_SECONDS = 30.0


@pytest.fixture(scope="module")
def console_url(request: pytest.FixtureRequest, stack: RecoveryStack) -> Iterator[str]:
    """``coordinatorctl console`` serving the module's ``stack`` (a fixture each module
    defines); the URL it printed, with its key. At the end the console's own log must hold
    no token, and not the module's ``SUBJECT`` (the runs' input value) when it has one."""
    command = [
        CTL,
        "--runtime-config",
        str(stack.local.runtime_file),
        "console",
        "--url",
        stack.local.url,
        "--token-file",
        str(stack.token_files["operator"]),
    ]
    log_path = stack.workdir / "console.log"
    with (
        log_path.open("wb") as log,
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, **stack.env()},
            text=True,
        ) as process,
    ):
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], CONSOLE_START_SECONDS)
            assert ready, f"coordinatorctl console printed nothing: {log_path.read_text()}"
            line = process.stdout.readline().strip()
            found = re.fullmatch(r"console: (http://127\.0\.0\.1:\d+/\?key=[A-Za-z0-9_-]+)", line)
            assert found, f"unexpected first line: {line!r} {log_path.read_text()}"
            yield found.group(1)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    logged = log_path.read_text("utf-8", "replace")
    assert stack.operator_token not in logged
    subject = getattr(request.module, "SUBJECT", None)
    assert subject is None or subject not in logged


@pytest.fixture(scope="session")
def installed_browser() -> Browser:
    """The pinned headless Chromium, installed and inflated if needed."""
    try:
        return ensure_installed()
    except (BrowserError, OSError) as error:
        pytest.fail(f"the pinned browser is not usable (see `make browser`): {error}")


@pytest.fixture(scope="session")
def browser_type_launch_args(
    browser_type_launch_args: dict[str, Any], installed_browser: Browser
) -> dict[str, Any]:
    """pytest-playwright's launch arguments, with our executable and its environment."""
    return {
        **browser_type_launch_args,
        "executable_path": str(installed_browser.executable),
        "env": installed_browser.launch_env(),
        "headless": True,
    }


@pytest.fixture
def playwright(_pw_api_request_contexts: Any) -> Iterator[Playwright]:
    """pytest-playwright's ``playwright``, for one test (see the module docstring)."""
    with sync_playwright() as started:
        # As the plugin's own fixture does: with --tracing, API requests are traced too.
        if _pw_api_request_contexts:
            _pw_api_request_contexts.instrument(started)
        yield started


@pytest.fixture(scope="session")
def base_url(pytestconfig: pytest.Config) -> str | None:
    """``--base-url`` or the ``base_url`` ini value, as the plugin's own fallback gives it.

    That fallback is a fixture defined as a method of a plugin class, which pytest 9
    deprecates with a warning at its first use; ``filterwarnings = error`` turns it into an
    error. This plain function takes its place."""
    named = pytestconfig.getoption("--base-url") or pytestconfig.getini("base_url")
    return str(named) if named else None


@pytest.fixture
def browser_context_args(
    pytestconfig: pytest.Config,
    playwright: Playwright,
    device: str | None,
    base_url: str | None,
    _pw_artifacts_folder: tempfile.TemporaryDirectory[str],
) -> dict[str, Any]:
    """As the plugin's: the ``--device``, the ``--base-url`` and the ``--video`` folder."""
    context_args: dict[str, Any] = {}
    if device:
        context_args.update(playwright.devices[device])
    if base_url:
        context_args["base_url"] = base_url
    if pytestconfig.getoption("--video") in ("on", "retain-on-failure"):
        context_args["record_video_dir"] = _pw_artifacts_folder.name
    return context_args


@pytest.fixture
def browser_type(playwright: Playwright, browser_name: str) -> BrowserType:
    if browser_name != "chromium":
        pytest.fail(f"only chromium is pinned (devstack/browser.py), not {browser_name}")
    return playwright.chromium


@pytest.fixture
def launch_browser(
    browser_type_launch_args: dict[str, Any], browser_type: BrowserType
) -> Callable[..., PlaywrightBrowser]:
    """Launches the browser with the session's launch arguments and any given here."""

    def launch(**kwargs: Any) -> PlaywrightBrowser:
        return browser_type.launch(**{**browser_type_launch_args, **kwargs})

    return launch


@pytest.fixture
def browser(launch_browser: Callable[..., PlaywrightBrowser]) -> Iterator[PlaywrightBrowser]:
    launched = launch_browser()
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """This session's folder under ``.cache/test-artifacts/console/`` (screenshots)."""
    ARTIFACTS_ROOT.mkdir(parents=True, exist_ok=True)
    # Sessions sort by their names; concurrent ones each have their own folder.
    folder = ARTIFACTS_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    folder.mkdir()
    earlier = sorted(path for path in ARTIFACTS_ROOT.iterdir() if path.is_dir())
    for old in earlier[:-KEEP_SESSIONS]:
        shutil.rmtree(old, ignore_errors=True)
    return folder
