"""``coordinatorctl console``: a small operator console on a loopback port.

The console is a Starlette application that ``coordinatorctl`` serves on ``127.0.0.1``. It
renders HTML on the server from what the coordinator's API answers the operator's token:
the runs that need an operator, the longest waiting first (one ``GET /v1/runs?attention=true
&order=oldest`` a page: each entry names the step that needs attention and why),
one run's inspection with its workflow drawn, the doctor report, and the three run actions
(reconcile, retry-same, cancel). The gateway gains nothing: the console is one more API
client, like the other commands, and the token never reaches the browser.

Who may use it. Loopback is shared by every user of the machine, so the console does not
trust a request for arriving there. At start it makes an access key and prints the URL that
carries it; opening that URL once gives the browser a session cookie (``HttpOnly``,
``SameSite=Strict``) and the address bar loses the key. Any other request without a session
gets a page saying so, and nothing from the API.

What a page may do. Every answer carries a Content-Security-Policy that allows the
console's own stylesheet and nothing else: no script, no frame, no form posted elsewhere
(the pages have no script at all). Every form carries a CSRF token, an HMAC of the session
under a key that lives only in this process; a post without it, with another session's, or
announced by the browser as coming from another site is refused before anything is sent.
The ``Host`` header must name the loopback address, which keeps a rebound DNS name out.

What a page shows. Status, inspection and doctor documents carry no input, command or
product answer (CONTRACT §8.4), so neither can a page. A refused action shows the API's
RFC 9457 problem as it came: its code, title, status and detail.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, quote, urlencode

import httpx
import jinja2
import uvicorn
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cli import api, render
from core import clock, derive
from core.actions import ACTIONS, RUN, operator_actions
from core.codes import Code
from core.errors import CoordinatorError
from core.runs import ATTENTION_CAUSES
from core.workflow.catalogue import operation
from core.workflow.graph import run_picture
from core.workflow.model import CallStep, Workflow

HERE: Final = Path(__file__).resolve().parent
TEMPLATES: Final = HERE / "console_templates"
STATIC: Final = HERE / "console_static"

LOOPBACK: Final = "127.0.0.1"
SESSION_COOKIE: Final = "coordinator_console"
KEY_PARAMETER: Final = "key"
FORMS: Final = tuple(action.name for action in operator_actions(RUN) if action.form)
"""The actions the run page offers as forms (core/actions.py)."""
ATTENTION_PAGE: Final = 50
"""Runs per attention page (one API call a page)."""
ATTENTION_FILTERS: Final = ("workflow", "step", "cause", "updatedBefore")
"""The list filters the attention page offers (``GET /v1/runs``'s names)."""
SEARCH_FIELDS: Final = ("runIdPrefix", "workflow", "startKey", "startSub", "eventSource", "eventId")
"""What the find page's forms send, by ``GET /v1/runs``'s names; the API checks them."""
SEARCH_PAGE: Final = 100
"""Runs a search shows (its total counts them all)."""
FIRST: Final = "-"
"""The first page in the attention list's trail (a cursor is never a lone ``-``)."""
TRAIL_LIMIT: Final = 200
"""The most earlier pages the attention list remembers for "Previous page" (its cursors
travel in the page's own address)."""
BULK_PREVIEW: Final = 100
"""Run ids a bulk preview lists by name (the count covers them all)."""
BULK_TIMEOUT_SECONDS: Final = 600.0
"""How long the console waits for a bulk action's answer (a thousand runs take a while)."""
MAX_BULK_LIMIT: Final = 1000
FORM_LIMIT: Final = 8192
"""The largest form body the console reads (a reference is at most 128 characters)."""
ENDED: Final = frozenset({"succeeded", "failed", "cancelled"})
OPEN_STEP_STATES: Final = ("uncertain", "not-sent", "prepared", "ready", "waiting")

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

CAUSES: Final = {
    "timeout-after-send": "no answer came after the command was sent",
    "connection-lost": "the connection broke after the command was sent",
    "status-5xx": "the product answered with a server error",
    "unreadable-answer": "the product's answer could not be read",
    "framing-violation": "the product's answer broke HTTP framing",
    "answer-too-large": "the product's answer was over the size limit",
    "lease-expired": "the dispatcher sending it stopped",
    "restore-snapshot": "placed by a restore hold",
    "token-refused": "the issuer refused the connection's token; nothing was sent",
    "tls-refused": "the product's or issuer's TLS certificate failed verification; "
    "nothing was sent",
    "retrying": "the call has been retried automatically for longer than the deployment "
    "allows without an operator",
}
"""What each inspection ``cause`` means, in a few words."""

RETRY_CAUSES: Final = {
    "never-connected": "no connection could be made",
    "tls-refused": "TLS verification failed",
    "token-refused": "the issuer refused the token",
    "status-429": "the product answered 429 (too many requests)",
    "status-503": "the product answered 503 (unavailable)",
}
"""What a retried call's ``retry.lastCause`` means, in a few words."""


# ------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """What one console serves: the API it calls, the token file, the known workflows."""

    api_url: str
    token_file: Path
    workflows: Mapping[str, Workflow] = field(default_factory=dict)
    """Workflows by package digest (from ``--runtime-config`` or ``--packages``): a run page
    draws its workflow when its digest is among them."""
    access_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))


