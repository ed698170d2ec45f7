"""Recovery's reads against the real TLS PostgreSQL server: status, inspection, lists,
doctor and metrics, built from runs that admission started."""

# Test SQL names the test's own namespace, made by unique_namespace(), never input.

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from admission.start import Admitter
from core import derive
from core.errors import CoordinatorError
from core.runs import RUN_STATES, StartResult
from devstack.postgres import DatabaseHandle
from recovery import reads
from tests.helpers.serving import Caller, Served, served

pytestmark = pytest.mark.postgres

ALICE = Caller()
BOB = Caller(sub="bob")
WORKFLOW = "approval-notice"
OTHER = "slot-booking"
MARKER = "MARKER-5be1d0aa"
COMMAND_KEY = "c0ffee" * 10


@pytest.fixture
async def env(tmp_path: Path, database: DatabaseHandle) -> AsyncIterator[Served]:
    async with served(tmp_path, database, workflows=(WORKFLOW, OTHER)) as made:
        yield made


async def start(
    env: Served, key: str, *, caller: Caller = ALICE, workflow: str = WORKFLOW
) -> StartResult:
    admitter = Admitter.from_runtime(env.runtime, env.store("admission"))
    return await admitter.start(caller, workflow, key, {"subjectRef": MARKER})


async def listing(env: Served, **params: Any) -> dict[str, Any]:
    params.setdefault("workflows", (WORKFLOW, OTHER))
    return await reads.list_runs(env.store("recovery"), reads.ListFilter.build(**params))


async def refused(code: str, action: Any) -> CoordinatorError:
    with pytest.raises(CoordinatorError) as caught:
        await action
    assert caught.value.code == code, caught.value
    return caught.value


# ------------------------------------------------------------------------ status and owner


async def test_status_is_the_document_the_start_answered(env: Served) -> None:
    started = await start(env, "k-1")
    assert await reads.status(env.store("recovery"), started.run_id) == started.status

    await refused("run.not-found", reads.status(env.store("recovery"), "no-such-run"))
    await refused("run.not-found", reads.status(env.store("recovery"), "../../etc"))


async def test_status_follows_the_run_row(env: Served) -> None:
    started = await start(env, "k-1")
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'failed', failure_kind = 'invalid-command', "
        "failure_path = '/recipientRef', failure_step = 'call-notices', "
        "ended_at = {ns}.now() WHERE id = $1",
        started.run_id,
    )
    status = await reads.status(env.store("recovery"), started.run_id)
    assert status["state"] == "failed"
    assert status["failure"] == {
        "kind": "invalid-command",
        "failurePath": "/recipientRef",
        "step": "call-notices",
    }
    assert status["endedAt"].endswith("Z")


async def test_run_owner_names_workflow_and_principal(env: Served) -> None:
    started = await start(env, "k-1", caller=BOB)
    owner = await reads.run_owner(env.store("recovery"), started.run_id)
    assert owner == reads.Owner(WORKFLOW, BOB.iss, BOB.sub)
    assert await reads.run_owner(env.store("recovery"), "missing") is None


# ------------------------------------------------------------------------------ inspection


