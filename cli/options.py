"""coordinatorctl's shared options, and how its help shows parameters.

typer writes a parameter's Python type beside it (``<bool>`` for a flag, ``<path>``, ``<str>``);
the help here shows the operator's own words instead — ``--runtime-config FILE``, ``--url
URL`` — and a flag as a bare flag. Every command is built with :class:`Command` (every group
with :class:`Group`), whose parameters print only their metavar.

``--url``, ``--token-file``, ``--runtime-config`` and ``--output`` may stand before or after
the subcommand; ``COORDINATOR_URL``, ``COORDINATOR_TOKEN_FILE`` and
``COORDINATOR_RUNTIME_CONFIG`` stand in for the first three when neither position gives them
(:func:`pick`).
"""

from __future__ import annotations

from contextvars import ContextVar
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from core.states import RunState

URL_ENV = "COORDINATOR_URL"
TOKEN_FILE_ENV = "COORDINATOR_TOKEN_FILE"  # noqa: S105 - a variable name, not a secret
RUNTIME_CONFIG_ENV = "COORDINATOR_RUNTIME_CONFIG"
CLIENT_ID_ENV = "COORDINATOR_CLIENT_ID"

T = TypeVar("T")


class OutputFormat(StrEnum):
    """The two output formats."""

    text = "text"
    json = "json"


class TrueFalse(StrEnum):
    """A boolean spelled as the API spells it."""

    true = "true"
    false = "false"


class ListOrder(StrEnum):
    """``GET /v1/runs?order=``."""

    newest = "newest"
    oldest = "oldest"


RuntimeOpt = Annotated[
    Path | None,
    typer.Option(
        "--runtime-config",
        metavar="FILE",
        envvar=RUNTIME_CONFIG_ENV,
        help="The runtime file.",
        show_default=False,
    ),
]
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", metavar="URL", envvar=URL_ENV, help="Base URL of the coordinator's API."),
]
TokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        metavar="PATH",
        envvar=TOKEN_FILE_ENV,
        help="File holding an access token (mode 0600).",
    ),
]
OutputOpt = Annotated[
    OutputFormat | None,
    typer.Option(
        "--output",
        metavar="FORMAT",
        help="text (the default) or json; under json a refusal is JSON on stderr.",
    ),
]
RunOpt = Annotated[str, typer.Option("--run", metavar="ID", help="The run id.")]
ReasonOpt = Annotated[str, typer.Option("--reason", metavar="REF", help="Investigation reference.")]
RefOpt = Annotated[
    str,
    typer.Option("--recovery-reference", metavar="REF", help="Investigation reference."),
]
RemoveOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--remove-workflow",
        metavar="ID",
        help="Remove this workflow from the activation (repeatable).",
    ),
]
# The list's filters (GET /v1/runs), shared by ``list`` and ``bulk``.
AttentionOpt = Annotated[
    TrueFalse | None,
    typer.Option(
        "--attention",
        metavar="true|false",
        help="Only runs that need, or do not need, an operator.",
    ),
]
StateOpt = Annotated[
    RunState | None,
    typer.Option(
        "--state", metavar="STATE", help="Only runs in this state: " + ", ".join(RunState) + "."
    ),
]
WorkflowFilterOpt = Annotated[
    str | None, typer.Option("--workflow", metavar="ID", help="Only runs of this workflow.")
]
StepOpt = Annotated[
    str | None,
    typer.Option("--step", metavar="ID", help="Only runs whose step of this id needs attention."),
]
CauseOpt = Annotated[
    str | None,
    typer.Option(
        "--cause", metavar="CAUSE", help="Only runs with a step that needs attention for this."
    ),
]
UpdatedBeforeOpt = Annotated[
    str | None,
    typer.Option(
        "--updated-before",
        metavar="TIME",
        help="Only runs last updated before this RFC 3339 date-time (with an offset).",
    ),
]


def run_filter(
    attention: TrueFalse | None,
    state: RunState | None,
    workflow: str | None,
    step: str | None,
    cause: str | None,
    updated_before: str | None,
) -> dict[str, str]:
    """The filters given, by their API names, as the list's query spells them."""
    found = {
        "attention": attention.value if attention else None,
        "state": state.value if state else None,
        "workflow": workflow,
        "step": step,
        "cause": cause,
        "updatedBefore": updated_before,
    }
    return {name: value for name, value in found.items() if value is not None}


SourceArg = Annotated[
    Path, typer.Argument(metavar="DIR", help="Workflow source directory.", show_default=False)
]


# ---------------------------------------------------------------------------------- the help


class _Option(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        return self.metavar or None


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None  # the name column already shows the metavar


def _plain(params: list[Any]) -> list[Any]:
    """Let each parameter show its metavar, not its Python type (display only: parsing is
    untouched, the subclasses add no state)."""
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = _Option
        elif type(param) is TyperArgument:
            param.__class__ = _Argument
    return params


# The output format of the command being run, for printing its refusal (main() catches it
# after the command's context is gone).
output_format: ContextVar[str] = ContextVar("output_format", default="text")


class Command(TyperCommand):
    """A coordinatorctl command: plain help, and it records its output format."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        chosen = ctx.params.get("output")
        root = ctx.find_root().obj
        fallback = getattr(root, "output", "text")
        output_format.set(chosen.value if isinstance(chosen, OutputFormat) else fallback)
        return super().invoke(ctx)


class Group(TyperGroup):
    """A coordinatorctl command group: plain help."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))


def use_plain_help(app: typer.Typer) -> None:
    """Build every command of ``app`` (and of its groups) with :class:`Command`."""
    for info in app.registered_commands:
        info.cls = Command
    for group in app.registered_groups:
        if group.typer_instance is not None:
            use_plain_help(group.typer_instance)


# ------------------------------------------------------------------------------ precedence


def given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` of this command was written on the command line."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def pick(ctx: typer.Context, name: str, here: T | None, before: T | None) -> T | None:
    """An option written after the subcommand, else before it, else its environment value."""
    if here is not None and given(ctx, name):
        return here
    return before if before is not None else here
