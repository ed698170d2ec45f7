"""coordinatorctl's commands that call the coordinator's API: doctor, list, status,
inspect, start, the run actions and their bulk form, retain, the operator's holds and the
console.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from cli import api, render
from cli.app import Globals, api_client, app, globals_of, usage_error
from cli.options import (
    AttentionOpt,
    CauseOpt,
    ListOrder,
    OutputFormat,
    OutputOpt,
    ReasonOpt,
    RefOpt,
    RunOpt,
    StateOpt,
    StepOpt,
    TokenOpt,
    TrueFalse,
    UpdatedBeforeOpt,
    UrlOpt,
    WorkflowFilterOpt,
    run_filter,
)
from core.actions import ACTIONS, RUN, Action, operator_actions
from core.codes import Code
from core.errors import CoordinatorError
from core.runs import DEFAULT_BULK_LIMIT, IDEMPOTENCY_KEY, MAX_BULK_LIMIT

# ------------------------------------------------------------------------------ API commands


def _api_opts(
    ctx: typer.Context, url: str | None, token_file: Path | None, output: OutputFormat | None
) -> tuple[api.ApiClient, Globals]:
    g = globals_of(ctx, url=url, token_file=token_file, output=output)
    return api_client(g), g


_RUN_COLUMNS = ("runId", "workflow", "state", "outcome", "attention", "createdAt")
_ATTENTION_COLUMNS = ("runId", "workflow", "state", "step", "cause", "since")
"""The columns of a list of runs that need attention: the step that needs it, and since when."""


@app.command("doctor", help=ACTIONS["doctor"].help)
def doctor(
    ctx: typer.Context, url: UrlOpt = None, token_file: TokenOpt = None, output: OutputOpt = None
) -> None:
    client, g = _api_opts(ctx, url, token_file, output)
    render.emit(client.request("GET", ACTIONS["doctor"].path()), g.output)


@app.command("list")
def list_runs(
    ctx: typer.Context,
    attention: AttentionOpt = None,
    state: StateOpt = None,
    workflow: WorkflowFilterOpt = None,
    step: StepOpt = None,
    cause: CauseOpt = None,
    updated_before: UpdatedBeforeOpt = None,
    order: Annotated[
        ListOrder | None,
        typer.Option(
            "--order",
            metavar="newest|oldest",
            help="newest by creation (the default), or oldest: the longest waiting for an "
            "operator first among runs that need attention, else by creation.",
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", metavar="N", min=1, max=100, help="Runs per page (default 20)."),
    ] = None,
    cursor: Annotated[
        str | None,
        typer.Option("--cursor", metavar="CURSOR", help="The nextCursor of the previous page."),
    ] = None,
    id_prefix: Annotated[
        str | None,
        typer.Option(
            "--id-prefix",
            metavar="PREFIX",
            help="Search: the runs whose id starts with these 4 to 36 characters.",
        ),
    ] = None,
    start_key: Annotated[
        str | None,
        typer.Option(
            "--start-key",
            metavar="KEY",
            help="Search: the run this Idempotency-Key started (with --workflow).",
        ),
    ] = None,
    start_sub: Annotated[
        str | None,
        typer.Option(
            "--start-sub",
            metavar="SUB",
            help="With --start-key: the token subject of the client that sent it (default: yours).",
        ),
    ] = None,
    event_source: Annotated[
        str | None,
        typer.Option(
            "--event-source",
            metavar="SOURCE",
            help="Search, with --event-id: the run the signed event with this source started.",
        ),
    ] = None,
    event_id: Annotated[
        str | None, typer.Option("--event-id", metavar="ID", help="With --event-source.")
    ] = None,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    """Runs, newest or oldest first, with filters and their total (20 a page, at most 100);
    or a search by run id prefix, start key or event."""
    client, g = _api_opts(ctx, url, token_file, output)
    params = run_filter(attention, state, workflow, step, cause, updated_before)
    params |= {
        name: str(value)
        for name, value in (
            ("order", order.value if order else None),
            ("limit", limit),
            ("cursor", cursor),
            ("runIdPrefix", id_prefix),
            ("startKey", start_key),
            ("startSub", start_sub),
            ("eventSource", event_source),
            ("eventId", event_id),
        )
        if value is not None
    }
    body = client.request("GET", "/v1/runs", params=params)
    if g.output == "json":
        render.emit_json(body)
        return
    runs = body.get("runs", [])
    rows = [
        {
            **run,
            "workflow": (run.get("workflow") or {}).get("id"),
            **(run.get("attentionStep") or {}),
        }
        for run in runs
    ]
    needing = bool(runs) and all("attentionStep" in run for run in runs)
    typer.echo(render.table(rows, _ATTENTION_COLUMNS if needing else _RUN_COLUMNS))
    estimate = " (an estimate)" if body.get("totalIsEstimate") else ""
    typer.echo(f"total: {body.get('total', '-')}{estimate}")
    typer.echo(f"nextCursor: {body.get('nextCursor') or '-'}")


@app.command("status", help=ACTIONS["status"].help)
def status(
    ctx: typer.Context,
    run: RunOpt,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    client, g = _api_opts(ctx, url, token_file, output)
    render.emit(client.request("GET", ACTIONS["status"].path(runId=_path_segment(run))), g.output)


@app.command("inspect", help=ACTIONS["inspect"].help)
def inspect(
    ctx: typer.Context,
    run: RunOpt,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    client, g = _api_opts(ctx, url, token_file, output)
    render.emit(client.request("GET", ACTIONS["inspect"].path(runId=_path_segment(run))), g.output)


def _path_segment(value: str) -> str:
    if not value or any(ch in value for ch in "/?#%") or len(value) > 255:
        raise CoordinatorError(Code.REQUEST_INVALID, "--run is not a run id")
    return value


def default_idempotency_key(workflow: str, input_bytes: bytes) -> str:
    """A key derived from what is started, so repeating the same command starts nothing new."""
    digest = hashlib.sha256(workflow.encode() + b"\n" + input_bytes).hexdigest()
    return f"ctl-{digest[:40]}"


@app.command("start", help=ACTIONS["start"].help)
def start(
    ctx: typer.Context,
    workflow: Annotated[str, typer.Option("--workflow", metavar="ID", help="Workflow id.")],
    input_file: Annotated[
        Path, typer.Option("--input-file", metavar="FILE", help="JSON file with the input.")
    ],
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key", metavar="KEY", help="Defaults to a hash of workflow and input."
        ),
    ] = None,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    client, g = _api_opts(ctx, url, token_file, output)
    try:
        raw = input_file.read_bytes()
        document = json.loads(raw)
    except OSError:
        raise CoordinatorError(Code.REQUEST_INVALID, f"{input_file}: cannot be read") from None
    except ValueError:
        raise CoordinatorError(Code.REQUEST_INVALID, f"{input_file}: not JSON") from None
    key = idempotency_key or default_idempotency_key(workflow, raw)
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise CoordinatorError(
            Code.REQUEST_INVALID, "--idempotency-key must be 1-255 visible ASCII"
        )
    body = client.request(
        "POST",
        ACTIONS["start"].path(workflowId=_path_segment(workflow)),
        body={"input": document},
        headers={"Idempotency-Key": key},
    )
    render.emit(body, g.output)


def _run_action(ctx: typer.Context, action: str, run: str, reason: str, g_opts: Any) -> None:
    url, token_file, output = g_opts
    api.check_reference("--reason", reason)
    client, g = _api_opts(ctx, url, token_file, output)
    body = client.request(
        "POST", ACTIONS[action].path(runId=_path_segment(run)), body={"reason": reason}
    )
    render.emit(body, g.output)


def _run_action_command(action: Action) -> None:
    """Register ``coordinatorctl <action>`` for an operator's action on a run."""

    def command(
        ctx: typer.Context,
        run: RunOpt,
        reason: ReasonOpt,
        url: UrlOpt = None,
        token_file: TokenOpt = None,
        output: OutputOpt = None,
    ) -> None:
        _run_action(ctx, action.name, run, reason, (url, token_file, output))

    command.__name__ = action.name.replace("-", "_")
    command.__doc__ = action.help
    app.command(action.name)(command)


