"""The pinned browser drives real pages: an input found by its label, a screenshot written,
and a Content-Security-Policy obeyed (the console's CSP tests rely on the browser for it)."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page, expect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from devstack.browser import Browser
from tests.helpers.thread_server import serve_in_thread

FORM = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Find a run</title></head>
<body>
  <h1>Find a run</h1>
  <form method="get" action="/">
    <label for="reference">Run reference</label>
    <input id="reference" name="reference" type="text">
    <button type="submit">Look up</button>
  </form>
</body></html>
"""

# The script writes into the page when it runs; the page says "not run" otherwise.
SCRIPTED = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Scripted</title></head>
<body>
  <p id="state">not run</p>
  <script>document.getElementById("state").textContent = "ran";</script>
</body></html>
"""


async def form(request: Request) -> HTMLResponse:
    return HTMLResponse(FORM)


async def scripted(request: Request) -> HTMLResponse:
    return HTMLResponse(SCRIPTED)


async def scripted_without_scripts(request: Request) -> HTMLResponse:
    return HTMLResponse(SCRIPTED, headers={"Content-Security-Policy": "script-src 'none'"})


APP = Starlette(
    routes=[
        Route("/", form),
        Route("/scripted", scripted),
        Route("/scripted-without-scripts", scripted_without_scripts),
    ]
)


def test_the_pinned_browser_finds_an_input_by_its_label_and_takes_a_screenshot(
    page: Page, installed_browser: Browser, artifacts_dir: Path
) -> None:
    with serve_in_thread(APP) as url:
        page.goto(url + "/")
        reference = page.get_by_role("textbox", name="Run reference")
        reference.fill("RUN-42")
        page.get_by_role("button", name="Look up").click()
        page.wait_for_url(url + "/?reference=RUN-42")
        expect(page.get_by_role("heading", level=1)).to_have_text("Find a run")
        shot = artifacts_dir / "find-a-run.png"
        page.screenshot(path=shot)

    # The browser is the inflated pinned one, not a build Playwright brought.
    assert page.context.browser is not None
    assert page.context.browser.version == installed_browser.version
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert shot.stat().st_size > 1000


def test_a_content_security_policy_without_scripts_stops_an_inline_script(page: Page) -> None:
    with serve_in_thread(APP) as url:
        # The same page without the header runs its script: the check below can fail.
        page.goto(url + "/scripted")
        expect(page.locator("#state")).to_have_text("ran")

        # The browser says why the script did not run: the policy, not a broken page.
        with page.expect_console_message(
            lambda message: "Content Security Policy" in message.text
        ) as refusal:
            page.goto(url + "/scripted-without-scripts")
        expect(page.locator("#state")).to_have_text("not run")

    assert "script-src 'none'" in refusal.value.text
