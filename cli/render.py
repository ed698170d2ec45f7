"""Text and JSON output of coordinatorctl.

``--output json`` prints the document as it is. Text output prints lists as tables (drawn by
rich: a bold header on a terminal, one line per row so that ``grep`` and ``cut`` work) and
other documents as an indented outline. Refusals are printed here too: one
``coordinator.<code>: <detail>`` line per problem, or one JSON document under ``--output
json``, always on standard error.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.errors import CoordinatorError
from core.yamlsafe import problems_of

_UNBOUNDED = 1_000_000  # a width no table reaches: only used to measure one


def emit_json(document: Any) -> None:
    """One JSON document on standard output."""
    typer.echo(json.dumps(document, indent=2, sort_keys=False))


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """An aligned table with a header row, one line per row, no borders."""
    grid = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        grid.add_column(column, no_wrap=True)
    for row in rows:
        # Text, not markup: a value such as "[red]" is shown as written.
        grid.add_row(*(Text(_scalar(row.get(column))) for column in columns))
    # As wide as the table needs: a row is never wrapped or cut, whatever the terminal.
    needed = Console(file=io.StringIO(), width=_UNBOUNDED).measure(grid).maximum
    width = max(Console(file=sys.stdout).width, needed)
    wide = Console(file=sys.stdout, highlight=False, width=width)
    with wide.capture() as captured:
        wide.print(grid)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


def outline(document: Any, indent: int = 0) -> str:
    """A readable indented rendering of a JSON document."""
    pad = "  " * indent
    if isinstance(document, dict):
        lines: list[str] = []
        for name, value in document.items():
            if isinstance(value, dict) and value:
                lines.append(f"{pad}{name}:")
                lines.append(outline(value, indent + 1))
            elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                lines.append(f"{pad}{name}:")
                columns = list(dict.fromkeys(k for item in value for k in item))
                lines.extend(pad + "  " + row for row in table(value, columns).splitlines())
            else:
                lines.append(f"{pad}{name}: {_scalar(value)}")
        return "\n".join(lines)
    return pad + _scalar(document)


def emit(document: Any, output: str, *, columns: Sequence[str] | None = None) -> None:
    """Print ``document`` as JSON or as text (a table when ``columns`` are given)."""
    if output == "json":
        emit_json(document)
    elif columns is not None and isinstance(document, list):
        typer.echo(table(document, columns))
    else:
        typer.echo(outline(document))


def _located(entry: dict[str, Any]) -> str:
    if "line" in entry and "column" in entry:
        return f" (line {entry['line']}, column {entry['column']})"
    return ""


def refusal_document(error: CoordinatorError) -> dict[str, Any]:
    """The JSON form of a refusal: the first problem's members, and ``errors`` listing every
    problem (code, detail, and path, line and column where known)."""
    entries = [{**entry, "code": f"coordinator.{entry['code']}"} for entry in problems_of(error)]
    return {**entries[0], "code": f"coordinator.{error.code}", "errors": entries}


def refusal(error: CoordinatorError, output: str) -> None:
    """Print a refusal on standard error: one line per problem, the last of which starts
    with the code (CONTRACT §2.2); under ``--output json`` one JSON document comes first,
    on its own line, for scripts."""
    if output == "json":
        sys.stderr.write(json.dumps(refusal_document(error)) + "\n")
    entries = problems_of(error)
    if len(entries) == 1 and "line" not in entries[0]:
        sys.stderr.write(error.cli_line() + "\n")  # byte for byte what it always was
        return
    for entry in entries:
        sys.stderr.write(f"coordinator.{entry['code']}: {entry['detail']}{_located(entry)}\n")


def tally(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """How many runs of a bulk action's answer came out with each result or refusal code,
    most common first."""
    counts: dict[str, int] = {}
    for entry in results:
        word = str(entry.get("result") or entry.get("code") or "-")
        counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))
