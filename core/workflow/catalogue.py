"""The operation catalogue: what each connection type offers a workflow (CONTRACT §14).

This is the single description of every product operation and result. The offline checker
reads it to judge a step's ``input``, the dispatcher reads it to build and send the request,
recovery reads the receipt and retry-same rules, and the authoring guide's operation table is
generated from it (``operations_markdown``), so the four can never disagree.

A command schema lists only the fields an author writes. Fields the coordinator fills in
itself (Casework's ``producer``, taken from the connection's ``producer`` setting so that the
task authority stays with the operator's runtime file) are listed separately in
``connection_fields`` and refused in a workflow's ``input``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

from core.workflow.jsonvalue import article, json_type_of, pointer_token, type_fits

DAY = 86_400


@dataclass(frozen=True)
class Field:
    """One field of a command, a response or a result."""

    name: str
    type: str
    required: bool = True
    about: str = ""


@dataclass(frozen=True)
class Operation:
    """One product operation a ``call`` step can name."""

    name: str
    method: str
    path: str
    """Route template; ``{profile}`` is the connection's ``profile``."""
    command: tuple[Field, ...]
    """The fields an author writes in ``call.input``."""
    connection_fields: tuple[tuple[str, str], ...]
    """Body fields filled from connection settings: (body field, connection key)."""
    success_status: int
    response: tuple[Field, ...]
    """Fields of a successful response that ``${response.<field>}`` may read."""
    receipt_path: str | None
    """Route template of the product's receipt for a command key, or None without receipts."""
    retry_same_seconds: int
    """How long after the first attempt the product honours a repeated idempotency key."""
    about: str = ""

    def command_field(self, name: str) -> Field | None:
        """The author-facing command field called ``name``, if there is one."""
        return next((f for f in self.command if f.name == name), None)

    def response_field(self, name: str) -> Field | None:
        """The response field called ``name``, if there is one."""
        return next((f for f in self.response if f.name == name), None)

    @property
    def has_receipts(self) -> bool:
        """Whether reconcile can ask the product for a receipt of this operation."""
        return self.receipt_path is not None


@dataclass(frozen=True)
class Result:
    """A named product result a ``wait-for`` step can wait for."""

    name: str
    method: str
    path: str
    """Route template; ``{profile}`` and the identifying fields fill it."""
    identifying: tuple[Field, ...]
    """Fields the author writes inside ``wait-for`` to name the awaited result."""
    fields: tuple[Field, ...]
    """Fields a decided result keeps, readable as ``${steps.<id>.<field>}``."""
    about: str = ""

    def result_field(self, name: str) -> Field | None:
        """The result field called ``name``, if there is one."""
        return next((f for f in self.fields if f.name == name), None)


@dataclass(frozen=True)
class ConnectionType:
    """One connection type: a downstream product and what a workflow may ask of it."""

    name: str
    product: str
    operations: Mapping[str, Operation]
    results: Mapping[str, Result]
    settings: tuple[str, ...]
    """Connection keys (beside ``type`` and ``authorization``) the runtime file must set."""
    profile_about: str
    """What ``profile`` names at this product (shown in the author's runtime template)."""


def _ops(*operations: Operation) -> Mapping[str, Operation]:
    return MappingProxyType({op.name: op for op in operations})


def _results(*results: Result) -> Mapping[str, Result]:
    return MappingProxyType({r.name: r for r in results})


_MESSAGING = ConnectionType(
    name="messaging",
    product="Messaging",
    operations=_ops(
        Operation(
            name="send-notice",
            method="POST",
            path="/v1/profiles/{profile}/messages",
            command=(
                Field("template", "string", about="the Messaging template to use"),
                Field("recipientRef", "string", about="who receives the notice"),
                Field("parameters", "object", about="values the template fills in"),
            ),
            connection_fields=(),
            success_status=202,
            response=(Field("messageId", "string"), Field("acceptedAt", "string")),
            receipt_path="/v1/profiles/{profile}/receipts/{key}",
            retry_same_seconds=7 * DAY,
            about="Send one notice from a Messaging profile.",
        ),
    ),
    results=_results(),
    settings=("baseUrl", "profile"),
    profile_about="the Messaging profile notices are sent from",
)

_SCHEDULING = ConnectionType(
    name="scheduling",
    product="Scheduling",
    operations=_ops(
        Operation(
            name="book-slot",
            method="POST",
            path="/v1/profiles/{profile}/bookings",
            command=(
                Field("slotRef", "string", about="the slot to book"),
                Field("subjectRef", "string", about="who or what the booking is for"),
            ),
            connection_fields=(),
            success_status=201,
            response=(Field("bookingId", "string"),),
            receipt_path="/v1/profiles/{profile}/receipts/{key}",
            retry_same_seconds=7 * DAY,
            about="Book one slot in a Scheduling profile.",
        ),
    ),
    results=_results(),
    settings=("baseUrl", "profile"),
    profile_about="the Scheduling profile that holds the slots",
)

_BREG = ConnectionType(
    name="breg-action",
    product="Base Registry Engine (BReg)",
    operations=_ops(
        Operation(
            name="submit-action",
            method="POST",
            path="/v1/registers/{profile}/actions",
            command=(
                Field("actionType", "string", about="the register action to request"),
                Field("subjectRef", "string", about="the register entry it concerns"),
                Field("payload", "object", about="the action's details"),
            ),
            connection_fields=(),
            success_status=201,
            response=(Field("actionId", "string"),),
            receipt_path=None,
            retry_same_seconds=DAY,
            about="Submit one action to a register; the register decides whether to allow it.",
        ),
        Operation(
            name="create-proposal",
            method="POST",
            path="/v1/registers/{profile}/proposals",
            command=(
                Field("subjectRef", "string", about="the register entry to change"),
                Field("changes", "object", about="the proposed changes"),
            ),
            connection_fields=(),
            success_status=201,
            response=(Field("proposalId", "string"),),
            receipt_path=None,
            retry_same_seconds=DAY,
            about="Create a proposal in a register; the coordinator never applies it.",
        ),
    ),
    results=_results(),
    settings=("baseUrl", "profile"),
    profile_about="the register the actions and proposals go to",
)

