"""The run list at scale (issue 41 item 1): one page of ``GET /v1/runs`` per filter, through
the API, among the scale phase's waiting runs and a backlog of runs held for an operator.

It runs after the scale phase's largest size has been measured, so the namespace holds that
many waiting runs (1,000,000 at the defaults). First ``--held-runs`` (10,000) runs held with
attention are seeded with SQL (:meth:`bench.scale.Scale.seed_held`): each has the bindings
of a bench run and one uncertain call (cause ``status-5xx`` with 503, every fifth
``lease-expired``; for every fourth run the second call, after a first call and a choice
that ended). They are older than every waiting run, as an incident's backlog under the runs
started since: a list that read the newest-first index and filtered would pass every waiting
run before the first held one. Their attention began at 100 instants a minute apart, in an
order other than their creation's, so ``order=oldest`` and ``updatedBefore`` have work to do.

Then, for each filter of :func:`list_cases` and each limit of :data:`LIST_LIMITS`, with the
operator token on one connection: one call whose answer is checked against the same filter
written as plain SQL over the run table (the page's run ids in order, ``total`` and
``totalIsEstimate``, ``nextCursor``, each entry's ``attentionStep``), then
:data:`LIST_CALLS` timed calls. A wrong answer is recorded as a failure, with no figure. The
second page of a filter follows the first page's ``nextCursor``.

All of it twice: first with the statistics of the quiet VACUUM (the state every figure of the
scale phase is taken in: the planner believes no run is live), then after ``ANALYZE`` of
``run`` and ``step``, the two tables the list reads (what autovacuum would leave once it
looked again).
"""

from __future__ import annotations

import html
import json
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.scale import FIRST_CALL, HELD_SHAPE, HeldRuns, Scale
from core.clock import format_instant
from recovery.reads import COUNTED_EXACTLY

LIST_CALLS = 20
"""Timed calls of each filter and limit, after the checked one."""
LIST_LIMITS = (20, 100)
ANALYSED_TABLES = ("run", "step")
QUIET = "quiet-VACUUM"
ANALYSED = "analysed"
CAUSE = "status-5xx"

NEWEST = "r.created_at DESC, r.id DESC"
OLDEST_ATTENTION = "r.attention_since, r.id"

REFERENCE_PAGE = "SELECT r.id FROM {ns}.run r WHERE {where} ORDER BY {order} LIMIT {limit}"
REFERENCE_COUNT = "SELECT count(*) FROM {ns}.run r WHERE {where}"

# A run with a step that needs attention whose column (step_id or cause) is $1.
STEP_WANTS = """EXISTS (SELECT 1 FROM {ns}.step s
                 WHERE s.run_id = r.id AND {ns}.step_wants_attention(s.state, s.cause)
                   AND s.{column} = $1)"""


@dataclass(frozen=True)
class ListCase:
    """One filter of the list: its query parameters, and the same filter as plain SQL over
    ``{ns}.run r``, the reference its answers are checked against."""

    label: str
    params: Mapping[str, str]
    where: str
    """The filter as a condition on ``r``; ``$1`` is ``arguments[0]`` when there is one."""
    order: str
    arguments: tuple[Any, ...] = ()
    page: int = 1
    """2: the page after the first, reached with the first page's ``nextCursor``."""
    step: str | None = None
    """The ``attentionStep.step`` every entry must show."""
    cause: str | None = None
    """The ``attentionStep.cause`` every entry must show."""