def workflows_of(
    folders: Sequence[Path], pins: Sequence[tuple[Path, str]] = ()
) -> dict[str, Workflow]:
    """The verified packages under ``folders`` (each a package or a folder of packages) and
    the runtime file's ``pins``, by digest. A folder that holds no package is refused."""
    from core.workflow.package import MANIFEST, verify_package

    found: dict[str, Workflow] = {}
    for root, digest in pins:
        verified = verify_package(root, digest)
        found[verified.digest] = verified.workflow
    for folder in folders:
        if (folder / MANIFEST).exists():
            roots = [folder]
        else:
            roots = sorted(manifest.parent for manifest in folder.glob(f"*/{MANIFEST}"))
        if not roots:
            raise CoordinatorError(Code.PACKAGE_INVALID, f"{folder}: no workflow package here")
        for root in roots:
            verified = verify_package(root, None)
            found[verified.digest] = verified.workflow
    return found


# ------------------------------------------------------------------------------- the API


@dataclass(frozen=True)
class Problem:
    """An RFC 9457 problem, as the API sent it (or as the console met a failure)."""

    status: int
    code: str
    title: str
    detail: str
    type: str = ""
    instance: str = ""

    @classmethod
    def of(cls, status: int, document: Any) -> Problem:
        if isinstance(document, dict) and isinstance(document.get("code"), str):
            return cls(
                status=status,  # the answer's own status, whatever the body claims
                code=str(document["code"]),
                title=str(document.get("title") or ""),
                detail=str(document.get("detail") or ""),
                type=str(document.get("type") or ""),
                instance=str(document.get("instance") or ""),
            )
        return cls(
            status,
            Code.SERVICE_UNAVAILABLE.value,
            "Unexpected answer",
            f"the coordinator answered HTTP {status} without a problem document",
        )

    @classmethod
    def local(cls, status: int, code: Code, detail: str) -> Problem:
        """A refusal the console makes itself (no request was sent)."""
        return cls(status, code.value, code.value, detail)


class Refused(Exception):
    """The API (or the console before it) refused: carries the problem to show."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.code)
        self.problem = problem


class Api:
    """The coordinator's API, called with the token file's current content."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        self._base = settings.api_url.rstrip("/")
        self._token_file = settings.token_file
        self._client = httpx.AsyncClient(
            timeout=api.TIMEOUT_SECONDS,
            transport=transport,
            trust_env=False,
            verify=api.client_tls(),
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout: float = api.TIMEOUT_SECONDS,
    ) -> Any:
        """One request; the JSON of a 2xx answer, or :class:`Refused` with the problem."""
        try:
            token = api.read_token_file(self._token_file)  # read each time: rotation works
        except CoordinatorError as exc:
            raise Refused(Problem.local(503, exc.code, exc.detail)) from None
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        try:
            answer = await self._client.request(
                method,
                self._base + path,
                params=params,
                json=body,
                headers=headers,
                timeout=timeout,
            )
        except httpx.HTTPError:
            raise Refused(
                Problem.local(503, Code.SERVICE_UNAVAILABLE, f"cannot reach {self._base}")
            ) from None
        try:
            document = answer.json()
        except ValueError:
            document = None
        if 200 <= answer.status_code < 300:
            return document
        raise Refused(Problem.of(answer.status_code, document))