# reconcile, retry-same and cancel: one command each, from the table of actions.
for _action in operator_actions(RUN):
    _run_action_command(_action)

BULK_TIMEOUT_SECONDS = 600.0
"""How long ``bulk`` waits for the coordinator's answer."""

BulkAction = StrEnum(  # type: ignore[misc]
    "BulkAction", {action.name: action.name for action in operator_actions(RUN)}
)
"""The actions ``bulk`` takes: every operator action on a run."""


@app.command("bulk")
def bulk_action(
    ctx: typer.Context,
    action: Annotated[
        BulkAction,
        typer.Argument(
            metavar="retry-same|cancel|reconcile", help="The action on each chosen run."
        ),
    ],
    reason: ReasonOpt,
    attention: AttentionOpt = None,
    state: StateOpt = None,
    workflow: WorkflowFilterOpt = None,
    step: StepOpt = None,
    cause: CauseOpt = None,
    updated_before: UpdatedBeforeOpt = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            metavar="N",
            min=1,
            max=MAX_BULK_LIMIT,
            help=f"Runs to act on at most (1 to {MAX_BULK_LIMIT}).",
        ),
    ] = DEFAULT_BULK_LIMIT,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Name the runs it would act on; act on none."),
    ] = False,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    """The action on every run the filters choose, oldest first (as list --order oldest),
    each audited as that action; --dry-run first to see which."""
    api.check_reference("--reason", reason)
    # The list's filters, but attention as the JSON boolean a body holds.
    filters: dict[str, Any] = dict(run_filter(None, state, workflow, step, cause, updated_before))
    if attention is not None:
        filters["attention"] = attention is TrueFalse.true
    body: dict[str, Any] = {"reason": reason, "filter": filters, "limit": limit}
    if dry_run:
        body["dryRun"] = True
    client, g = _api_opts(ctx, url, token_file, output)
    # A thousand runs acted on one after another (a few at a time) take a while.
    answer = client.request(
        "POST", f"/v1/runs/bulk/{action.value}", body=body, timeout=BULK_TIMEOUT_SECONDS
    )
    if g.output == "json":
        render.emit_json(answer)
        return
    if answer.get("dryRun"):
        ids = answer.get("runIds", [])
        typer.echo(render.table([{"runId": run_id} for run_id in ids], ("runId",)))
        typer.echo(f"{action.value} would act on {answer.get('matched', 0)} runs (dry run)")
        return
    results = answer.get("results", [])
    typer.echo(render.table(results, ("runId", "result", "code")))
    summary = ", ".join(f"{word} {count}" for word, count in render.tally(results))
    typer.echo(f"{action.value} on {answer.get('matched', 0)} runs: {summary or 'none'}")