def list_cases(workflow: str, held: HeldRuns) -> list[ListCase]:
    """The filters measured, in the order the report shows them."""
    split = format_instant(held.split)
    oldest = {"attention": "true", "order": "oldest"}
    return [
        ListCase("attention=true", {"attention": "true"}, "r.attention", NEWEST),
        ListCase("attention=true, order=oldest", oldest, "r.attention", OLDEST_ATTENTION),
        ListCase(
            "attention=true, order=oldest, page 2",
            oldest,
            "r.attention",
            OLDEST_ATTENTION,
            page=2,
        ),
        ListCase("state=held", {"state": "held"}, "r.state = 'held'", NEWEST),
        ListCase(
            f"workflow={workflow}, attention=true",
            {"workflow": workflow, "attention": "true"},
            "r.attention AND r.workflow_id = $1",
            NEWEST,
            (workflow,),
        ),
        ListCase(
            f"step={FIRST_CALL}",
            {"step": FIRST_CALL},
            "r.attention AND " + STEP_WANTS.replace("{column}", "step_id"),
            NEWEST,
            (FIRST_CALL,),
            step=FIRST_CALL,
        ),
        ListCase(
            f"cause={CAUSE}, order=oldest",
            {"cause": CAUSE, "order": "oldest"},
            "r.attention AND " + STEP_WANTS.replace("{column}", "cause"),
            OLDEST_ATTENTION,
            (CAUSE,),
            cause=CAUSE,
        ),
        ListCase(
            "attention=true, updatedBefore=<half>",
            {"attention": "true", "updatedBefore": split},
            "r.attention AND r.updated_at < $1",
            NEWEST,
            (held.split,),
        ),
        ListCase("no filter (every run)", {}, "true", NEWEST),
    ]


# ------------------------------------------------------------------------------ pure parts


def check_answer(
    case: ListCase,
    limit: int,
    document: Mapping[str, Any],
    expected_ids: Sequence[str],
    expected_total: int,
) -> str | None:
    """What is wrong with one answer of ``case`` at ``limit``, as a sentence; None when it
    is right: the page's run ids in order, ``nextCursor`` exactly when more runs follow,
    ``total`` exact up to :data:`COUNTED_EXACTLY` and an estimate past it, and each entry
    that needs attention with its ``attentionStep`` (the filter's step or cause)."""
    ids = [str(run.get("runId")) for run in document.get("runs", [])]
    if ids != list(expected_ids):
        differ = next(
            (
                i
                for i, pair in enumerate(zip(ids, expected_ids, strict=False))
                if len(set(pair)) > 1
            ),
            min(len(ids), len(expected_ids)),
        )
        return (
            f"the page held {len(ids)} runs where {len(expected_ids)} were expected, "
            f"differing from position {differ + 1}"
        )
    more = expected_total > case.page * limit
    if (document.get("nextCursor") is not None) != more:
        return f"nextCursor {'missing' if more else 'given'} with {expected_total} runs in all"
    total, estimate = document.get("total"), document.get("totalIsEstimate")
    if expected_total <= COUNTED_EXACTLY:
        if total != expected_total or estimate is not False:
            return f"total {total} (estimate: {estimate}) where {expected_total} exactly"
    elif estimate is not True or not isinstance(total, int) or total <= COUNTED_EXACTLY:
        return f"total {total} (estimate: {estimate}) for {expected_total} runs, over the count"
    for run in document.get("runs", []):
        step = run.get("attentionStep")
        if not run.get("attention"):
            if step is not None:
                return f"run {run.get('runId')} needs no attention and shows an attentionStep"
            continue
        if not isinstance(step, dict) or "step" not in step or "since" not in step:
            return f"run {run.get('runId')} needs attention and shows no attentionStep"
        if case.step is not None and step["step"] != case.step:
            return f"run {run.get('runId')}: attentionStep.step {step['step']!r}"
        if case.cause is not None and step.get("cause") != case.cause:
            return f"run {run.get('runId')}: attentionStep.cause {step.get('cause')!r}"
    return None


# ------------------------------------------------------------------------------ measuring


@dataclass(frozen=True)
class Reference:
    """What the run table itself says of a case: its first runs in order, and how many."""

    ids: list[str]
    total: int

    def page(self, case: ListCase, limit: int) -> list[str]:
        return self.ids[(case.page - 1) * limit : case.page * limit]