# ------------------------------------------------------------------------------- what pages show


STATE_LABELS: Final = {
    "auditReady": "Audit journal writable",
    "storeReady": "Database reachable",
    "storeHost": "Database server serving",
    "uncertain": "Steps with an unknown effect",
    "held": "Runs held for an operator",
    "retrying": "Calls waiting to be retried",
    "dueJobs": "Steps due, not yet taken",
    "waiting": "Runs waiting (timers, reviews)",
    "stateKeyVersionsInUse": "State key versions in use",
}
"""Doctor's ``state`` members in words (the member's own name is shown beside)."""


def age(since: str | None, now: datetime) -> str:
    """``3 d 4 h``, ``12 min``, ``just now``: how long ago ``since`` was."""
    if not since:
        return "-"
    try:
        seconds = int((now - clock.parse_instant(since)).total_seconds())
    except ValueError:
        return "-"
    if seconds < 60:
        return "just now"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if days:
        return f"{days} d {hours % 24} h"
    if hours:
        return f"{hours} h {minutes % 60} min"
    return f"{minutes} min"


def cause_text(step: Mapping[str, Any]) -> str:
    """An inspection step's ``cause``, in words (with the product's status for a 5xx)."""
    cause = str(step.get("cause") or "")
    text = CAUSES.get(cause, cause)
    if cause == "status-5xx" and step.get("causeStatus"):
        text = f"the product answered {step['causeStatus']}"
    return text


def reason(entry: Mapping[str, Any]) -> str:
    """Why a run needs an operator, from its list entry (its status and ``attentionStep``):
    a step whose effect is unknown says how the answer went missing; one that sent nothing
    says what stands in the way; one without a cause is a command the product never saw."""
    step = entry.get("attentionStep")
    if isinstance(step, Mapping):
        name, cause = step.get("step"), step.get("cause")
        if cause in ("token-refused", "tls-refused", "retrying"):
            return f"{name}: {CAUSES[str(cause)]}"
        if cause:
            return f"{name}: effect unknown ({cause_text(step)})"
        return f"{name}: the product never saw the command; retry-same may resend it"
    failure = entry.get("failure")
    if isinstance(failure, dict):
        return f"failed: {failure.get('kind')} at {failure.get('step')}"
    return "needs an operator"


def current_step(steps: Sequence[Mapping[str, Any]], state: str) -> str | None:
    """The step a live run stands at: the newest one still open."""
    if state in ENDED:
        return None
    for step in reversed(steps):
        if step.get("state") in OPEN_STEP_STATES:
            return str(step.get("step"))
    return str(steps[-1].get("step")) if steps else None


def without_receipts(workflow: Workflow | None, steps: Sequence[Mapping[str, Any]]) -> str | None:
    """The product operation of the run's uncertain or not-sent call when that product
    keeps no receipts (``casework-review-producer create-review-request``), so that
    reconcile cannot settle it (CONTRACT §14); ``None`` when it keeps them, or when the
    console has not the run's package to tell (the API then says ``reconcile.unsupported``)."""
    if workflow is None:
        return None
    for step in reversed(steps):
        if step.get("state") not in ("uncertain", "not-sent"):
            continue
        definition = workflow.steps.get(str(step.get("step")))
        if not isinstance(definition, CallStep):
            return None
        kind = workflow.connections.get(definition.connection)
        op = operation(kind, definition.operation) if kind is not None else None
        if op is not None and not op.has_receipts:
            return f"{kind} {op.name}"
        return None
    return None


def picture(
    workflow: Workflow | None, steps: Sequence[Mapping[str, Any]], state: str
) -> Markup | None:
    """The run's workflow drawn with its path, current step and unknown effects marked."""
    if workflow is None:
        return None
    path = [str(s.get("step")) for s in steps]
    try:
        drawn = run_picture(
            workflow,
            path=path,
            current=current_step(steps, state),
            unknown=[str(s.get("step")) for s in steps if s.get("effect") == "unknown"],
        )
    except ValueError:  # a step this package lacks: not the run's workflow after all
        return None
    # The SVG is written by core.workflow.graph, which escapes every text it places.
    return Markup(drawn)  # noqa: S704


