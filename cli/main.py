"""coordinatorctl: offline checks, deployment commands and the operator's API client.

Exit codes: 0 success; 1 the command ran and was refused (the last line of standard error
starts with a ``coordinator.<code>``; ``check`` and ``workflow check`` print one such line
per problem, and under ``--output json`` the refusal is one JSON document on standard error);
2 usage error.
"""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import typer

from cli import offline, operate, render
from cli.app import app
from cli.operate import default_idempotency_key
from cli.options import output_format, use_plain_help
from core.codes import Code
from core.errors import CoordinatorError

# Importing offline and then operate added their commands to app, in the order --help lists
# them; the names below are what the tests and the entry point take from here.
__all__ = ["app", "default_idempotency_key", "json_requested", "main", "offline", "operate"]


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