class ListBench:
    """The list's calls through the API, and the reference read from the database."""

    def __init__(self, scale: Scale, url: str, token: str) -> None:
        self.scale = scale
        self.url = url + "/v1/runs"
        self.token = token

    def sql(self, text: str, case: ListCase) -> str:
        """``text`` with the case's condition and order (this module's own text) and the
        namespace (see :meth:`bench.scale.Scale.sql`) put in."""
        return self.scale.sql(
            text.replace("{where}", case.where)
            .replace("{order}", case.order)
            .replace("{limit}", f"${len(case.arguments) + 1}")
        )

    async def reference(self, case: ListCase) -> Reference:
        """The first runs of ``case`` (enough for its page at the largest limit) and their
        count, read from the run table."""
        db = self.scale.db
        rows = await db.fetch(
            self.sql(REFERENCE_PAGE, case), *case.arguments, case.page * max(LIST_LIMITS)
        )
        total = await db.fetchval(self.sql(REFERENCE_COUNT, case), *case.arguments)
        return Reference([str(row["id"]) for row in rows], int(total))

    async def call(
        self, client: aiohttp.ClientSession, params: Mapping[str, str]
    ) -> tuple[int, bytes, float]:
        """One ``GET /v1/runs``: status, body, and ms until the whole body was read."""
        began = time.perf_counter()
        async with client.get(
            self.url, params=dict(params), headers={"Authorization": f"Bearer {self.token}"}
        ) as answer:
            body = await answer.read()
        return answer.status, body, (time.perf_counter() - began) * 1000

    async def measure(
        self, client: aiohttp.ClientSession, case: ListCase, limit: int, reference: Reference
    ) -> dict[str, Any]:
        """One case at one limit: the checked call, then :data:`LIST_CALLS` timed ones."""
        entry: dict[str, Any] = {
            "filter": case.label,
            "params": dict(case.params),
            "limit": limit,
            "page": case.page,
            "expected_total": reference.total,
            "calls": 0,
            "ms": None,
            "total": None,
            "total_is_estimate": None,
            "failure": None,
        }
        params = {**case.params, "limit": str(limit)}
        if case.page > 1:
            status, body, _ = await self.call(client, params)
            cursor = json.loads(body).get("nextCursor") if status == 200 else None
            if not cursor:
                entry["failure"] = f"the first page answered {status} without a nextCursor"
                return entry
            params["cursor"] = str(cursor)
        status, body, _ = await self.call(client, params)
        if status != 200:
            entry["failure"] = f"answered {status}: {body[:200].decode(errors='replace')}"
            return entry
        document = json.loads(body)
        entry["total"] = document.get("total")
        entry["total_is_estimate"] = document.get("totalIsEstimate")
        entry["runs"] = len(document.get("runs", []))
        entry["failure"] = check_answer(
            case, limit, document, reference.page(case, limit), reference.total
        )
        if entry["failure"] is not None:
            return entry
        spent: list[float] = []
        for _ in range(LIST_CALLS):
            status, again, ms = await self.call(client, params)
            if status != 200 or again != body:
                entry["failure"] = f"a timed call answered {status}, not what the first did"
                return entry
            spent.append(ms)
        entry["calls"] = len(spent)
        entry["ms"] = {
            "median": statistics.median(spent),
            "max": max(spent),
            "min": min(spent),
        }
        return entry

    async def round(self, cases: Sequence[ListCase], label: str) -> dict[str, Any]:
        """Every case at every limit, on one connection."""
        began = time.monotonic()
        print(
            f"bench: list at scale ({label} statistics): {len(cases)} filters, limits "
            f"{', '.join(str(n) for n in LIST_LIMITS)}, 1 checked + {LIST_CALLS} timed calls each",
            flush=True,
        )
        entries: list[dict[str, Any]] = []
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1),
            timeout=aiohttp.ClientTimeout(total=60.0),
            trust_env=False,
        ) as client:
            for case in cases:
                reference = await self.reference(case)
                for limit in LIST_LIMITS:
                    entry = await self.measure(client, case, limit, reference)
                    if entry["failure"] is not None:
                        sys.stderr.write(
                            f"bench: list at scale ({label}): {case.label}, limit {limit}: "
                            f"{entry['failure']}\n"
                        )
                    entries.append(entry)
        return {
            "statistics": label,
            "filters": entries,
            "seconds": round(time.monotonic() - began, 2),
        }