async def test_inspection_shows_steps_waits_holds_and_latest_actions(env: Served) -> None:
    started = await start(env, "k-1")
    run_id = started.run_id
    await env.owner_execute(
        "UPDATE {ns}.step SET state = 'completed', effect = 'accepted', attempts = 1, "
        "command_key = $2, due_at = NULL, ended_at = {ns}.now() WHERE run_id = $1",
        run_id,
        COMMAND_KEY,
    )
    await env.owner_execute(
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at) "
        "VALUES ($1, 'pause', 2, 'wait-until', 'waiting', '2030-01-01T00:00:00Z')",
        run_id,
    )
    await env.owner_execute(
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at, next_check_at, "
        "timeout_at, checks) VALUES ($1, 'await-decision', 3, 'wait-for', 'waiting', "
        "'2030-01-02T00:00:00Z', '2030-01-02T00:00:00Z', '2030-02-01T00:00:00.5Z', 3)",
        run_id,
    )
    await env.owner_execute("UPDATE {ns}.run SET state = 'waiting' WHERE id = $1", run_id)
    await env.owner_execute("UPDATE {ns}.hold SET execution_hold = true")
    for number in range(1, 13):
        await env.owner_execute(
            "INSERT INTO {ns}.operator_action (run_id, kind, reason) VALUES ($1, 'reconcile', $2)",
            run_id,
            f"INC-{number}",
        )

    doc = await reads.inspection(env.store("recovery"), run_id)

    assert doc["runId"] == run_id and doc["state"] == "waiting"
    assert [(s["step"], s["type"], s["state"]) for s in doc["steps"]] == [
        ("call-notices", "call", "completed"),
        ("pause", "wait-until", "waiting"),
        ("await-decision", "wait-for", "waiting"),
    ]
    call, pause, decision = doc["steps"]
    assert call["effect"] == "accepted" and call["attempts"] == 1 and "endedAt" in call
    assert "wait" not in call
    assert pause["wait"] == {"dueAt": "2030-01-01T00:00:00.000Z", "checks": 0}
    assert decision["wait"] == {
        "nextCheckAt": "2030-01-02T00:00:00.000Z",
        "timeoutAt": "2030-02-01T00:00:00.500Z",
        "checks": 3,
    }
    assert doc["holds"] == {"execution": True, "admission": False}
    assert [a["reason"] for a in doc["lastOperatorActions"]] == [
        f"INC-{n}" for n in range(12, 2, -1)
    ]
    assert all(set(a) == {"kind", "reason", "at"} for a in doc["lastOperatorActions"])
    text = json.dumps(doc)
    assert MARKER not in text and COMMAND_KEY not in text

    await refused("run.not-found", reads.inspection(env.store("recovery"), "missing"))


# ----------------------------------------------------------------------------------- lists


async def _pages(env: Served, limit: int, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = ""
    while True:
        page = await listing(env, limit=limit, cursor=cursor, **params)
        pages.append([run["runId"] for run in page["runs"]])
        if page["nextCursor"] is None:
            return pages
        cursor = page["nextCursor"]
        assert len(pages) < 20, "the cursor does not advance"


async def test_lists_are_newest_first_and_page_by_cursor(env: Served) -> None:
    ids = [(await start(env, f"k-{n}")).run_id for n in range(5)]

    first = await listing(env)
    assert [run["runId"] for run in first["runs"]] == ids[::-1]
    assert first["nextCursor"] is None
    assert first["runs"][0] == await reads.status(env.store("recovery"), ids[-1])

    assert await _pages(env, 2) == [ids[4:2:-1], ids[2:0:-1], ids[:1]]


async def test_paging_survives_identical_creation_times(env: Served) -> None:
    ids = [(await start(env, f"k-{n}")).run_id for n in range(5)]
    await env.owner_execute("UPDATE {ns}.run SET created_at = '2026-01-01T00:00:00Z'")

    pages = await _pages(env, 2)
    flat = [run_id for page in pages for run_id in page]
    assert flat == sorted(ids, reverse=True)
    assert [len(page) for page in pages] == [2, 2, 1]


async def test_lists_filter_by_attention_state_workflow_and_principal(env: Served) -> None:
    mine = await start(env, "k-1")
    held = await start(env, "k-2")
    other_flow = await start(env, "k-3", workflow=OTHER)
    bobs = await start(env, "k-4", caller=BOB)
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'held', attention = true WHERE id = $1", held.run_id
    )

    def ids(page: dict[str, Any]) -> list[str]:
        return [run["runId"] for run in page["runs"]]

    assert ids(await listing(env, attention="true")) == [held.run_id]
    assert set(ids(await listing(env, attention="false"))) == {
        mine.run_id,
        other_flow.run_id,
        bobs.run_id,
    }
    assert ids(await listing(env, state="held")) == [held.run_id]
    assert ids(await listing(env, state="succeeded")) == []
    assert ids(await listing(env, workflow_id=OTHER)) == [other_flow.run_id]
    assert set(ids(await listing(env, workflows=(WORKFLOW,)))) == {
        mine.run_id,
        held.run_id,
        bobs.run_id,
    }
    # A workflow outside the caller's scope, or no scope at all, shows nothing.
    assert ids(await listing(env, workflows=(WORKFLOW,), workflow_id=OTHER)) == []
    assert ids(await listing(env, workflows=())) == []
    # A non-operator sees only its own principal's runs.
    assert ids(await listing(env, principal=(BOB.iss, BOB.sub))) == [bobs.run_id]
    alices = await listing(env, principal=(ALICE.iss, ALICE.sub))
    assert bobs.run_id not in ids(alices) and len(ids(alices)) == 3