def wait_text(step: Mapping[str, Any]) -> str:
    """A wait's timing: due or next check, timeout, checks so far."""
    wait = step.get("wait")
    if not isinstance(wait, dict):
        return ""
    parts = []
    if wait.get("dueAt"):
        parts.append(f"due {wait['dueAt']}")
    if wait.get("nextCheckAt"):
        parts.append(f"next check {wait['nextCheckAt']}")
    if wait.get("timeoutAt"):
        parts.append(f"times out {wait['timeoutAt']}")
    checks = wait.get("checks", 0)
    parts.append(f"{checks} check" + ("" if checks == 1 else "s"))
    return ", ".join(parts)


def offered_actions(steps: Sequence[Mapping[str, Any]], no_receipts: str | None) -> list[str]:
    """The forms a live run's page offers: reconcile while a call's effect is unknown and
    its product keeps receipts, retry-same while a call is held (unknown or never seen by
    the product), cancel always. A call the coordinator is still retrying by itself holds
    nothing for an operator to settle or resend, so its run is offered cancel alone."""
    states = {step.get("state") for step in steps}
    offered = []
    for action in FORMS:
        if action == "reconcile" and ("uncertain" not in states or no_receipts):
            continue
        if action == "retry-same" and not states & {"uncertain", "not-sent"}:
            continue
        offered.append(action)
    return offered


def retry_text(step: Mapping[str, Any]) -> str:
    """A call waiting for its next automatic attempt: why the last one did not go through,
    when it was, when the next one is due and until when it will be retried."""
    retry = step.get("retry")
    if not isinstance(retry, dict):
        return ""
    cause = str(retry.get("lastCause") or "")
    text = RETRY_CAUSES.get(cause, cause)
    if retry.get("lastStatus") and not cause.startswith("status-"):
        text += f" (HTTP {retry['lastStatus']})"
    parts = [f"retrying: {text} at {retry.get('lastAttemptAt')}"]
    if retry.get("nextAttemptAt"):
        parts.append(f"next attempt {retry['nextAttemptAt']}")
    if retry.get("deadlineAt"):
        parts.append(f"gives up at {retry['deadlineAt']}")
    return "; ".join(parts)


# ------------------------------------------------------------------------------- sessions


@dataclass
class Sessions:
    """The browser sessions that opened the console's URL with its access key."""

    settings: Settings
    known: set[str] = field(default_factory=set)
    results: dict[tuple[str, str], str] = field(default_factory=dict)
    """What the API answered a session's last action on a run, shown once on the run's page
    after the redirect (``(session, run id)`` → ``action: result``). Kept here, never in the
    address: a link cannot make a page claim an action happened."""
    bulk_results: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """A session's last bulk action and the API's answer to it, shown once."""

    def open(self) -> str:
        session = secrets.token_urlsafe(32)
        self.known.add(session)
        return session

    def of(self, request: Request) -> str | None:
        session = request.cookies.get(SESSION_COOKIE)
        return session if session in self.known else None

    def csrf(self, session: str) -> str:
        return hmac.new(self.settings.csrf_key, session.encode(), hashlib.sha256).hexdigest()

    def key_matches(self, offered: str) -> bool:
        return hmac.compare_digest(offered.encode(), self.settings.access_key.encode())

    def csrf_matches(self, session: str, offered: str) -> bool:
        return hmac.compare_digest(offered.encode(), self.csrf(session).encode())


# ------------------------------------------------------------------------------- the app


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["cause"] = cause_text
    return env


