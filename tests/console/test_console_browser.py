"""The operator console in a real browser against the real stack.

``coordinatorctl console`` runs as its own process in front of a deployed local stack (TLS
PostgreSQL, the coordinator's processes, the issuer and the Messaging stand-in); headless
Chromium, driven by Playwright, opens the URL it printed. A run is held the way production
holds one: Messaging processes the command and then answers 500, so its effect is unknown.
The operator then finds it in the attention list, reads its page, is refused for a reference
that is not one, reconciles it with a real one and sees the list update. Forged posts and
injected script are shown to fail. Screenshots land in the artifacts folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from devstack.postgres import PostgresCluster
from tests.helpers.recovery_kit import (
    NOTICE,
    RecoveryStack,
    started_recovery_stack,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SUBJECT = "person-console-7731"
"""The runs' input value: it must never appear on a page (nor in the console's log, which
the ``console_url`` fixture checks)."""
CALL = "send-notice"


@pytest.fixture(scope="module")
def stack(postgres_server: PostgresCluster) -> Iterator[RecoveryStack]:
    with started_recovery_stack(postgres_server, "coordinator_console") as running:
        yield running


def _held_run(stack: RecoveryStack) -> str:
    """A run whose send Messaging processed and then answered 500: held, effect unknown."""
    return stack.held_after_processing(SUBJECT, workflow=NOTICE)


def _origin(url: str) -> str:
    return url.split("/?", 1)[0]


def _shot(page: Page, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


def _no_input_shown(page: Page) -> None:
    assert SUBJECT not in page.content()


def test_a_held_run_is_listed_and_its_page_shows_the_unknown_effect_on_its_path(
    page: Page, stack: RecoveryStack, console_url: str, artifacts_dir: Path
) -> None:
    run_id = _held_run(stack)
    page.goto(console_url)
    expect(page).to_have_url(_origin(console_url) + "/")  # the key left the address bar
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=run_id))
    expect(row).to_contain_text("held")
    expect(row).to_contain_text(f"{CALL}: effect unknown (the product answered 500)")
    expect(row).to_contain_text(NOTICE)
    _shot(page, artifacts_dir, "attention-list")
    _no_input_shown(page)

    page.get_by_role("link", name=run_id).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Run {run_id}")
    step = page.get_by_role("row").filter(has=page.get_by_role("rowheader", name=CALL))
    expect(step).to_contain_text("uncertain")
    expect(step).to_contain_text("unknown")
    drawn = page.locator(f"svg g#step-{CALL}")
    expect(drawn).to_have_class(re.compile(r"\bcurrent\b.*\bunknown\b"))
    expect(page.locator("svg g.node.on-path").first).to_be_visible()
    _shot(page, artifacts_dir, "held-run")
    _no_input_shown(page)
    assert stack.act("reconcile", run_id, "INC-CLEANUP").document["result"] == "accepted"


def test_a_bad_reference_shows_the_problem_and_a_good_one_settles_the_run(
    page: Page, stack: RecoveryStack, console_url: str, artifacts_dir: Path
) -> None:
    run_id = _held_run(stack)
    page.goto(console_url)
    page.goto(f"{_origin(console_url)}/runs/{run_id}")
    reconcile = page.get_by_role("form", name="reconcile")

    reconcile.get_by_label("Investigation reference").fill("not a reference")
    reconcile.get_by_role("button", name="reconcile").click()
    problem = page.get_by_role("alert")
    expect(problem).to_contain_text("request.invalid")
    expect(problem).to_contain_text("400")
    assert "not a reference" not in page.content()  # refused without an echo
    _shot(page, artifacts_dir, "reconcile-refused")
    assert stack.status(run_id)["state"] == "held"

    reconcile = page.get_by_role("form", name="reconcile")
    reconcile.get_by_label("Investigation reference").fill("INC-2041")
    reconcile.get_by_role("button", name="reconcile").click()
    expect(page.get_by_role("status")).to_have_text("reconcile: accepted")
    ended = stack.wait_ended(run_id)
    assert ended["state"] == "succeeded", ended
    page.reload()
    expect(page.get_by_role("row").filter(has_text="INC-2041")).to_contain_text("reconcile")
    _shot(page, artifacts_dir, "reconciled")

    page.get_by_role("link", name="Attention").click()
    expect(page.get_by_role("link", name=run_id)).to_have_count(0)
    assert stack.audited("reconcile", run_id)[-1]["reason"] == "INC-2041"


def test_a_forged_post_from_another_site_does_nothing(
    page: Page, stack: RecoveryStack, console_url: str, artifacts_dir: Path
) -> None:
    run_id = _held_run(stack)
    origin = _origin(console_url)
    page.goto(console_url)  # the operator has a session in this browser
    token = page.goto(f"{origin}/runs/{run_id}")
    assert token is not None and token.ok
    cancels_before = len(stack.audited("cancel", run_id))

    # Another site's page posts a cancel form to the console, as a forger would.
    forger = "http://forger.test/"
    page.route(
        forger,
        lambda route: route.fulfill(
            content_type="text/html",
            body=(
                f'<form id="f" method="post" action="{origin}/runs/{run_id}/cancel">'
                '<input name="reason" value="INC-666"><input name="csrf" value="guess">'
                "</form><script>document.getElementById('f').submit()</script>"
            ),
        ),
    )
    with page.expect_response(re.compile(rf"/runs/{run_id}/cancel$")) as posted:
        page.goto(forger)
    assert posted.value.status in (401, 403)
    _shot(page, artifacts_dir, "forged-post")

    # The same post with the operator's own cookie but no CSRF token is refused as well.
    answer = page.request.post(
        f"{origin}/runs/{run_id}/cancel", form={"reason": "INC-666"}, max_redirects=0
    )
    assert answer.status == 403
    assert "authorization.refused" in answer.text()

    assert stack.status(run_id)["state"] == "held"
    assert len(stack.audited("cancel", run_id)) == cancels_before
    settled = stack.act("reconcile", run_id, "INC-CLEANUP").document  # nothing left held
    assert settled["result"] == "accepted"


def test_the_policy_stops_script_injected_into_a_page(
    page: Page, stack: RecoveryStack, console_url: str
) -> None:
    answer = page.goto(console_url)
    assert answer is not None
    policy = answer.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "form-action 'self'" in policy
    violations: list[Any] = page.evaluate(
        """() => new Promise((resolve) => {
            const seen = [];
            document.addEventListener('securitypolicyviolation',
                (e) => seen.push(e.violatedDirective));
            const s = document.createElement('script');
            s.textContent = 'window.injected = true';
            document.body.appendChild(s);
            setTimeout(() => resolve(seen), 200);
        })"""
    )
    assert page.evaluate("() => window.injected === undefined")
    assert any(v.startswith("script-src") for v in violations), violations


def test_the_doctor_page_shows_the_report(
    page: Page, stack: RecoveryStack, console_url: str
) -> None:
    page.goto(console_url)
    page.get_by_role("link", name="Doctor").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Doctor")
    doctor = stack.ctl("doctor", "--output", "json").document
    expect(page.locator("main")).to_contain_text(doctor["databaseId"])
    for workflow in doctor["workflows"]:
        expect(page.locator("main")).to_contain_text(workflow["digest"])