def _instant(value: str) -> str:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CoordinatorError(
            Code.REQUEST_INVALID, "--before must be an RFC 3339 instant"
        ) from None
    if parsed.tzinfo is None:
        raise CoordinatorError(Code.REQUEST_INVALID, "--before needs a time zone offset or Z")
    if parsed > datetime.now(UTC):
        # (The server refuses it too, by its own clock.)
        raise CoordinatorError(Code.REQUEST_INVALID, "--before is later than now")
    return value


_AGE = re.compile(r"(?P<count>[1-9][0-9]{0,5})(?P<unit>[dh])")


def _cutoff(before: str | None, older_than: str | None) -> str:
    """The ``--before`` instant, given as one or computed from ``--older-than``."""
    if (before is None) == (older_than is None):
        usage_error("give exactly one of --before INSTANT and --older-than AGE")
    if before is not None:
        return _instant(before)
    assert older_than is not None
    found = _AGE.fullmatch(older_than)
    if found is None:
        usage_error("--older-than is a whole number of days or hours, like 365d or 36h")
    hours = int(found["count"]) * (24 if found["unit"] == "d" else 1)
    return (datetime.now(UTC) - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


@app.command("retain", help=ACTIONS["retain"].help)
def retain(
    ctx: typer.Context,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", metavar="N", min=1, max=100, help="Runs to erase at most (in each call)."
        ),
    ],
    before: Annotated[
        str | None,
        typer.Option("--before", metavar="INSTANT", help="RFC 3339 cutoff, not later than now."),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", metavar="AGE", help="The cutoff as an age: 365d, 36h (from now)."
        ),
    ] = None,
    every: Annotated[
        bool,
        typer.Option(
            "--all", help="Call again, with the same cutoff, until nothing is left to erase."
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Count and list the runs it would erase; erase nothing."),
    ] = False,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    if every and dry_run:
        usage_error("--all erases; --dry-run looks at one call's worth: use one of them")
    request: dict[str, Any] = {"before": _cutoff(before, older_than), "limit": limit}
    if dry_run:
        request["dryRun"] = True
    client, g = _api_opts(ctx, url, token_file, output)
    body = client.request("POST", ACTIONS["retain"].path(), body=request)
    if not every:
        render.emit(body, g.output)
        return
    # One cutoff for every call: a call that erases fewer than the limit found nothing more
    # that ended before it (runs ended later, and held ones, are never picked).
    erased, run_ids, calls = 0, [], 0
    while True:
        calls += 1
        erased += int(body.get("erased", 0))
        run_ids.extend(body.get("runIds", []))
        if int(body.get("erased", 0)) < limit:
            break
        typer.echo(f"erased {erased} so far", err=True)
        body = client.request("POST", ACTIONS["retain"].path(), body=request)
    render.emit(
        {"before": request["before"], "erased": erased, "calls": calls, "runIds": run_ids},
        g.output,
    )


def _operator_action(ctx: typer.Context, action: str, body: dict[str, Any], g_opts: Any) -> None:
    url, token_file, output = g_opts
    client, g = _api_opts(ctx, url, token_file, output)
    render.emit(client.request("POST", ACTIONS[action].path(), body=body), g.output)


@app.command("restore-hold", help=ACTIONS["restore-hold"].help)
def restore_hold(
    ctx: typer.Context,
    reason: ReasonOpt,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    api.check_reference("--reason", reason)
    _operator_action(ctx, "restore-hold", {"reason": reason}, (url, token_file, output))


@app.command("release-restore-hold", help=ACTIONS["release-restore-hold"].help)
def release_restore_hold(
    ctx: typer.Context,
    reason: ReasonOpt,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    api.check_reference("--reason", reason)
    _operator_action(ctx, "release-restore-hold", {"reason": reason}, (url, token_file, output))


FencedOpt = Annotated[
    bool,
    typer.Option(
        "--prior-deployment-fenced",
        help="State that the deployment restored from can no longer run (required).",
    ),
]


def _attested(flag: bool, name: str) -> None:
    if not flag:
        usage_error(f"{name} is required: it records your statement")


def _attestation(
    ctx: typer.Context,
    action: str,
    reference: str,
    history: tuple[str, str, bool],
    fenced: bool,
    api_opts: Any,
) -> None:
    """An attested hold step: the reference checked, both statements given, then sent."""
    member, flag, complete = history
    api.check_reference("--recovery-reference", reference)
    _attested(complete, flag)
    _attested(fenced, "--prior-deployment-fenced")
    body = {"recoveryReference": reference, member: True, "priorDeploymentFenced": True}
    _operator_action(ctx, action, body, api_opts)


@app.command("complete-execution-recovery", help=ACTIONS["complete-execution-recovery"].help)
def complete_execution_recovery(
    ctx: typer.Context,
    recovery_reference: RefOpt,
    execution_history_complete: Annotated[
        bool,
        typer.Option(
            "--execution-history-complete",
            help="State that the execution history after the backup is established (required).",
        ),
    ] = False,
    prior_deployment_fenced: FencedOpt = False,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    _attestation(
        ctx,
        "complete-execution-recovery",
        recovery_reference,
        ("executionHistoryComplete", "--execution-history-complete", execution_history_complete),
        prior_deployment_fenced,
        (url, token_file, output),
    )


@app.command("release-admission-hold", help=ACTIONS["release-admission-hold"].help)
def release_admission_hold(
    ctx: typer.Context,
    recovery_reference: RefOpt,
    admission_history_complete: Annotated[
        bool,
        typer.Option(
            "--admission-history-complete",
            help="State that every spent admission key is established (required).",
        ),
    ] = False,
    prior_deployment_fenced: FencedOpt = False,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    _attestation(
        ctx,
        "release-admission-hold",
        recovery_reference,
        ("admissionHistoryComplete", "--admission-history-complete", admission_history_complete),
        prior_deployment_fenced,
        (url, token_file, output),
    )


# ------------------------------------------------------------------------------ the console


@app.command()
def console(
    ctx: typer.Context,
    bind: Annotated[
        str,
        typer.Option(
            "--bind",
            metavar="127.0.0.1:PORT",
            help="Loopback address to serve on (port 0: a free one).",
        ),
    ] = "127.0.0.1:0",
    packages: Annotated[
        list[Path] | None,
        typer.Option(
            "--packages",
            metavar="DIR",
            help="A workflow package, or a folder of them, to draw runs with (repeatable).",
        ),
    ] = None,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
) -> None:
    """Serve the operator console on loopback and print the URL to open (Ctrl-C stops it).

    The console calls the API with the token file, read at each call; the browser never
    holds the token. With --runtime-config (or --packages) it draws each run's workflow.
    """
    from cli import console as web

    g = globals_of(ctx, url=url, token_file=token_file)
    api_client(g)  # the URL and the token file must be usable before anything is served
    assert g.url is not None and g.token_file is not None
    pins: list[tuple[Path, str]] = []
    if g.runtime_config is not None:
        from core.config.load import load_runtime_file

        config = load_runtime_file(g.runtime_config)
        pins = [(pin.root, pin.expected_digest) for pin in config.deployment.packages]
    settings = web.Settings(
        api_url=g.url,
        token_file=g.token_file,
        workflows=web.workflows_of(packages or [], pins),
    )
    try:
        sock = web.bind(bind)
    except ValueError as exc:
        usage_error(str(exc))
    except OSError as exc:
        usage_error(f"--bind {bind}: cannot listen ({exc.strerror})")

    def announce(address: str) -> None:
        typer.echo(f"console: {address}")
        typer.echo("Open it in a browser on this machine; Ctrl-C stops the console.")
        sys.stdout.flush()

    web.serve(settings, sock, announce)
