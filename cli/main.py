"""coordinatorctl: offline checks, deployment commands and the operator's API client.

Exit codes: 0 success; 1 the command ran and was refused (the last line of standard error
starts with a ``coordinator.<code>``; ``check`` and ``workflow check`` print one such line
per problem, and under ``--output json`` the refusal is one JSON document on standard error);
2 usage error.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from cli import api, render
from cli import login as login_flow
from cli.options import (
    CLIENT_ID_ENV,
    AttentionOpt,
    CauseOpt,
    Group,
    ListOrder,
    OutputFormat,
    OutputOpt,
    ReasonOpt,
    RefOpt,
    RemoveOpt,
    RunOpt,
    RuntimeOpt,
    SourceArg,
    StateOpt,
    StepOpt,
    TokenOpt,
    TrueFalse,
    UpdatedBeforeOpt,
    UrlOpt,
    WorkflowFilterOpt,
    output_format,
    pick,
    run_filter,
    use_plain_help,
)
from core import __version__
from core.actions import ACTIONS, RUN, Action, operator_actions
from core.codes import Code
from core.errors import CoordinatorError
from core.runs import DEFAULT_BULK_LIMIT, IDEMPOTENCY_KEY, MAX_BULK_LIMIT

app = typer.Typer(
    name="coordinatorctl",
    cls=Group,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Check, package, deploy and operate Registry Coordinator workflows.",
)
workflow_app = typer.Typer(cls=Group, no_args_is_help=True, help="Workflow source commands.")
keys_app = typer.Typer(cls=Group, no_args_is_help=True, help="Key custody commands.")
audit_app = typer.Typer(cls=Group, no_args_is_help=True, help="Audit journal commands.")
app.add_typer(workflow_app, name="workflow")
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")


@dataclass
class Globals:
    """Options that may stand before or after the subcommand."""

    runtime_config: Path | None = None
    url: str | None = None
    token_file: Path | None = None
    output: str = "text"


def _globals(
    ctx: typer.Context,
    runtime_config: Path | None = None,
    url: str | None = None,
    token_file: Path | None = None,
    output: OutputFormat | None = None,
) -> Globals:
    root: Globals = ctx.find_root().obj or Globals()
    return Globals(
        runtime_config=pick(ctx, "runtime_config", runtime_config, root.runtime_config),
        url=pick(ctx, "url", url, root.url),
        token_file=pick(ctx, "token_file", token_file, root.token_file),
        output=output.value if output else root.output,
    )


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    runtime_config: RuntimeOpt = None,
    url: UrlOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Registry Coordinator's command line."""
    ctx.obj = Globals(runtime_config, url, token_file, output.value if output else "text")


def _usage(message: str) -> NoReturn:
    raise typer.BadParameter(message)


def _need_runtime(g: Globals) -> Path:
    if g.runtime_config is None:
        _usage("--runtime-config FILE is required for this command")
    return g.runtime_config


def _client(g: Globals) -> api.ApiClient:
    if not g.url:
        _usage("--url (or COORDINATOR_URL) is required for this command")
    if g.token_file is None:
        _usage("--token-file (or COORDINATOR_TOKEN_FILE) is required for this command")
    return api.ApiClient(g.url, api.read_token_file(g.token_file))


# ---------------------------------------------------------------------------- offline commands


@app.command()
def check(ctx: typer.Context, runtime_config: RuntimeOpt = None, output: OutputOpt = None) -> None:
    """Validate the runtime file and every listed package, offline."""
    from core.config.check import check_runtime_file

    g = _globals(ctx, runtime_config, output=output)
    checked = check_runtime_file(_need_runtime(g))
    workflows = [{"id": wid, "digest": pkg.digest} for wid, pkg in sorted(checked.packages.items())]
    document = {"status": "valid", "namespace": checked.config.namespace, "workflows": workflows}
    render.emit(document, g.output)


@workflow_app.command("check")
def workflow_check(ctx: typer.Context, source: SourceArg, output: OutputOpt = None) -> None:
    """Validate a workflow source directory, offline (warnings never refuse it)."""
    from core.workflow.advice import advise
    from core.workflow.check import check_source_dir

    g = _globals(ctx, output=output)
    workflow = check_source_dir(source)
    document: dict[str, Any] = {"status": "valid", "id": workflow.id, "version": workflow.version}
    warnings = advise(workflow)
    if warnings:
        document["warnings"] = [{"path": w.path, "message": w.message} for w in warnings]
    render.emit(document, g.output)