async def _needs_attention(env: Served, run_id: str, cause: str, at: str) -> None:
    """The run's call step becomes uncertain for ``cause`` at ``at`` (its run held)."""
    await env.owner_execute(
        "UPDATE {ns}.step SET state = 'uncertain', effect = 'unknown', cause = $2, due_at = NULL,"
        " cause_status = CASE WHEN $2 = 'status-5xx' THEN 503 END WHERE run_id = $1",
        run_id,
        cause,
    )
    # attention_since is the trigger's: it reads the namespace's clock.
    await env.owner_execute(
        "UPDATE {ns}.run r SET state = 'held', attention = true"
        " FROM (SELECT set_config('coordinator.fake_now', $2, true)) AS clock WHERE r.id = $1",
        run_id,
        at,
    )


def _ids(page: dict[str, Any]) -> list[str]:
    return [run["runId"] for run in page["runs"]]


async def test_the_attention_list_oldest_first_is_by_when_attention_began(env: Served) -> None:
    runs = [(await start(env, f"k-{n}")).run_id for n in range(4)]
    # Created 0, 1, 2, 3; attention began for 3 first, then 0, then 2; 1 never needed it.
    await _needs_attention(env, runs[3], "status-5xx", "2030-01-01T08:00:00Z")
    await _needs_attention(env, runs[0], "lease-expired", "2030-01-01T09:00:00Z")
    await _needs_attention(env, runs[2], "status-5xx", "2030-01-01T10:00:00Z")

    oldest = await listing(env, attention="true", order="oldest")
    assert _ids(oldest) == [runs[3], runs[0], runs[2]]
    assert (oldest["total"], oldest["totalIsEstimate"]) == (3, False)
    assert oldest["runs"][0]["attentionStep"] == {
        "step": "call-notices",
        "cause": "status-5xx",
        "causeStatus": 503,
        "since": "2030-01-01T08:00:00.000Z",
    }
    assert oldest["runs"][1]["attentionStep"] == {
        "step": "call-notices",
        "cause": "lease-expired",
        "since": "2030-01-01T09:00:00.000Z",
    }
    newest = await listing(env, attention="true")
    assert _ids(newest) == [runs[3], runs[2], runs[0]]
    # Without the attention filter, oldest first is by creation; a run without attention
    # has no attentionStep.
    everything = await listing(env, order="oldest")
    assert _ids(everything) == runs
    assert "attentionStep" not in everything["runs"][1]
    assert everything["total"] == 4

    # Pages both ways, each cursor in its own order only.
    assert await _pages(env, 2, attention="true", order="oldest") == [
        [runs[3], runs[0]],
        [runs[2]],
    ]
    assert await _pages(env, 3, order="oldest") == [runs[:3], runs[3:]]
    first = await listing(env, limit=1, attention="true", order="oldest")
    await refused("request.invalid", listing(env, attention="true", cursor=first["nextCursor"]))


async def test_attention_since_begins_once_and_ends_with_attention(env: Served) -> None:
    run_id = (await start(env, "k-1")).run_id
    await _needs_attention(env, run_id, "status-5xx", "2030-01-01T08:00:00Z")
    # Attention recomputed while it lasts keeps its beginning.
    await env.owner_execute(
        "UPDATE {ns}.run r SET attention = true FROM (SELECT set_config("
        "'coordinator.fake_now', '2030-01-02T08:00:00Z', true)) AS clock WHERE r.id = $1",
        run_id,
    )
    since = "SELECT attention_since FROM {ns}.run WHERE id = $1"
    (row,) = await env.owner_fetch(since, run_id)
    assert row["attention_since"].isoformat() == "2030-01-01T08:00:00+00:00"
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'running', attention = false WHERE id = $1", run_id
    )
    (row,) = await env.owner_fetch(since, run_id)
    assert row["attention_since"] is None
    # No statement may set it against attention.
    with pytest.raises(
        Exception, match="breaks the rule: attention_since is set exactly with attention"
    ):
        await env.owner_execute("UPDATE {ns}.run SET attention_since = now() WHERE id = $1", run_id)


