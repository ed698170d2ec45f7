"""The operator console's pages and guards, in process, over a recording stand-in of the API.

The stand-in answers the documents the contract describes (status, inspection, doctor, the
run actions' answers and problems) and records what the console sent, so each test can say
both what a page shows and what reached the API. The real stack and a real browser are the
business of tests/console.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli import console as web
from core import clock
from core.workflow.check import check_source_dir

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = "http://127.0.0.1:8765"
HELD = "0b7f3c1e-held"
WAITING = "5d2a9e40-wait"
UNSURE = "9c41d7a2-review"
"""A run whose Casework review request (no receipts) has an unknown effect."""
DIGEST = "sha256:" + "ab" * 32


def _status(run_id: str, state: str, *, attention: bool, updated: str) -> dict[str, Any]:
    return {
        "runId": run_id,
        "workflow": {"id": "approval-notice", "version": "1.0.0", "digest": DIGEST},
        "state": state,
        "attention": attention,
        "createdAt": "2027-01-04T09:00:00.000Z",
        "updatedAt": updated,
    }


def _inspection(run_id: str) -> dict[str, Any]:
    if run_id == UNSURE:
        return {
            **_status(UNSURE, "held", attention=True, updated="2027-01-07T09:00:00.000Z"),
            "steps": [
                {
                    "step": "request-review",
                    "type": "call",
                    "state": "uncertain",
                    "attempts": 1,
                    "effect": "unknown",
                    "cause": "timeout-after-send",
                    "startedAt": "2027-01-07T09:00:00.000Z",
                }
            ],
            "holds": {"execution": False, "admission": False},
            "lastOperatorActions": [],
        }
    if run_id == HELD:
        steps = [
            {
                "step": "request-review",
                "type": "call",
                "state": "completed",
                "attempts": 1,
                "effect": "accepted",
                "startedAt": "2027-01-04T09:00:00.000Z",
                "endedAt": "2027-01-04T09:00:01.000Z",
            },
            {
                "step": "await-decision",
                "type": "wait-for",
                "state": "completed",
                "attempts": 0,
                "wait": {"nextCheckAt": "2027-01-05T09:00:00.000Z", "checks": 3},
                "startedAt": "2027-01-04T09:00:01.000Z",
                "endedAt": "2027-01-05T09:00:00.000Z",
            },
            {
                "step": "decide",
                "type": "choose",
                "state": "completed",
                "attempts": 0,
                "startedAt": "2027-01-05T09:00:00.000Z",
                "endedAt": "2027-01-05T09:00:00.000Z",
            },
            {
                "step": "send-approval",
                "type": "call",
                "state": "uncertain",
                "attempts": 1,
                "effect": "unknown",
                "cause": "status-5xx",
                "causeStatus": 502,
                "startedAt": "2027-01-05T09:00:00.000Z",
            },
        ]
        status = _status(HELD, "held", attention=True, updated="2027-01-05T09:00:00.000Z")
    else:
        steps = [
            {
                "step": "request-review",
                "type": "call",
                "state": "ready",
                "attempts": 2,
                "cause": "token-refused",
                "retry": {
                    "lastCause": "token-refused",
                    "lastAttemptAt": "2027-01-06T09:04:00.000Z",
                    "nextAttemptAt": "2027-01-06T09:08:00.000Z",
                    "deadlineAt": "2027-01-06T13:00:00.000Z",
                },
                "startedAt": "2027-01-06T09:00:00.000Z",
            }
        ]
        status = _status(WAITING, "running", attention=True, updated="2027-01-06T09:00:00.000Z")
    return {
        **status,
        "steps": steps,
        "holds": {"execution": False, "admission": False},
        "lastOperatorActions": [],
    }


def _problem(status: int, code: str, detail: str) -> httpx.Response:
    body = {
        "type": f"https://registry-coordinator.dev/problems/{code}",
        "title": code,
        "status": status,
        "detail": detail,
        "code": code,
    }
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


@dataclass
class FakeApi:
    """The coordinator's API as the console sees it; ``sent`` records every request."""

    sent: list[tuple[str, str, dict[str, Any] | None, str]] = field(default_factory=list)
    refuse_with: httpx.Response | None = None
    listed: list[dict[str, str]] = field(default_factory=list)
    """The query of each list request."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.sent.append(
            (request.method, request.url.path, body, request.headers.get("authorization", ""))
        )
        path = request.url.path
        if path == "/v1/runs":
            self.listed.append(dict(request.url.params))
            if self.refuse_with is not None and "startKey" in request.url.params:
                return self.refuse_with
            runs = [_entry(r) for r in (HELD, WAITING)]  # the longest waiting first
            cursor = request.url.params.get("cursor")
            # The first page holds HELD; the next one WAITING.
            page: dict[str, Any] = (
                {"runs": runs[:1], "nextCursor": "c-2"}
                if cursor is None
                else {"runs": runs[1:], "nextCursor": None}
            )
            return httpx.Response(200, json={**page, "total": 2, "totalIsEstimate": False})
        match = re.fullmatch(r"/v1/runs/([^/]+)/inspection", path)
        if match:
            if match.group(1) not in (HELD, WAITING, UNSURE):
                return _problem(404, "run.not-found", "no such run")
            return httpx.Response(200, json=_inspection(match.group(1)))
        if path == "/v1/operator/doctor":
            return httpx.Response(200, json=_DOCTOR)
        match = re.fullmatch(r"/v1/runs/bulk/(reconcile|retry-same|cancel)", path)
        if match and request.method == "POST":
            if self.refuse_with is not None:
                return self.refuse_with
            chosen = [HELD, WAITING][: int(body["limit"]) if body else 2]
            if body and body.get("dryRun"):
                return httpx.Response(
                    200, json={"dryRun": True, "matched": len(chosen), "runIds": chosen}
                )
            results = [{"runId": HELD, "result": "accepted"}]
            if len(chosen) > 1:
                results.append({"runId": WAITING, "code": "retry.refused"})
            return httpx.Response(
                200, json={"dryRun": False, "matched": len(chosen), "results": results}
            )
        match = re.fullmatch(r"/v1/runs/([^/]+)/(reconcile|retry-same|cancel)", path)
        if match and request.method == "POST":
            if self.refuse_with is not None:
                return self.refuse_with
            return httpx.Response(200, json={**_inspection(match.group(1)), "result": "accepted"})
        return _problem(404, "not-found", "no such route")


_STATUS_KEYS = frozenset({"runId", "workflow", "state", "attention", "createdAt", "updatedAt"})


def _entry(run_id: str) -> dict[str, Any]:
    """The run's list entry: its status and the step that needs attention, as the API
    lists runs that need it."""
    inspection = _inspection(run_id)
    step = inspection["steps"][-1]
    shown = {"step": step["step"], "cause": step["cause"]}
    if "causeStatus" in step:
        shown["causeStatus"] = step["causeStatus"]
    shown["since"] = step["startedAt"]
    status = {k: v for k, v in inspection.items() if k in _STATUS_KEYS}
    return {**status, "attentionStep": shown}


_DOCTOR = {
    "activationReady": True,
    "schemaVersion": 4,
    "databaseId": "db-test",
    "workflows": [{"id": "approval-notice", "digest": DIGEST}],
    "holds": {"execution": False, "admission": False},
    "state": {"auditReady": True, "storeReady": True, "uncertain": 1, "held": 1, "dueJobs": 0},
    "tokenRefusals": [{"connection": "notices", "error": "invalid_client"}],
    "mode": "ordinary",
}


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator.token"
    path.write_text("operator-token-value\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def fake() -> FakeApi:
    return FakeApi()


@pytest.fixture
def settings(token_file: Path) -> web.Settings:
    workflow = check_source_dir(ROOT / "examples" / "approval-notice")
    return web.Settings(
        api_url="https://coordinator.test", token_file=token_file, workflows={DIGEST: workflow}
    )


def _client(settings: web.Settings, fake: FakeApi) -> httpx.AsyncClient:
    api = web.Api(settings, transport=httpx.MockTransport(fake))
    app = web.create_app(settings, ORIGIN, api)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)


@pytest.fixture
async def client(settings: web.Settings, fake: FakeApi) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(settings, fake) as test_client:
        yield test_client


async def _open(client: httpx.AsyncClient, settings: web.Settings) -> None:
    """Open the printed URL once: the session cookie."""
    answer = await client.get(f"/?key={settings.access_key}")
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    assert "coordinator_console" in client.cookies


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert found, "the page has no CSRF token"
    return found.group(1)


# ------------------------------------------------------------------------------ sessions


async def test_a_request_without_the_access_key_gets_nothing_from_the_api(
    client: httpx.AsyncClient, fake: FakeApi
) -> None:
    answer = await client.get("/")
    assert answer.status_code == 401
    assert "open the URL that coordinatorctl console printed" in answer.text
    wrong = await client.get("/?key=not-the-key")
    assert wrong.status_code == 401
    assert fake.sent == []


async def test_the_printed_url_opens_a_session_and_the_address_loses_the_key(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    answer = await client.get(f"/doctor?key={settings.access_key}")
    assert answer.status_code == 303 and answer.headers["location"] == "/doctor"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert (await client.get("/doctor")).status_code == 200


async def test_a_host_other_than_loopback_is_refused(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    answer = await client.get(
        f"/?key={settings.access_key}", headers={"host": "rebound.example:8765"}
    )
    assert answer.status_code == 400


async def test_every_answer_carries_the_strict_policy(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    for answer in (await client.get("/"), await client.get("/static/console.css")):
        assert answer.headers["content-security-policy"] == web.CONTENT_SECURITY_POLICY
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["cache-control"] == "no-store"
    assert "script-src" not in web.CONTENT_SECURITY_POLICY  # default-src 'none' covers scripts
    assert "default-src 'none'" in web.CONTENT_SECURITY_POLICY


# ------------------------------------------------------------------------------ pages


async def test_the_attention_list_is_the_longest_waiting_first_one_call_a_page_both_ways(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    first = (await client.get("/")).text
    assert HELD in first and WAITING not in first
    assert "send-approval: effect unknown (the product answered 502)" in first
    assert "2 runs need an operator, the longest waiting first: 1 to 1 shown" in first
    assert fake.listed == [{"attention": "true", "order": "oldest", "limit": "50"}]
    # One call a page: no inspection of each run.
    assert [path for _, path, *_ in fake.sent] == ["/v1/runs"]
    assert 'href="/?cursor=c-2&amp;trail=-" rel="next"' in first
    assert "Previous page" not in first

    second = (await client.get("/?cursor=c-2&trail=-")).text
    assert WAITING in second and HELD not in second
    assert "the issuer refused the connection&#39;s token" in second
    assert ": 51 to 51 shown" in second
    assert fake.listed[-1]["cursor"] == "c-2"
    assert 'href="/" rel="prev">Previous page' in second
    assert "Next page" not in second
    # The token goes to the API, never into a page.
    assert all(auth == "Bearer operator-token-value" for *_, auth in fake.sent)
    assert "operator-token-value" not in first + second


async def test_the_run_page_shows_steps_effects_waits_and_the_path_drawn(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    await _open(client, settings)
    page = (await client.get(f"/runs/{HELD}")).text
    assert 'data-workflow="approval-notice"' in page
    assert '<g class="node call current on-path unknown" id="step-send-approval"' in page
    assert '<g class="node call on-path" id="step-request-review"' in page
    assert '<g class="node call" id="step-send-rejection"' in page  # not on the path
    assert "next check 2027-01-05T09:00:00.000Z, 3 checks" in page
    assert 'class="step-uncertain effect-unknown"' in page
    for action in web.FORMS:
        assert f'action="/runs/{HELD}/{action}"' in page
    assert page.count('name="csrf"') == len(web.FORMS)


async def test_the_attention_filters_go_to_the_api_and_stay_in_the_page_links(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    page = (await client.get("/?cause=status-5xx&step=send-approval&workflow=&x=1")).text
    assert fake.listed[-1] == {
        "attention": "true",
        "order": "oldest",
        "limit": "50",
        "step": "send-approval",
        "cause": "status-5xx",
    }
    assert 'href="/?step=send-approval&amp;cause=status-5xx&amp;cursor=c-2&amp;trail=-"' in page
    assert '<option value="status-5xx" selected>' in page
    assert 'value="send-approval"' in page


async def test_the_header_search_opens_a_whole_id_and_finds_the_runs_a_start_of_one_names(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    whole = "8E5D07F1-3C2A-8B4E-9D6F-0A1B2C3D4E5F"
    opened = await client.get("/go", params={"run": whole})
    assert (opened.status_code, opened.headers["location"]) == (303, f"/runs/{whole.lower()}")
    started = await client.get("/go", params={"run": "8E5D07F1-3"})
    assert started.headers["location"] == "/find?runIdPrefix=8e5d07f1-3"
    asked = len(fake.listed)
    empty = (await client.get("/find")).text
    # The bare page asks nothing: it is the three forms.
    assert len(fake.listed) == asked and "No run matches" not in empty
    assert 'name="startKey"' in empty and 'name="eventId"' in empty
    page = (await client.get(started.headers["location"])).text
    assert fake.listed[-1] == {"runIdPrefix": "8e5d07f1-3", "limit": "100"}
    assert "2 runs match: the first 1 by id shown" in page
    assert f'href="/runs/{HELD}"' in page and 'value="8e5d07f1-3"' in page
    await client.get(
        "/find", params={"workflow": "approval-notice", "startKey": "order 77", "startSub": ""}
    )
    assert fake.listed[-1] == {
        "workflow": "approval-notice",
        "startKey": "order 77",
        "limit": "100",
    }


async def test_a_refused_search_shows_the_problem(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    fake.refuse_with = _problem(400, "request.invalid", "startKey: needs the workflow")
    page = await client.get("/find", params={"startKey": "order-77"})
    assert page.status_code == 400 and "startKey: needs the workflow" in page.text


async def test_reconcile_is_offered_only_where_the_product_keeps_receipts(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    await _open(client, settings)
    page = (await client.get(f"/runs/{UNSURE}")).text
    assert f'action="/runs/{UNSURE}/reconcile"' not in page
    assert f'action="/runs/{UNSURE}/retry-same"' in page
    assert f'action="/runs/{UNSURE}/cancel"' in page
    assert "casework-review-producer create-review-request keeps no receipts" in page
    # Messaging keeps them: the held notice's page offers all three.
    held = (await client.get(f"/runs/{HELD}")).text
    assert f'action="/runs/{HELD}/reconcile"' in held and "keeps no receipts" not in held


async def test_without_the_package_the_run_page_says_how_to_get_the_picture(
    token_file: Path, fake: FakeApi
) -> None:
    bare = web.Settings(api_url="https://coordinator.test", token_file=token_file)
    async with _client(bare, fake) as test_client:
        await _open(test_client, bare)
        page = (await test_client.get(f"/runs/{HELD}")).text
    assert "<svg" not in page
    assert "--runtime-config" in page and DIGEST in page


async def test_an_api_problem_is_shown_as_it_came(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    await _open(client, settings)
    answer = await client.get("/runs/no-such-run")
    assert answer.status_code == 404
    assert "run.not-found" in answer.text and "no such run" in answer.text


async def test_the_doctor_page_shows_the_report(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    await _open(client, settings)
    page = (await client.get("/doctor")).text
    assert "db-test" in page and DIGEST in page and "recovery-only" not in page
    # Every member in words, its name beside, and the token refusals in full.
    assert "Steps with an unknown effect <code" in page
    assert "Runs held for an operator <code" in page
    assert '<th scope="row">notices</th><td><code>invalid_client</code></td>' in page


# ------------------------------------------------------------------------------ actions


async def test_a_valid_form_sends_the_reference_and_shows_the_result(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    token = _csrf((await client.get(f"/runs/{HELD}")).text)
    answer = await client.post(
        f"/runs/{HELD}/reconcile",
        data={"csrf": token, "reason": "INC-2041"},
        headers={"origin": ORIGIN, "sec-fetch-site": "same-origin"},
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/runs/{HELD}"
    assert ("POST", f"/v1/runs/{HELD}/reconcile", {"reason": "INC-2041"}) in [
        sent[:3] for sent in fake.sent
    ]
    shown = (await client.get(answer.headers["location"])).text
    assert '<p class="notice" role="status">reconcile: accepted</p>' in shown
    # Shown once: the page after that is the run's page alone.
    assert "reconcile: accepted" not in (await client.get(f"/runs/{HELD}")).text


async def test_a_bulk_action_is_previewed_by_a_dry_run_then_done_once_confirmed(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    page = (await client.get("/?cause=status-5xx&step=send-approval")).text
    token = _csrf(page)
    assert 'action="/bulk"' in page and 'name="limit" type="number"' in page
    assert 'value="2"' in page  # the list's total, as the default limit
    form = {
        "csrf": token,
        "action": "retry-same",
        "reason": "INC-2041",
        "limit": "2",
        "cause": "status-5xx",
        "step": "send-approval",
    }
    preview = await client.post("/bulk", data=form)
    assert preview.status_code == 200
    assert "<strong>retry-same</strong> would act on <strong>2</strong> runs" in preview.text
    assert HELD in preview.text and WAITING in preview.text
    assert 'name="confirm" value="yes"' in preview.text
    method, path, body, _ = fake.sent[-1]
    assert (method, path) == ("POST", "/v1/runs/bulk/retry-same")
    assert body == {
        "reason": "INC-2041",
        "filter": {"attention": True, "step": "send-approval", "cause": "status-5xx"},
        "limit": 2,
        "dryRun": True,
    }
    # Nothing was acted on yet: the only bulk request so far is the dry run.
    assert [b for m, p, b, _ in fake.sent if p.startswith("/v1/runs/bulk/")] == [body]

    done = await client.post("/bulk", data={**form, "confirm": "yes"})
    assert done.status_code == 303 and done.headers["location"] == "/bulk/result"
    assert fake.sent[-1][2] == {k: v for k, v in body.items() if k != "dryRun"}
    shown = (await client.get("/bulk/result")).text
    assert "retry-same on 2 runs: accepted 1, retry.refused 1." in shown
    assert "<code>retry.refused</code>" in shown
    # Shown once, from the session: the address cannot bring it back.
    again = await client.get("/bulk/result")
    assert again.status_code == 303 and again.headers["location"] == "/"


async def test_a_bulk_form_without_its_token_or_with_a_bad_action_sends_nothing(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    token = _csrf((await client.get("/")).text)
    before = len(fake.sent)
    forged = await client.post("/bulk", data={"action": "cancel", "reason": "INC-1", "limit": "5"})
    assert forged.status_code == 403
    unknown = await client.post(
        "/bulk", data={"csrf": token, "action": "erase", "reason": "INC-1", "limit": "5"}
    )
    assert unknown.status_code == 404
    assert fake.sent[before:] == []


async def test_a_refused_bulk_action_shows_the_problem(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    token = _csrf((await client.get("/")).text)
    fake.refuse_with = _problem(400, "request.invalid", "/limit: must be an integer from 1 to 1000")
    answer = await client.post(
        "/bulk", data={"csrf": token, "action": "cancel", "reason": "INC-1", "limit": "5000"}
    )
    assert answer.status_code == 400
    assert "/limit: must be an integer from 1 to 1000" in answer.text
    assert fake.sent[-1][2] == {
        "reason": "INC-1",
        "filter": {"attention": True},
        "limit": 5000,
        "dryRun": True,
    }


async def test_a_call_being_retried_shows_its_last_cause_next_attempt_and_deadline(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    await _open(client, settings)
    page = (await client.get(f"/runs/{WAITING}")).text
    assert (
        "retrying: the issuer refused the token at 2027-01-06T09:04:00.000Z; "
        "next attempt 2027-01-06T09:08:00.000Z; gives up at 2027-01-06T13:00:00.000Z"
    ) in page
    # A step without a retry shows none.
    assert "retrying:" not in (await client.get(f"/runs/{HELD}")).text


async def test_a_run_with_no_held_call_is_offered_cancel_alone(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    await _open(client, settings)
    page = (await client.get(f"/runs/{WAITING}")).text  # a ready call, token refused
    assert f'action="/runs/{WAITING}/cancel"' in page
    assert f'action="/runs/{WAITING}/retry-same"' not in page
    assert f'action="/runs/{WAITING}/reconcile"' not in page
    assert "No call of this run is held for an operator" in page
    held = (await client.get(f"/runs/{HELD}")).text  # an uncertain call to Messaging
    for action in ("reconcile", "retry-same", "cancel"):
        assert f'action="/runs/{HELD}/{action}"' in held
    assert "No call of this run is held" not in held


@pytest.mark.parametrize(
    ("states", "no_receipts", "offered"),
    [
        ({"uncertain"}, None, ["retry-same", "cancel", "reconcile"]),
        ({"uncertain"}, "casework create-review-request", ["retry-same", "cancel"]),
        ({"not-sent", "completed"}, None, ["retry-same", "cancel"]),
        ({"ready"}, None, ["cancel"]),
        ({"waiting", "completed"}, None, ["cancel"]),
    ],
)
def test_each_form_is_offered_only_where_it_can_act(
    states: set[str], no_receipts: str | None, offered: list[str]
) -> None:
    steps = [{"state": state} for state in sorted(states)]
    assert sorted(web.offered_actions(steps, no_receipts)) == sorted(offered)


@pytest.mark.parametrize(
    ("retry", "shown"),
    [
        (
            {"lastCause": "status-503", "lastStatus": 503, "lastAttemptAt": "T1"},
            "retrying: the product answered 503 (unavailable) at T1",
        ),
        (
            {"lastCause": "never-connected", "lastAttemptAt": "T1", "nextAttemptAt": "T2"},
            "retrying: no connection could be made at T1; next attempt T2",
        ),
    ],
)
def test_retry_text_says_why_and_when(retry: dict[str, Any], shown: str) -> None:
    assert web.retry_text({"retry": retry}) == shown
    assert web.retry_text({}) == ""


def test_a_run_retried_too_long_says_so_in_the_attention_list() -> None:
    entry = {"attentionStep": {"step": "send-notice", "cause": "retrying", "since": "T"}}
    assert web.reason(entry) == (
        "send-notice: the call has been retried automatically for longer than the "
        "deployment allows without an operator"
    )


async def test_the_address_cannot_make_a_page_claim_an_action_happened(
    client: httpx.AsyncClient, settings: web.Settings
) -> None:
    await _open(client, settings)
    page = (await client.get(f"/runs/{HELD}?done=cancel&result=cancelled")).text
    assert "cancel: cancelled" not in page
    assert 'role="status"' not in page


async def test_a_refused_action_shows_the_problem_document(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    token = _csrf((await client.get(f"/runs/{HELD}")).text)
    fake.refuse_with = _problem(400, "request.invalid", "reason is not an investigation reference")
    answer = await client.post(f"/runs/{HELD}/retry-same", data={"csrf": token, "reason": "not ok"})
    assert answer.status_code == 400
    assert "request.invalid" in answer.text
    assert "reason is not an investigation reference" in answer.text
    assert "not ok" not in answer.text  # the input is not echoed


@pytest.mark.parametrize(
    ("form", "headers"),
    [
        ({"reason": "INC-1"}, {}),  # no token
        ({"reason": "INC-1", "csrf": "0" * 64}, {}),  # a wrong token
        (None, {"origin": "http://evil.example"}),  # the right token from another origin
        (None, {"sec-fetch-site": "cross-site"}),  # ... announced as another site's
    ],
)
async def test_a_forged_post_is_refused_before_anything_is_sent(
    client: httpx.AsyncClient,
    settings: web.Settings,
    fake: FakeApi,
    form: dict[str, str] | None,
    headers: dict[str, str],
) -> None:
    await _open(client, settings)
    token = _csrf((await client.get(f"/runs/{HELD}")).text)
    before = len(fake.sent)
    data = form if form is not None else {"reason": "INC-1", "csrf": token}
    answer = await client.post(f"/runs/{HELD}/cancel", data=data, headers=headers)
    assert answer.status_code == 403
    assert "authorization.refused" in answer.text
    assert fake.sent[before:] == []


async def test_another_sessions_token_does_not_pass(
    client: httpx.AsyncClient, settings: web.Settings, fake: FakeApi
) -> None:
    await _open(client, settings)
    first = _csrf((await client.get(f"/runs/{HELD}")).text)
    client.cookies.clear()
    await _open(client, settings)
    before = len(fake.sent)
    answer = await client.post(f"/runs/{HELD}/cancel", data={"csrf": first, "reason": "INC-1"})
    assert answer.status_code == 403
    assert fake.sent[before:] == []


# ------------------------------------------------------------------------------ helpers


def test_age_reads_like_an_operator_would_say_it() -> None:
    now = clock.parse_instant("2027-01-05T12:30:00Z")
    assert web.age("2027-01-05T12:29:30Z", now) == "just now"
    assert web.age("2027-01-05T12:18:00Z", now) == "12 min"
    assert web.age("2027-01-05T09:00:00Z", now) == "3 h 30 min"
    assert web.age("2027-01-02T10:30:00Z", now) == "3 d 2 h"
    assert web.age(None, now) == "-"


def test_only_loopback_may_be_bound() -> None:
    for address in ("0.0.0.0:8080", "localhost:8080", "127.0.0.1:http", "192.168.1.2:0"):
        with pytest.raises(ValueError, match=r"127\.0\.0\.1:PORT"):
            web.bind(address)
    sock = web.bind("127.0.0.1:0")
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_packages_are_found_in_a_package_folder_or_a_folder_of_them(tmp_path: Path) -> None:
    from core.errors import CoordinatorError
    from core.workflow.package import build_package

    built = build_package(ROOT / "examples" / "approval-notice", tmp_path / "out")
    assert set(web.workflows_of([tmp_path / "out"])) == {built.digest}
    assert set(web.workflows_of([built.path])) == {built.digest}
    (tmp_path / "empty").mkdir()
    with pytest.raises(CoordinatorError, match="no workflow package here"):
        web.workflows_of([tmp_path / "empty"])


@pytest.mark.parametrize("cause", ["token-refused", "tls-refused"])
def test_a_step_that_sent_nothing_says_why_in_words(cause: str) -> None:
    entry = {
        "state": "running",
        "attention": True,
        "attentionStep": {"step": "send", "cause": cause},
    }
    assert web.reason(entry) == f"send: {web.CAUSES[cause]}"


def test_each_kind_of_attention_is_said_in_words() -> None:
    def said(step: dict[str, Any] | None, **status: Any) -> str:
        entry: dict[str, Any] = {"state": "held", "attention": True, **status}
        if step is not None:
            entry["attentionStep"] = {"since": "2027-01-05T09:00:00.000Z", **step}
        return web.reason(entry)

    assert said({"step": "send", "cause": "status-5xx", "causeStatus": 503}) == (
        "send: effect unknown (the product answered 503)"
    )
    assert said({"step": "send", "cause": "lease-expired"}) == (
        "send: effect unknown (the dispatcher sending it stopped)"
    )
    assert said({"step": "send"}) == (
        "send: the product never saw the command; retry-same may resend it"
    )
    assert said(None, failure={"kind": "refused", "step": "send"}) == "failed: refused at send"
    assert said(None) == "needs an operator"
