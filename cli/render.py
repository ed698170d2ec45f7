"""Text and JSON output of coordinatorctl."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import typer


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
    """A plain aligned table with a header row."""
    cells = [[_scalar(row.get(column)) for column in columns] for row in rows]
    widths = [
        max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)
    ]
    lines = ["  ".join(column.ljust(widths[i]) for i, column in enumerate(columns)).rstrip()]
    for line in cells:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
    return "\n".join(lines)


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