_CASEWORK = ConnectionType(
    name="casework-review-producer",
    product="Casework",
    operations=_ops(
        Operation(
            name="create-review-request",
            method="POST",
            path="/v1/projects/{profile}/review-requests",
            command=(
                Field("subjectRef", "string", about="what the reviewer looks at"),
                Field("summary", "string", about="one line shown to the reviewer"),
            ),
            connection_fields=(("producer", "producer"),),
            success_status=201,
            response=(Field("reviewId", "string"),),
            receipt_path=None,
            retry_same_seconds=DAY,
            about="Ask for a human review in a Casework project.",
        ),
    ),
    results=_results(
        Result(
            name="review-decision",
            method="GET",
            path="/v1/projects/{profile}/review-requests/{reviewId}",
            identifying=(Field("reviewId", "string", about="the review to wait for"),),
            fields=(Field("outcome", "string"), Field("decidedAt", "string")),
            about="The reviewer's decision on a review request.",
        ),
    ),
    settings=("baseUrl", "profile", "producer"),
    profile_about="the Casework project that receives the review requests",
)

CONNECTION_TYPES: Mapping[str, ConnectionType] = MappingProxyType(
    {t.name: t for t in (_MESSAGING, _SCHEDULING, _BREG, _CASEWORK)}
)


def connection_type(name: str) -> ConnectionType | None:
    """The catalogued connection type called ``name``, if any."""
    return CONNECTION_TYPES.get(name)


def operation(type_name: str, operation_name: str) -> Operation | None:
    """The operation ``operation_name`` of connection type ``type_name``, if catalogued."""
    kind = CONNECTION_TYPES.get(type_name)
    return kind.operations.get(operation_name) if kind else None


def result(type_name: str, result_name: str) -> Result | None:
    """The result ``result_name`` of connection type ``type_name``, if catalogued."""
    kind = CONNECTION_TYPES.get(type_name)
    return kind.results.get(result_name) if kind else None


def validate_command(op: Operation, command: Any) -> list[tuple[str, str]]:
    """Check a mapped command against ``op``'s command schema; (JSON pointer, reason) pairs.

    The dispatcher calls this before it commits a prepared command (a failure is the run's
    ``invalid-command``). Reasons never contain the offending value.
    """
    if not isinstance(command, dict):
        return [("", "the command must be a JSON object")]
    problems: list[tuple[str, str]] = []
    for spec in op.command:
        if spec.name not in command:
            if spec.required:
                problems.append((f"/{pointer_token(spec.name)}", "is required"))
            continue
        actual = json_type_of(command[spec.name])
        if not type_fits(actual, spec.type):
            problems.append(
                (f"/{pointer_token(spec.name)}", f"must be {article(spec.type)}, not {actual}")
            )
    for name in sorted(command):
        if op.command_field(name) is None:
            problems.append((f"/{pointer_token(name)}", f"is not a field of {op.name}"))
    return problems


def fill_path(template: str, values: Mapping[str, str]) -> str:
    """Fill a route template's ``{name}`` slots; each value must be one URL path segment.

    Refusing a slash or dot-segment keeps a value from steering the request to another route
    (the coordinator calls only the catalogued routes).
    """

    def one(match: re.Match[str]) -> str:
        value = values[match.group(1)]
        if not value or "/" in value or value in {".", ".."} or not value.isprintable():
            raise ValueError(f"route value {match.group(1)!r} is not a single path segment")
        return quote(value, safe="-._~:@!$&'()*+,;=")

    return re.sub(r"\{([A-Za-z]+)\}", one, template)


def _describe_fields(fields: tuple[Field, ...]) -> str:
    return ", ".join(f"`{f.name}` ({f.type})" for f in fields) or "—"


def _window(seconds: int) -> str:
    if seconds % DAY == 0 and seconds >= 2 * DAY:
        return f"{seconds // DAY} days"
    return f"{seconds // 3600} h"


def operations_markdown() -> str:
    """The authoring guide's operation table, generated from this catalogue."""
    lines = [
        "| connection type | operation | request | you write in `input` | filled in by the "
        "coordinator | success | response fields | receipts | retry-same window |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in CONNECTION_TYPES.values():
        for op in kind.operations.values():
            filled = ", ".join(
                f"`{body}`, from the connection's `{key}`" for body, key in op.connection_fields
            )
            receipt = f"yes: `GET {op.receipt_path}`" if op.receipt_path else "no"
            lines.append(
                f"| `{kind.name}` | `{op.name}` | `{op.method} {op.path}` | "
                f"{_describe_fields(op.command)} | {filled or '—'} | {op.success_status} | "
                f"{_describe_fields(op.response)} | {receipt} | {_window(op.retry_same_seconds)} |"
            )
    return "\n".join(lines)


def results_markdown() -> str:
    """The authoring guide's table of results a ``wait-for`` step can wait for."""
    lines = [
        "| connection type | result | read with | identifying fields | result fields |",
        "|---|---|---|---|---|",
    ]
    for kind in CONNECTION_TYPES.values():
        for res in kind.results.values():
            lines.append(
                f"| `{kind.name}` | `{res.name}` | `{res.method} {res.path}` | "
                f"{_describe_fields(res.identifying)} | {_describe_fields(res.fields)} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - a helper for refreshing the guide by hand
    print(operations_markdown())
    print()
    print(results_markdown())