class Console:
    """The pages and the actions, over one :class:`Api`."""

    def __init__(self, settings: Settings, api_client: Api) -> None:
        self.settings = settings
        self.api = api_client
        self.sessions = Sessions(settings)
        self.templates = _environment()

    # ---- rendering

    def page(self, template: str, session: str, status: int = 200, **values: Any) -> HTMLResponse:
        body = self.templates.get_template(template).render(
            csrf=self.sessions.csrf(session), now=clock.timestamp(clock.now()), **values
        )
        return HTMLResponse(body, status_code=status)

    def problem_page(self, problem: Problem, session: str | None, title: str) -> HTMLResponse:
        body = self.templates.get_template("problem.html").render(
            title=title,
            problem=problem,
            signed_in=session is not None,
            csrf="",
            now=clock.timestamp(clock.now()),
        )
        return HTMLResponse(body, status_code=problem.status)

    # ---- the pages

    async def attention(self, request: Request, session: str) -> Response:
        params = {"attention": "true", "order": "oldest", "limit": str(ATTENTION_PAGE)}
        # The filters the page's form sends, passed to the API as they are (it refuses a
        # bad one with a problem, shown as it came) and kept in the page links.
        filters = {
            name: value
            for name in ATTENTION_FILTERS
            if (value := (request.query_params.get(name) or "").strip())
        }
        params.update(filters)
        cursor = request.query_params.get("cursor") or ""
        # The pages before this one, each by its cursor (FIRST for the first page), oldest
        # first: the API pages forward only, so the way back travels in the address.
        trail = [c for c in (request.query_params.get("trail") or "").split(".") if c]
        if cursor:
            params["cursor"] = cursor
        try:
            listing = await self.api.call("GET", "/v1/runs", params=params)
        except Refused as refused:
            return self.problem_page(refused.problem, session, "Runs that need an operator")
        now = clock.now()
        rows = []
        for run in listing.get("runs") or []:
            since = (run.get("attentionStep") or {}).get("since")
            rows.append(
                {"status": run, "reason": reason(run), "since": since, "age": age(since, now)}
            )
        next_link = previous_link = None
        if listing.get("nextCursor"):
            forward = [*trail, cursor or FIRST][-TRAIL_LIMIT:]
            query = {**filters, "cursor": listing["nextCursor"], "trail": ".".join(forward)}
            next_link = "/?" + urlencode(query)
        if trail:
            query = dict(filters)
            if trail[-1] != FIRST:
                query["cursor"] = trail[-1]
            if trail[:-1]:
                query["trail"] = ".".join(trail[:-1])
            previous_link = "/" + ("?" + urlencode(query) if query else "")
        return self.page(
            "attention.html",
            session,
            rows=rows,
            total=listing.get("total", len(rows)),
            estimated=bool(listing.get("totalIsEstimate")),
            first=len(trail) * ATTENTION_PAGE + 1,
            next_link=next_link,
            previous_link=previous_link,
            filters=filters,
            causes=ATTENTION_CAUSES,
            bulk_actions=FORMS,
            bulk_limit=min(MAX_BULK_LIMIT, max(1, int(listing.get("total") or 0))),
        )

    async def find(self, request: Request, session: str) -> Response:
        """The searches by run id prefix, start key or event: the forms, and what the one
        that was sent found (the API refuses an incomplete or mixed search by name)."""
        asked = {
            name: value
            for name in SEARCH_FIELDS
            if (value := (request.query_params.get(name) or "").strip())
        }
        runs: list[dict[str, Any]] = []
        total = 0
        if asked:
            try:
                found = await self.api.call(
                    "GET", "/v1/runs", params={**asked, "limit": str(SEARCH_PAGE)}
                )
            except Refused as refused:
                return self.problem_page(refused.problem, session, "Find a run")
            runs = [
                {"status": run, "reason": reason(run) if run.get("attention") else ""}
                for run in found.get("runs") or []
            ]
            total = int(found.get("total") or len(runs))
        return self.page(
            "find.html", session, asked=asked, searched=bool(asked), runs=runs, total=total
        )

    async def run(
        self,
        request: Request,
        session: str,
        *,
        refusal: Problem | None = None,
        action: str | None = None,
    ) -> Response:
        run_id = request.path_params["run_id"]
        try:
            inspection = await self.api.call("GET", ACTIONS["inspect"].path(runId=run_id))
        except Refused as refused:
            return self.problem_page(refused.problem, session, "Run")
        steps = list(inspection.get("steps") or [])
        state = str(inspection.get("state") or "")
        workflow = self.settings.workflows.get(
            str((inspection.get("workflow") or {}).get("digest"))
        )
        # The answer to this session's own action, once; nothing the address says.
        notice = self.sessions.results.pop((session, run_id), None) if refusal is None else None
        no_receipts = without_receipts(workflow, steps)
        return self.page(
            "run.html",
            session,
            status=refusal.status if refusal is not None else 200,
            run=inspection,
            steps=[{**s, "waiting": wait_text(s), "retrying": retry_text(s)} for s in steps],
            picture=picture(workflow, steps, state),
            knows_workflow=workflow is not None,
            current=current_step(steps, state),
            ended=state in ENDED,
            refusal=refusal,
            refused_action=action,
            notice=notice,
            actions=offered_actions(steps, no_receipts),
            no_receipts=no_receipts,
        )

    async def doctor(self, request: Request, session: str) -> Response:
        try:
            report = await self.api.call("GET", ACTIONS["doctor"].path())
        except Refused as refused:
            return self.problem_page(refused.problem, session, "Doctor")
        return self.page("doctor.html", session, report=report, state_labels=STATE_LABELS)

    async def bulk(self, request: Request, session: str) -> Response:
        """The bulk form of the attention page: a dry run first, shown for the operator to
        confirm; the confirmed form acts, and its answer is shown once at /bulk/result."""
        form = await _form(request)
        if form is None or not self.sessions.csrf_matches(session, form.get("csrf", "")):
            problem = Problem.local(
                403, Code.AUTHORIZATION_REFUSED, "the form's CSRF token is missing or wrong"
            )
            return self.problem_page(problem, session, "Bulk action")
        action = form.get("action", "")
        if action not in FORMS:
            return self.problem_page(
                Problem.local(404, Code.NOT_FOUND, "no such action"), session, "Bulk action"
            )
        body = bulk_body(form)
        path = f"/v1/runs/bulk/{action}"
        confirmed = form.get("confirm") == "yes"
        try:
            answer = await self.api.call(
                "POST",
                path,
                body=body if confirmed else {**body, "dryRun": True},
                timeout=BULK_TIMEOUT_SECONDS,
            )
        except Refused as refused:
            return self.problem_page(refused.problem, session, "Bulk action")
        if confirmed:
            self.sessions.bulk_results[session] = (action, answer)
            return RedirectResponse("/bulk/result", status_code=303)
        run_ids = [str(run_id) for run_id in answer.get("runIds") or []]
        return self.page(
            "bulk.html",
            session,
            action=action,
            matched=int(answer.get("matched") or 0),
            shown=run_ids[:BULK_PREVIEW],
            reason=body["reason"],
            limit=body["limit"],
            filters={k: v for k, v in body["filter"].items() if k != "attention"},
        )

    async def bulk_result(self, request: Request, session: str) -> Response:
        """The answer to this session's last confirmed bulk action, once."""
        found = self.sessions.bulk_results.pop(session, None)
        if found is None:
            return RedirectResponse("/", status_code=303)
        action, answer = found
        results = list(answer.get("results") or [])
        return self.page(
            "bulk_result.html",
            session,
            action=action,
            matched=int(answer.get("matched") or 0),
            results=results,
            tally=render.tally(results),
        )

    async def act(self, request: Request, session: str) -> Response:
        run_id, action = request.path_params["run_id"], request.path_params["action"]
        if action not in FORMS:
            return self.problem_page(
                Problem.local(404, Code.NOT_FOUND, "no such action"), session, "Run"
            )
        form = await _form(request)
        if form is None or not self.sessions.csrf_matches(session, form.get("csrf", "")):
            # Not this console's form: nothing is sent.
            problem = Problem.local(
                403, Code.AUTHORIZATION_REFUSED, "the form's CSRF token is missing or wrong"
            )
            return self.problem_page(problem, session, "Run")
        try:
            answer = await self.api.call(
                "POST",
                ACTIONS[action].path(runId=run_id),
                body={"reason": form.get("reason", "")},
            )
        except Refused as refused:
            return await self.run(request, session, refusal=refused.problem, action=action)
        result = str(answer.get("result") or "done")
        self.sessions.results[(session, run_id)] = f"{action}: {result}"
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}", status_code=303)