async def test_lists_filter_by_step_cause_and_updated_before(env: Served) -> None:
    runs = [(await start(env, f"k-{n}")).run_id for n in range(3)]
    await _needs_attention(env, runs[0], "status-5xx", "2030-01-01T08:00:00Z")
    await _needs_attention(env, runs[1], "lease-expired", "2030-01-01T09:00:00Z")
    await env.owner_execute(
        "UPDATE {ns}.run SET updated_at = '2030-01-01T08:00:00Z' WHERE id = $1", runs[0]
    )
    await env.owner_execute(
        "UPDATE {ns}.run SET updated_at = '2030-01-01T09:00:00Z' WHERE id IN ($1, $2)",
        runs[1],
        runs[2],
    )

    assert set(_ids(await listing(env, step="call-notices"))) == {runs[0], runs[1]}
    assert _ids(await listing(env, step="elsewhere")) == []
    by_cause = await listing(env, cause="lease-expired")
    assert (_ids(by_cause), by_cause["total"]) == ([runs[1]], 1)
    assert _ids(await listing(env, cause="status-5xx", step="call-notices")) == [runs[0]]
    # A step or cause is about the step that needs attention: attention=false has none.
    assert _ids(await listing(env, cause="status-5xx", attention="false")) == []
    before = await listing(env, updated_before="2030-01-01T08:30:00Z")
    assert (_ids(before), before["total"]) == ([runs[0]], 1)
    later = await listing(env, updated_before="2030-01-01T09:00:00.001Z", attention="true")
    assert set(_ids(later)) == {runs[0], runs[1]}


async def test_a_total_past_the_exact_count_is_the_statistics_estimate(
    env: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [(await start(env, f"k-{n}")).run_id for n in range(5)]
    for n, run_id in enumerate(runs[:4]):
        await _needs_attention(env, run_id, "status-5xx", f"2030-01-01T0{n}:00:00Z")
    await env.owner_execute("ANALYZE {ns}.run")
    monkeypatch.setattr(reads, "COUNTED_EXACTLY", 2)

    attention = await listing(env, attention="true", limit=1)
    assert (attention["total"], attention["totalIsEstimate"]) == (4, True)
    everything = await listing(env, limit=1)
    assert (everything["total"], everything["totalIsEstimate"]) == (5, True)
    held = await listing(env, state="held", limit=1)
    assert (held["total"], held["totalIsEstimate"]) == (4, True)
    monkeypatch.setattr(reads, "COUNTED_EXACTLY", 10_000)
    assert (await listing(env, limit=1))["totalIsEstimate"] is False


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 101},
        {"limit": -1},
        {"attention": "yes"},
        {"state": "done"},
        {"cursor": "not-a-cursor"},
        {"order": "random"},
        {"step": "Not A Step"},
        {"cause": "bad-luck"},
        {"updated_before": "yesterday"},
        {"updated_before": "2030-01-01T08:00:00"},
    ],
)
async def test_lists_refuse_bad_parameters(env: Served, params: dict[str, Any]) -> None:
    await refused("request.invalid", listing(env, **params))