@workflow_app.command("simulate")
def workflow_simulate(
    ctx: typer.Context,
    source: SourceArg,
    script: Annotated[
        Path,
        typer.Option("--script", metavar="FILE", help="The simulation script (YAML)."),
    ],
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input-file", metavar="FILE", help="JSON input, instead of the script's input."
        ),
    ] = None,
    output: OutputOpt = None,
) -> None:
    """Run a workflow offline against scripted answers, with simulated time.

    Exits 0 when the run ends as the script's expect says, 1 when it does not, 2 when the
    workflow or the script is refused.
    """
    from cli import simulate as sim
    from cli import simulation_report as report
    from cli import simulation_script as script_file
    from core.workflow.check import check_source_dir

    g = _globals(ctx, output=output)
    try:
        workflow = check_source_dir(source)
        parsed = script_file.read_script(workflow, script, input_file)
        simulation = sim.simulate(workflow, parsed)
    except CoordinatorError as exc:
        render.refusal(exc, g.output)
        raise typer.Exit(2) from None
    if g.output == "json":
        document = report.document(simulation, parsed.expect)
        render.emit_json(document)
        ok = document["asExpected"]
    else:
        for line in report.text(simulation, parsed.expect):
            typer.echo(line)
        ok = not report.differences(parsed.expect, simulation)
    if not ok:
        raise typer.Exit(1)


@workflow_app.command("test")
def workflow_test(
    ctx: typer.Context,
    source: SourceArg,
    scripts: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="[SCRIPT]...",
            help="Scripts to run instead of every DIR/simulations/*.yaml.",
            show_default=False,
        ),
    ] = None,
    coverage_svg: Annotated[
        Path | None,
        typer.Option(
            "--coverage-svg",
            metavar="FILE",
            help="Draw the workflow here: edges some script took solid, the others marked.",
        ),
    ] = None,
    min_coverage: Annotated[
        float | None,
        typer.Option(
            "--min-coverage",
            metavar="P",
            min=0.0,
            max=100.0,
            help="Exit 1 when scripts take fewer than P percent of the edges.",
        ),
    ] = None,
    output: OutputOpt = None,
) -> None:
    """Run every simulation script of a workflow and say which steps and edges none reached.

    Exits 0 when every script passes (and the edges taken reach --min-coverage), 1 when a
    script fails or coverage is short, 2 when the workflow or a script is refused.
    """
    from cli import suite as tests
    from core.workflow.check import check_source_dir

    g = _globals(ctx, output=output)
    try:
        workflow = check_source_dir(source)
    except CoordinatorError as exc:
        render.refusal(exc, g.output)
        raise typer.Exit(2) from None
    named = tests.named(source, scripts or [])
    if not named:
        _usage(f"no scripts: {source / tests.SIMULATIONS} holds no *.yaml, and none were given")
    suite = tests.run_suite(workflow, named)
    if coverage_svg is not None:
        try:
            coverage_svg.write_text(suite.coverage.picture(), encoding="utf-8")
        except OSError as exc:
            _usage(f"--coverage-svg {coverage_svg}: cannot be written ({exc.strerror})")
    if g.output == "json":
        render.emit_json(tests.document(suite))
    else:
        for line in tests.text(suite, min_coverage):
            typer.echo(line)
    status = tests.verdict(suite, min_coverage)
    if status:
        raise typer.Exit(status)


class GraphFormat(StrEnum):
    """The formats of ``workflow graph``."""

    svg = "svg"
    mermaid = "mermaid"
    dot = "dot"


@workflow_app.command("graph")
def workflow_graph(
    source: Annotated[
        Path,
        typer.Argument(
            metavar="DIR", help="Workflow source or package folder.", show_default=False
        ),
    ],
    fmt: Annotated[
        GraphFormat,
        typer.Option("--format", metavar="FORMAT", help="svg (the default), mermaid or dot."),
    ] = GraphFormat.svg,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE", help="Write here instead of standard output."),
    ] = None,
) -> None:
    """Draw a workflow's step graph, offline."""
    from core.workflow.graph import read_folder, render

    text = render(read_folder(source), fmt.value)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        _usage(f"--out {out}: cannot be written ({exc.strerror})")