def bulk_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The API body of a bulk form: the attention list's filters as the page had them, the
    reason and the limit as typed (the API checks them and says what is wrong)."""
    limit_text = form.get("limit", "").strip()
    limit: int | str = (
        int(limit_text) if limit_text.isdigit() and len(limit_text) < 6 else limit_text
    )
    filters: dict[str, Any] = {"attention": True}
    filters |= {name: form[name] for name in ATTENTION_FILTERS if form.get(name)}
    return {"reason": form.get("reason", ""), "filter": filters, "limit": limit}


async def _form(request: Request) -> dict[str, str] | None:
    """An ``application/x-www-form-urlencoded`` body of at most :data:`FORM_LIMIT` bytes."""
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            return None
    try:
        fields = parse_qs(body.decode("ascii"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return None
    return {name: values[0] for name, values in fields.items() if len(values) == 1}


def create_app(settings: Settings, origin: str, api_client: Api | None = None) -> Starlette:
    """The console's Starlette application, answering as ``origin`` (its printed URL's)."""
    console = Console(settings, api_client or Api(settings))
    sessions = console.sessions
    Handler = Callable[[Request, str], Awaitable[Response]]

    def signed_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            offered = request.query_params.get(KEY_PARAMETER)
            if offered is not None and request.method == "GET":
                if not sessions.key_matches(offered):
                    return _refusal(console, 401, "this console's access key is not that one")
                # The key opens a session once; the address bar then drops it.
                response = RedirectResponse(request.url.path, status_code=303)
                response.set_cookie(
                    SESSION_COOKIE, sessions.open(), httponly=True, samesite="strict", path="/"
                )
                return response
            session = sessions.of(request)
            if session is None:
                return _refusal(console, 401, "open the URL that coordinatorctl console printed")
            if request.method == "POST":
                refusal = _forged(request, origin)
                if refusal is not None:
                    return _refusal(console, 403, refusal)
            return await handler(request, session)

        return endpoint

    async def go(request: Request, session: str) -> Response:
        run_id = request.query_params.get("run", "").strip()
        if not run_id or len(run_id) > 255 or any(ch in run_id for ch in "/?#%"):
            return console.problem_page(
                Problem.local(400, Code.REQUEST_INVALID, "that is not a run id"), session, "Run"
            )
        prefix = run_id.lower()
        if derive.is_run_id_prefix(prefix) and not derive.is_run_id(prefix):
            # The start of an id: the runs it may be.
            return RedirectResponse("/find?" + urlencode({"runIdPrefix": prefix}), 303)
        if derive.is_run_id(prefix):
            run_id = prefix
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}", status_code=303)

    routes = [
        Route("/", signed_in(console.attention)),
        Route("/go", signed_in(go)),
        Route("/find", signed_in(console.find)),
        Route("/doctor", signed_in(console.doctor)),
        Route("/bulk", signed_in(console.bulk), methods=["POST"]),
        Route("/bulk/result", signed_in(console.bulk_result)),
        Route("/runs/{run_id}", signed_in(console.run)),
        Route("/runs/{run_id}/{action}", signed_in(console.act), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    host = origin.split("://", 1)[1].rstrip("/")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await console.api.close()

    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=[host.split(":")[0]]),
        ],
        lifespan=lifespan,
    )
    return app


def _forged(request: Request, origin: str) -> str | None:
    """Why a post is refused as coming from elsewhere, or ``None`` (the CSRF token in its
    body is checked when the body is read)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return "the form was posted from another site"
    sent_origin = request.headers.get("origin")
    if sent_origin is not None and sent_origin.rstrip("/") != origin:
        return "the form was posted from another origin"
    return None