async def test_a_search_by_run_id_prefix_finds_exactly_the_runs_that_share_it(
    env: Served,
) -> None:
    started = [await start(env, f"k-{n}") for n in range(40)]
    bobs = await start(env, "k-bob", caller=BOB)
    ids = sorted([run.run_id for run in started] + [bobs.run_id])
    # Forty ids share few four-digit prefixes: search with one that a few of them share
    # when there is one, and check the answer against the ids themselves.
    shared = max({i[:2] for i in ids}, key=lambda p: sum(i.startswith(p) for i in ids))
    one = bobs.run_id
    for prefix in (shared + "00", shared + "ff", one[:4], one[:8], one[:9], one[:10], one):
        if len(prefix) < 4:
            continue
        found = await listing(env, run_id_prefix=prefix, limit=100)
        expected = [i for i in ids if i.startswith(prefix)]
        assert _ids(found) == expected, prefix
        assert (found["total"], found["totalIsEstimate"], found["nextCursor"]) == (
            len(expected),
            False,
            None,
        )
    # The page is cut at the limit; the total still counts every match.
    two_digit = [i for i in ids if i.startswith(shared)]
    for prefix in {i[:4] for i in two_digit}:
        found = await listing(env, run_id_prefix=prefix, limit=1)
        assert _ids(found) == [i for i in ids if i.startswith(prefix)][:1]
        assert found["total"] == sum(i.startswith(prefix) for i in ids)
    # The caller's scope still applies: a principal's own runs, the policy's workflows.
    assert _ids(await listing(env, run_id_prefix=one[:8], principal=(ALICE.iss, ALICE.sub))) == [
        i for i in ids if i.startswith(one[:8]) and i != one
    ]
    assert _ids(await listing(env, run_id_prefix=one, workflows=(OTHER,))) == []
    # Bad prefixes, and a prefix with a filter it does not take, are refused by name.
    # (An uppercase letter is put in by hand: the id's own first characters may all be digits.)
    for prefix in ("abc", one[:7] + "A", one[:8] + "x", "abcd-", one + "0"):
        caught = await refused("request.invalid", listing(env, run_id_prefix=prefix))
        assert caught.detail.startswith("runIdPrefix:"), caught
    caught = await refused("request.invalid", listing(env, run_id_prefix=one, state="held"))
    assert caught.detail.startswith("state:"), caught
    caught = await refused("request.invalid", listing(env, run_id_prefix=one, order="oldest"))
    assert caught.detail.startswith("order:"), caught


@pytest.mark.parametrize("collation", ["C", "und-x-icu", "en-US-x-icu", "fr-FR-x-icu"])
async def test_a_prefix_range_keeps_its_runs_in_a_language_collation(
    env: Served, collation: str
) -> None:
    # A database created with a language locale compares run ids in that collation; the
    # range must still hold exactly the ids that start with the prefix.
    key = bytes(32)
    ids = sorted(
        derive.run_id(key, derive.event_start_identity(key, "s", str(n))) for n in range(600)
    )
    for which in range(0, 600, 75):
        for length in (4, 8, 9, 10, 13, 14, 19, 24, 36):
            prefix = ids[which][:length]
            low, below = derive.run_id_range(prefix)
            rows = await env.owner_fetch(
                f'SELECT id FROM unnest($1::text[]) AS id WHERE id >= $2 COLLATE "{collation}"'
                f' AND id < $3 COLLATE "{collation}" ORDER BY id COLLATE "C"',
                ids,
                low,
                below,
            )
            assert [r["id"] for r in rows] == sorted(i for i in ids if i.startswith(prefix)), prefix


async def test_the_default_page_is_twenty(env: Served) -> None:
    for n in range(21):
        await start(env, f"k-{n}")
    page = await listing(env)
    assert len(page["runs"]) == 20 and page["nextCursor"] is not None
    rest = await listing(env, cursor=page["nextCursor"], limit=100)
    assert len(rest["runs"]) == 1 and rest["nextCursor"] is None


# ------------------------------------------------------------------------ doctor, metrics


