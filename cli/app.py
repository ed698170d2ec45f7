"""coordinatorctl's command tree and what every command shares: the options that may stand
before or after the subcommand, and the usage errors for a missing runtime file, URL or token.
The commands live in :mod:`cli.offline` and :mod:`cli.operate`; :mod:`cli.main` imports both
(in that order, which is the order ``--help`` lists them in) and runs the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from cli import api
from cli.options import (
    Group,
    OutputFormat,
    OutputOpt,
    RuntimeOpt,
    TokenOpt,
    UrlOpt,
    pick,
)
from core import __version__

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


def globals_of(
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


def usage_error(message: str) -> NoReturn:
    raise typer.BadParameter(message)


def need_runtime(g: Globals) -> Path:
    if g.runtime_config is None:
        usage_error("--runtime-config FILE is required for this command")
    return g.runtime_config


def api_client(g: Globals) -> api.ApiClient:
    if not g.url:
        usage_error("--url (or COORDINATOR_URL) is required for this command")
    if g.token_file is None:
        usage_error("--token-file (or COORDINATOR_TOKEN_FILE) is required for this command")
    return api.ApiClient(g.url, api.read_token_file(g.token_file))