def _refusal(console: Console, status: int, detail: str) -> HTMLResponse:
    code = Code.AUTHENTICATION_REFUSED if status == 401 else Code.AUTHORIZATION_REFUSED
    return console.problem_page(Problem.local(status, code, detail), None, "Console")


class SecurityHeaders:
    """ASGI middleware: :data:`SECURITY_HEADERS` on every answer, pages, files and refusals."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


# ------------------------------------------------------------------------------- serving


def bind(address: str) -> socket.socket:
    """A listening socket on ``127.0.0.1:PORT`` (port 0: any free one); anything else is a
    usage error (ValueError)."""
    host, _, port_text = address.rpartition(":")
    if host != LOOPBACK or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError("--bind must be 127.0.0.1:PORT (the console serves loopback only)")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, int(port_text)))
    sock.listen(64)
    return sock


def serve(settings: Settings, sock: socket.socket, announce: Callable[[str], None]) -> None:
    """Serve on ``sock`` until interrupted; ``announce`` gets the URL to open."""
    port = sock.getsockname()[1]
    origin = f"http://{LOOPBACK}:{port}"
    app = create_app(settings, origin)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
        limit_concurrency=32,
        timeout_keep_alive=5,
        lifespan="on",
    )
    announce(f"{origin}/?{KEY_PARAMETER}={settings.access_key}")
    uvicorn.Server(config).run(sockets=[sock])