@app.command()
def package(
    ctx: typer.Context,
    source: SourceArg,
    out: Annotated[
        Path, typer.Option("--out", metavar="OUTDIR", help="Folder to write the package into.")
    ],
    output: OutputOpt = None,
) -> None:
    """Build a content-addressed package and print its digest."""
    from core.workflow.package import build_package

    g = _globals(ctx, output=output)
    built = build_package(source, out)
    document = {
        "digest": built.digest,
        "path": str(built.path),
        "runtimeTemplate": str(built.runtime_template),
    }
    if g.output == "json":
        render.emit_json(document)
    else:
        typer.echo(built.digest)
        typer.echo(f"package: {built.path}")
        typer.echo(f"runtime template: {built.runtime_template}")


@keys_app.command("fingerprint")
def keys_fingerprint(
    ctx: typer.Context, runtime_config: RuntimeOpt = None, output: OutputOpt = None
) -> None:
    """Print the custody fingerprint of each configured key (never the key)."""
    from core.config.load import load_runtime_file
    from core.keys import fingerprints

    g = _globals(ctx, runtime_config, output=output)
    prints = fingerprints(load_runtime_file(_need_runtime(g)))
    render.emit(prints.to_json(), g.output)


@audit_app.command("seal-tail")
def audit_seal_tail(
    ctx: typer.Context, runtime_config: RuntimeOpt = None, output: OutputOpt = None
) -> None:
    """With auditd stopped, move a torn last line of the journal aside and record the seal."""
    from core.audit.seal import seal_torn_tail
    from core.config.load import load_runtime_file

    g = _globals(ctx, runtime_config, output=output)
    journal = load_runtime_file(_need_runtime(g)).deployment.audit_file
    sealed = seal_torn_tail(journal)
    if sealed is None:
        render.emit({"status": "intact", "journal": str(journal)}, g.output)
        return
    if g.output == "json":
        render.emit_json(sealed.to_json())
    else:
        typer.echo(f"sealed: {sealed.torn_bytes} torn bytes of {journal}")
        typer.echo(f"moved to: {sealed.side_file} (sha256 {sealed.torn_sha256})")
        typer.echo(f"seal record: seq {sealed.seq}")


@audit_app.command("verify")
def audit_verify(
    ctx: typer.Context,
    audit_file: Annotated[
        Path | None,
        typer.Option(
            "--audit-file",
            help="The journal (JSON Lines); default: deployment.auditFile of --runtime-config.",
        ),
    ] = None,
    from_seq: Annotated[
        int,
        typer.Option("--from-seq", min=1, help="Start at this record, taking its prev as given."),
    ] = 1,
    runtime_config: RuntimeOpt = None,
    output: OutputOpt = None,
) -> None:
    """Offline: check the journal's hash chain, sequence and record shapes."""
    from core.audit.verify import verify_file

    g = _globals(ctx, runtime_config, output=output)
    if audit_file is None:
        from core.config.load import load_runtime_file

        if g.runtime_config is None:
            _usage("--audit-file FILE (or --runtime-config FILE) is required for this command")
        audit_file = load_runtime_file(g.runtime_config).deployment.audit_file
    try:
        result = verify_file(audit_file, from_seq)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN, f"{audit_file}: cannot be read ({reason})"
        ) from None
    if not result.ok:
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN,
            f"{audit_file}: seq {result.seq} (line {result.line}): {result.reason}",
        )
    document: dict[str, Any] = {
        "status": "intact",
        "auditFile": str(audit_file),
        "records": result.records,
        "firstSeq": from_seq if result.records else None,
        "lastSeq": result.last_seq if result.records else None,
        "lastLineHash": result.last_hash,
    }
    if from_seq > 1:
        document["firstPrev"] = result.first_prev
    if g.output == "json":
        render.emit_json(document)
        return
    span = f" (seq {from_seq}-{result.last_seq})" if result.records else ""
    typer.echo(f"{audit_file}: {result.records} records{span}, hash chain intact")
    typer.echo(f"last line hash: {result.last_hash}")
    if from_seq > 1:
        typer.echo(
            f"taken as given: seq {from_seq}'s prev {result.first_prev} "
            f"(compare it with the line hash you kept for seq {from_seq - 1})"
        )


# ------------------------------------------------------------------------------ login