CONSOLE_CALLS = 10
"""Timed loads of each console page, after the checked one."""
CONSOLE_ORIGIN = "http://127.0.0.1:8765"


async def console_pages(url: str, token: str) -> dict[str, Any]:
    """The console's attention page (``coordinatorctl console``, 50 runs a page, the
    longest waiting first) served in process over the real API: the first page and the one
    its "Next page" link leads to, each checked once (its caption's total and 50 rows), then
    :data:`CONSOLE_CALLS` timed loads. The time is the console's whole answer (its API call,
    the page rendered), what an operator waits for before the browser draws it."""
    import tempfile
    from pathlib import Path

    import httpx

    from cli import console

    entry: dict[str, Any] = {"calls": 0, "pages": [], "failure": None}
    with tempfile.TemporaryDirectory() as folder:
        token_file = Path(folder) / "operator.token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        settings = console.Settings(api_url=url, token_file=token_file)
        api = console.Api(settings)
        app = console.create_app(settings, CONSOLE_ORIGIN, api)
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=CONSOLE_ORIGIN
            ) as client:
                opened = await client.get(f"/?key={settings.access_key}")
                if opened.status_code != 303:
                    entry["failure"] = f"the console answered {opened.status_code} to its key"
                    return entry
                path = "/"
                for label in ("first page", "next page"):
                    page = await client.get(path)
                    rows = page.text.count('<th scope="row"><a href="/runs/')
                    found = re.search(r'<a href="([^"]+)" rel="next">', page.text)
                    if page.status_code != 200 or rows != console.ATTENTION_PAGE or not found:
                        entry["failure"] = f"{label}: answered {page.status_code} with {rows} runs"
                        return entry
                    spent = []
                    for _ in range(CONSOLE_CALLS):
                        began = time.perf_counter()
                        again = await client.get(path)
                        spent.append((time.perf_counter() - began) * 1000)
                        if again.status_code != 200:
                            entry["failure"] = f"{label}: a timed load answered {again.status_code}"
                            return entry
                    entry["pages"].append(
                        {
                            "page": label,
                            "rows": rows,
                            "ms": {"median": statistics.median(spent), "max": max(spent)},
                        }
                    )
                    path = html.unescape(found.group(1))
                entry["calls"] = CONSOLE_CALLS
        finally:
            await api.close()
    return entry


async def list_at_scale(
    scale: Scale, url: str, token: str, workflow: str, held_runs: int
) -> dict[str, Any]:
    """Seed ``held_runs`` held runs among the runs ``scale`` seeded, then the list's rounds
    (see the module's docstring); the ``scale.list_at_scale`` section of ``results.json``."""
    began = time.monotonic()
    print(f"bench: list at scale: seeding {held_runs:,} held runs", flush=True)
    held = await scale.seed_held(held_runs)
    print(f"bench: list at scale: seeded in {held.seconds:.1f} s", flush=True)
    cases = list_cases(workflow, held)
    lists = ListBench(scale, url, token)
    untouched = await scale.analysed() == scale.analysed_at_vacuum
    quiet = await lists.round(cases, QUIET)
    quiet["statistics_untouched"] = untouched
    analyse_seconds = await scale.analyse(ANALYSED_TABLES)
    analysed = await lists.round(cases, ANALYSED)
    analysed["analysed_tables"] = list(ANALYSED_TABLES)
    analysed["analyse_seconds"] = round(analyse_seconds, 2)
    print("bench: list at scale: the console's attention page", flush=True)
    console = await console_pages(url, token)
    if console["failure"] is not None:
        sys.stderr.write(f"bench: the console's attention page: {console['failure']}\n")
    return {
        "waiting_runs": scale.seeded,
        "held": held.to_json(),
        "shape": HELD_SHAPE,
        "calls": LIST_CALLS,
        "limits": list(LIST_LIMITS),
        "rounds": [quiet, analysed],
        "console": console,
        "seconds": round(time.monotonic() - began, 1),
    }