async def _shape_runs(env: Served) -> None:
    """Four runs: one held on an uncertain call, one waiting on a timer, one whose due step
    a dispatcher leased, one due and unclaimed."""
    held, waiting, leased, _due = [(await start(env, f"k-{n}")).run_id for n in range(4)]
    await env.owner_execute(
        "UPDATE {ns}.step SET state = 'uncertain', effect = 'unknown', due_at = NULL "
        "WHERE run_id = $1",
        held,
    )
    await env.owner_execute(
        "UPDATE {ns}.run SET state = 'held', attention = true WHERE id = $1", held
    )
    await env.owner_execute(
        "UPDATE {ns}.step SET state = 'completed', effect = 'accepted', due_at = NULL, "
        "ended_at = {ns}.now() WHERE run_id = $1",
        waiting,
    )
    await env.owner_execute(
        "INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at) "
        "VALUES ($1, 'pause', 2, 'wait-until', 'waiting', {ns}.now() + interval '1 hour')",
        waiting,
    )
    await env.owner_execute("UPDATE {ns}.run SET state = 'waiting' WHERE id = $1", waiting)
    await env.owner_execute(
        "UPDATE {ns}.step SET lease_owner = 'dispatcher-1', "
        "lease_expires_at = {ns}.now() + interval '30 seconds', lease_epoch = 0 "
        "WHERE run_id = $1",
        leased,
    )


async def test_doctor_counts_the_store(env: Served) -> None:
    await _shape_runs(env)
    await env.owner_execute("UPDATE {ns}.hold SET admission_hold = true")

    doc = await reads.doctor(env.store("recovery"), audit_ready=True, recovery_only=False)

    checked = env.deployment.checked()
    assert doc == {
        "activationReady": True,
        "schemaVersion": 4,
        "databaseId": checked.config.deployment.database_id,
        "workflows": [
            {"id": wid, "digest": checked.packages[wid].digest} for wid in sorted((WORKFLOW, OTHER))
        ],
        "holds": {"execution": False, "admission": True},
        "state": {
            "auditReady": True,
            "storeReady": True,
            "storeHost": f"{env.database.host}:{env.database.port}",
            "uncertain": 1,
            "held": 1,
            "retrying": 0,
            "dueJobs": 1,
            "waiting": 1,
            "stateKeyVersionsInUse": [1],
        },
        "tokenRefusals": [],
        "mode": "ordinary",
    }


async def test_doctor_reports_audit_activation_and_mode(
    tmp_path: Path, database: DatabaseHandle
) -> None:
    async with served(tmp_path, database, components=("recovery",), recovery_only=True) as env:
        await env.owner_execute(
            "UPDATE {ns}.deployment SET activation_serial = activation_serial + 1"
        )
        doc = await reads.doctor(env.store("recovery"), audit_ready=False, recovery_only=True)
    assert doc["activationReady"] is False
    assert doc["state"]["auditReady"] is False
    assert doc["state"]["stateKeyVersionsInUse"] == []
    assert doc["mode"] == "recovery-only"


def _samples(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


async def test_metrics_expose_store_gauges_without_identifying_labels(env: Served) -> None:
    await _shape_runs(env)
    await env.owner_execute("UPDATE {ns}.hold SET execution_hold = true")
    # A fifth run whose call met a 503 and waits for its next automatic attempt.
    retrying = (await start(env, "k-retrying")).run_id
    await env.owner_execute(
        "UPDATE {ns}.step SET retry_cause = 'status-503', retry_status = 503, "
        "retry_last_at = {ns}.now(), retry_since = {ns}.now() WHERE run_id = $1",
        retrying,
    )

    text = await reads.metrics_text(env.store("recovery"))
    samples = _samples(text)

    expected_runs = {"running": 3, "waiting": 1, "held": 1}
    for state in RUN_STATES:
        assert samples[f'coordinator_runs{{state="{state}"}}'] == expected_runs.get(state, 0)
    assert samples["coordinator_uncertain_steps"] == 1
    assert samples["coordinator_retrying_steps"] == 1
    assert samples["coordinator_dispatch_jobs"] == 2
    assert samples['coordinator_holds{hold="execution"}'] == 1
    assert samples['coordinator_holds{hold="admission"}'] == 0
    assert samples["coordinator_store_available"] == 1
    for forbidden in ("workflow", "run_id", "principal", WORKFLOW):
        assert forbidden not in text
    assert "# TYPE coordinator_dispatch_jobs gauge" in text


async def test_dispatch_jobs_is_present_at_zero(env: Served) -> None:
    samples = _samples(await reads.metrics_text(env.store("recovery")))
    assert samples["coordinator_dispatch_jobs"] == 0
    assert samples['coordinator_runs{state="running"}'] == 0