@app.command()
def login(
    ctx: typer.Context,
    issuer: Annotated[
        str | None,
        typer.Option(
            "--issuer",
            metavar="URL",
            envvar="COORDINATOR_ISSUER",
            help="The issuer; default: deployment.authentication.issuer of --runtime-config.",
        ),
    ] = None,
    client_id: Annotated[
        str | None,
        typer.Option(
            "--client-id",
            metavar="ID",
            envvar=CLIENT_ID_ENV,
            help="The OAuth client to sign in as (its policy decides what the token may do).",
        ),
    ] = None,
    audience: Annotated[
        str | None,
        typer.Option(
            "--audience",
            metavar="URL",
            envvar="COORDINATOR_AUDIENCE",
            help="The API's audience; default: deployment.authentication.audience.",
        ),
    ] = None,
    device: Annotated[
        bool,
        typer.Option("--device", help="Sign in with a new code even if a refresh token is kept."),
    ] = False,
    private_key_file: Annotated[
        Path | None,
        typer.Option(
            "--private-key-file",
            metavar="FILE",
            help="Client credentials with private_key_jwt: the client's private JWK (0600).",
        ),
    ] = None,
    scope: Annotated[
        str | None,
        typer.Option(
            "--scope",
            metavar="SCOPES",
            help=f"Scopes to ask for; default for a person: {login_flow.DEFAULT_SCOPE!r}.",
        ),
    ] = None,
    runtime_config: RuntimeOpt = None,
    token_file: TokenOpt = None,
    output: OutputOpt = None,
) -> None:
    """Get an access token for the API from the issuer and write it to the token file."""
    g = _globals(ctx, runtime_config, token_file=token_file, output=output)
    if device and private_key_file is not None:
        _usage("--device and --private-key-file exclude each other")
    if g.token_file is None:
        _usage("--token-file (or COORDINATOR_TOKEN_FILE) is required for this command")
    if not client_id:
        _usage(f"--client-id (or {CLIENT_ID_ENV}) is required for this command")
    assertion_audience = "token-endpoint"
    algorithms: tuple[str, ...] = ()
    # The runtime file fills what the options leave out (and says what a client assertion
    # names as its audience); a person who gave both URLs needs no access to it, which an
    # operator's own account usually lacks.
    needed = not (issuer and audience) or private_key_file is not None
    if g.runtime_config is not None and needed:
        from core.config.load import load_runtime_file

        settings = load_runtime_file(g.runtime_config).deployment.authentication
        issuer = issuer or settings.issuer
        audience = audience or settings.audience
        assertion_audience = settings.client_assertion_audience
        algorithms = settings.algorithms
    if not issuer:
        _usage("--issuer URL (or --runtime-config FILE) is required for this command")
    if not audience:
        _usage("--audience URL (or --runtime-config FILE) is required for this command")
    jwk = login_flow.read_private_jwk(private_key_file) if private_key_file is not None else None
    with login_flow.http_client() as http:
        found = login_flow.discover(http, issuer)
        tokens = None
        if jwk is not None:
            tokens = login_flow.client_credentials(
                http,
                found,
                client_id,
                audience,
                jwk,
                assertion_audience=assertion_audience,
                scope=scope,
            )
        elif not device:
            kept = login_flow.stored_refresh_token(g.token_file)
            if kept is not None:
                tokens = login_flow.refresh(http, found, client_id, audience, kept)
        if tokens is None:
            flow = login_flow.DeviceLogin(
                found, client_id, audience, scope or login_flow.DEFAULT_SCOPE
            )
            # The prompt goes to stderr, so stdout stays one JSON document under --output json.
            tokens = flow.run(http, lambda line: typer.echo(line, err=True))
    facts = login_flow.token_facts(tokens.access_token, found.issuer, audience, algorithms)
    refresh_file = login_flow.store(g.token_file, tokens)
    document = {
        "tokenFile": str(g.token_file),
        "refreshTokenFile": str(refresh_file) if refresh_file else None,
        "grant": tokens.grant,
        "clientId": facts.client_id,
        "expiresAt": login_flow.expiry_text(facts.expires_at),
    }
    if g.output == "json":
        render.emit_json(document)
        return
    until = f", valid until {document['expiresAt']}" if document["expiresAt"] else ""
    typer.echo(f"token for client {facts.client_id} written to {g.token_file}{until}")
    if refresh_file is not None:
        typer.echo(f"refresh token kept in {refresh_file}")


# ------------------------------------------------------------------------- database commands


def _plan_document(entries: Any) -> dict[str, Any]:
    return {"workflows": [entry.to_json() for entry in entries]}


@app.command()
def plan(
    ctx: typer.Context,
    remove_workflow: RemoveOpt = None,
    runtime_config: RuntimeOpt = None,
    output: OutputOpt = None,
) -> None:
    """Say what apply would install, replace, leave unchanged or remove."""
    from core.config.check import check_runtime_file
    from core.deploy import plan as run_plan

    g = _globals(ctx, runtime_config, output=output)
    checked = check_runtime_file(_need_runtime(g))
    entries = asyncio.run(run_plan(checked, list(remove_workflow or [])))
    if g.output == "json":
        render.emit_json(_plan_document(entries))
    else:
        render.emit(_plan_document(entries)["workflows"], "text", columns=_PLAN_COLUMNS)


