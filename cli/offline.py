"""coordinatorctl's commands that need no running coordinator: the offline checks, the
workflow source commands (check, simulate, test, graph), packaging, key fingerprints, the
audit journal, ``login`` and the database commands (plan, apply, deployment status).
"""

from __future__ import annotations

import asyncio
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from cli import login as login_flow
from cli import render
from cli.app import (
    app,
    audit_app,
    globals_of,
    keys_app,
    need_runtime,
    usage_error,
    workflow_app,
)
from cli.options import (
    CLIENT_ID_ENV,
    OutputFormat,
    OutputOpt,
    RemoveOpt,
    RuntimeOpt,
    SourceArg,
    TokenOpt,
)
from core.codes import Code
from core.errors import CoordinatorError

# ---------------------------------------------------------------------------- offline commands


@app.command()
def check(ctx: typer.Context, runtime_config: RuntimeOpt = None, output: OutputOpt = None) -> None:
    """Validate the runtime file and every listed package, offline."""
    from core.config.check import check_runtime_file

    g = globals_of(ctx, runtime_config, output=output)
    checked = check_runtime_file(need_runtime(g))
    workflows = [{"id": wid, "digest": pkg.digest} for wid, pkg in sorted(checked.packages.items())]
    document = {"status": "valid", "namespace": checked.config.namespace, "workflows": workflows}
    render.emit(document, g.output)


@workflow_app.command("check")
def workflow_check(ctx: typer.Context, source: SourceArg, output: OutputOpt = None) -> None:
    """Validate a workflow source directory, offline (warnings never refuse it)."""
    from core.workflow.advice import advise
    from core.workflow.check import check_source_dir

    g = globals_of(ctx, output=output)
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

    g = globals_of(ctx, output=output)
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

    g = globals_of(ctx, output=output)
    try:
        workflow = check_source_dir(source)
    except CoordinatorError as exc:
        render.refusal(exc, g.output)
        raise typer.Exit(2) from None
    named = tests.named(source, scripts or [])
    if not named:
        usage_error(
            f"no scripts: {source / tests.SIMULATIONS} holds no *.yaml, and none were given"
        )
    suite = tests.run_suite(workflow, named)
    if coverage_svg is not None:
        try:
            coverage_svg.write_text(suite.coverage.picture(), encoding="utf-8")
        except OSError as exc:
            usage_error(f"--coverage-svg {coverage_svg}: cannot be written ({exc.strerror})")
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
        usage_error(f"--out {out}: cannot be written ({exc.strerror})")


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

    g = globals_of(ctx, output=output)
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

    g = globals_of(ctx, runtime_config, output=output)
    prints = fingerprints(load_runtime_file(need_runtime(g)))
    render.emit(prints.to_json(), g.output)


@audit_app.command("seal-tail")
def audit_seal_tail(
    ctx: typer.Context, runtime_config: RuntimeOpt = None, output: OutputOpt = None
) -> None:
    """With auditd stopped, move a torn last line of the journal aside and record the seal."""
    from core.audit.seal import seal_torn_tail
    from core.config.load import load_runtime_file

    g = globals_of(ctx, runtime_config, output=output)
    journal = load_runtime_file(need_runtime(g)).deployment.audit_file
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

    g = globals_of(ctx, runtime_config, output=output)
    if audit_file is None:
        from core.config.load import load_runtime_file

        if g.runtime_config is None:
            usage_error("--audit-file FILE (or --runtime-config FILE) is required for this command")
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
    g = globals_of(ctx, runtime_config, token_file=token_file, output=output)
    if device and private_key_file is not None:
        usage_error("--device and --private-key-file exclude each other")
    if g.token_file is None:
        usage_error("--token-file (or COORDINATOR_TOKEN_FILE) is required for this command")
    if not client_id:
        usage_error(f"--client-id (or {CLIENT_ID_ENV}) is required for this command")
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
        usage_error("--issuer URL (or --runtime-config FILE) is required for this command")
    if not audience:
        usage_error("--audience URL (or --runtime-config FILE) is required for this command")
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


_PLAN_COLUMNS = ("id", "action", "activeDigest", "plannedDigest")


def _planned(
    ctx: typer.Context,
    applying: bool,
    remove_workflow: list[str] | None,
    runtime_config: Path | None,
    output: OutputFormat | None,
) -> bool:
    """``plan`` (or, ``applying``, ``apply``) for the runtime file, its entries printed;
    answers whether they were printed as text."""
    from core import deploy
    from core.config.check import check_runtime_file

    g = globals_of(ctx, runtime_config, output=output)
    checked = check_runtime_file(need_runtime(g))
    run = deploy.apply if applying else deploy.plan
    entries = asyncio.run(run(checked, list(remove_workflow or [])))
    document = {"workflows": [entry.to_json() for entry in entries]}
    if g.output == "json":
        render.emit_json(document)
        return False
    render.emit(document["workflows"], "text", columns=_PLAN_COLUMNS)
    return True


@app.command()
def plan(
    ctx: typer.Context,
    remove_workflow: RemoveOpt = None,
    runtime_config: RuntimeOpt = None,
    output: OutputOpt = None,
) -> None:
    """Say what apply would install, replace, leave unchanged or remove."""
    _planned(ctx, False, remove_workflow, runtime_config, output)


@app.command()
def apply(
    ctx: typer.Context,
    remove_workflow: RemoveOpt = None,
    runtime_config: RuntimeOpt = None,
    output: OutputOpt = None,
) -> None:
    """Migrate the schema, grant roles and record the active packages."""
    if _planned(ctx, True, remove_workflow, runtime_config, output):
        typer.echo("applied")


@app.command("deployment-status")
def deployment_status(
    ctx: typer.Context, runtime_config: RuntimeOpt = None, output: OutputOpt = None
) -> None:
    """Verify the activation with the runtime credential and report it."""
    from core.config.check import check_runtime_file
    from core.deploy import status as run_status

    g = globals_of(ctx, runtime_config, output=output)
    checked = check_runtime_file(need_runtime(g))
    report = asyncio.run(run_status(checked))
    render.emit(report.to_json(), g.output)