_PLAN_COLUMNS = ("id", "action", "activeDigest", "plannedDigest")


@app.command()
def apply(
    ctx: typer.Context,
    remove_workflow: RemoveOpt = None,
    runtime_config: RuntimeOpt = None,
    output: OutputOpt = None,
) -> None:
    """Migrate the schema, grant roles and record the active packages."""
    from core.config.check import check_runtime_file
    from core.deploy import apply as run_apply

    g = _globals(ctx, runtime_config, output=output)
    checked = check_runtime_file(_need_runtime(g))
    entries = asyncio.run(run_apply(checked, list(remove_workflow or [])))
    if g.output == "json":
        render.emit_json(_plan_document(entries))
    else:
        render.emit(_plan_document(entries)["workflows"], "text", columns=_PLAN_COLUMNS)
        typer.echo("applied")


@app.command("deployment-status")
def deployment_status(
    ctx: typer.Context, runtime_config: RuntimeOpt = None, output: OutputOpt = None
) -> None:
    """Verify the activation with the runtime credential and report it."""
    from core.config.check import check_runtime_file
    from core.deploy import status as run_status

    g = _globals(ctx, runtime_config, output=output)
    checked = check_runtime_file(_need_runtime(g))
    report = asyncio.run(run_status(checked))
    render.emit(report.to_json(), g.output)


# ------------------------------------------------------------------------------ API commands


def _api_opts(
    ctx: typer.Context, url: str | None, token_file: Path | None, output: OutputFormat | None
) -> tuple[api.ApiClient, Globals]:
    g = _globals(ctx, url=url, token_file=token_file, output=output)
    return _client(g), g


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
        _usage("give exactly one of --before INSTANT and --older-than AGE")
    if before is not None:
        return _instant(before)
    assert older_than is not None
    found = _AGE.fullmatch(older_than)
    if found is None:
        _usage("--older-than is a whole number of days or hours, like 365d or 36h")
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
        _usage("--all erases; --dry-run looks at one call's worth: use one of them")
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
        _usage(f"{name} is required: it records your statement")


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

    g = _globals(ctx, url=url, token_file=token_file)
    _client(g)  # the URL and the token file must be usable before anything is served
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
        _usage(str(exc))
    except OSError as exc:
        _usage(f"--bind {bind}: cannot listen ({exc.strerror})")

    def announce(address: str) -> None:
        typer.echo(f"console: {address}")
        typer.echo("Open it in a browser on this machine; Ctrl-C stops the console.")
        sys.stdout.flush()

    web.serve(settings, sock, announce)


use_plain_help(app)


def json_requested(argv: list[str]) -> bool:
    """Whether the words ask for ``--output json`` (read before parsing, for a usage error:
    the parser stopped before it knew the format)."""
    for position, word in enumerate(argv):
        if word == "--":
            break
        if word == "--output=json" or (
            word == "--output" and argv[position + 1 : position + 2] == ["json"]
        ):
            return True
    return False


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: usage errors exit 2, refusals exit 1 with coordinator.* lines (under
    --output json, either one starts with a JSON document on standard error)."""
    words = sys.argv[1:] if argv is None else list(argv)
    output_format.set("text")
    try:
        status = app(args=words, prog_name="coordinatorctl", standalone_mode=False)
    except typer.TyperException as exc:
        # Typer's own errors (its command-line parser's): a usage error (exit 2) is no
        # refusal, the command never ran, but a script asking for JSON still gets JSON, the
        # shape of a refusal's with the code usage.invalid.
        status = getattr(exc, "exit_code", 1)
        if status == 2 and json_requested(words):
            detail = exc.format_message()
            document = {"code": f"coordinator.{Code.USAGE_INVALID}", "detail": detail}
            sys.stderr.write(json.dumps(document) + "\n")
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            sys.stderr.write(f"Error: {exc.format_message()}\n")
        sys.exit(status)
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        sys.exit(1)
    except CoordinatorError as exc:
        render.refusal(exc, output_format.get())
        sys.exit(1)
    except Exception as exc:  # the last line must still be a code, never a traceback
        unexpected = CoordinatorError(Code.INTERNAL, f"unexpected {type(exc).__name__}")
        render.refusal(unexpected, output_format.get())
        sys.exit(1)
    sys.exit(status if isinstance(status, int) else 0)
