"""Reading and validating what callers send: bodies, headers and query strings.

Limits (CONTRACT §8): a body is at most :data:`MAX_BODY_BYTES` — refused from its
``Content-Length`` before anything is read, and again while streaming, since a chunked body
announces no length. JSON must be UTF-8, one object, without repeated member names, and
nested at most :data:`MAX_JSON_DEPTH` levels (checked before parsing, so a hostile body
cannot exhaust the parser's recursion). Every value must be one the components can be
handed: no ``NaN``/``Infinity``, no number beyond the double range (``1e999``, which Python
reads as infinity) and no lone surrogate (``"\\ud800"``, which UTF-8 and so protobuf cannot
encode) — checked right after parsing, not left to fail on the way out.

Every refusal is ``request.invalid`` (400) or ``request.too-large`` (413) and names the JSON
pointer or parameter at fault, never the value that was sent. What an operator action's body
must hold is the action's own (:mod:`core.actions`), checked by the route that reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request

from core.actions import exact_members
from core.canonical import unkept_place
from core.clock import parse_offset_instant
from core.codes import Code
from core.errors import CoordinatorError
from core.runs import (
    ATTENTION_CAUSES,
    DEFAULT_LIST_LIMIT,
    LIST_ORDERS,
    MAX_LIST_LIMIT,
    NEWEST,
    RUN_STATES,
    STEP_NAME,
    check_idempotency_key,
)

MAX_BODY_BYTES: Final = 64 * 1024
MAX_JSON_DEPTH: Final = 32

WORKFLOW_ID_PATTERN: Final = re.compile(r"[a-z][a-z0-9-]{0,62}")
CURSOR_PATTERN: Final = re.compile(r"[\x21-\x7e]{1,512}")
_LIMIT_DIGITS = re.compile(r"[0-9]{1,3}")


class RequestInvalid(CoordinatorError):
    """400 ``request.invalid``."""

    def __init__(self, detail: str) -> None:
        super().__init__(Code.REQUEST_INVALID, detail)


class RequestTooLarge(CoordinatorError):
    """413 ``request.too-large``."""

    def __init__(self) -> None:
        super().__init__(Code.REQUEST_TOO_LARGE, f"the body exceeds {MAX_BODY_BYTES} bytes")


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The raw body, refused when its announced or streamed size exceeds ``limit``."""
    lengths = request.headers.getlist("content-length")
    if len(lengths) > 1:
        raise RequestInvalid("the request repeats Content-Length")
    if lengths:
        text = lengths[0].strip()
        if not text.isdigit() or not text.isascii():
            raise RequestInvalid("Content-Length is not a number")
        if int(text) > limit:
            raise RequestTooLarge()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestTooLarge()
    return bytes(body)


def check_depth(text: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON text whose arrays/objects nest deeper than ``limit``."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                raise RequestInvalid(f"the body nests deeper than {limit} levels")
        elif char in "]}":
            depth -= 1


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise RequestInvalid("the body repeats a member name")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise RequestInvalid("the body holds a non-finite number")


def refuse_unkept(document: Mapping[str, Any]) -> None:
    """Refuse a parsed body holding a number beyond the double range or a lone surrogate;
    the detail names the JSON pointer, never the value."""
    place = unkept_place(document)
    if place is not None:
        pointer, reason = place
        raise RequestInvalid(f"{pointer}: {reason}" if pointer else f"the body {reason}")


def parse_json_object(data: bytes, *, check_values: bool = True) -> dict[str, Any]:
    """One JSON object from UTF-8 ``data`` under the limits of this module.

    ``check_values=False`` leaves :func:`refuse_unkept` to the caller, for a route that must
    authenticate the body before it may answer anything but 401.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestInvalid("the body is not UTF-8") from None
    check_depth(text)
    try:
        value = json.loads(text, object_pairs_hook=_no_repeats, parse_constant=_no_constants)
    except RequestInvalid:
        raise
    except (ValueError, RecursionError):
        raise RequestInvalid("the body is not well-formed JSON") from None
    if not isinstance(value, dict):
        raise RequestInvalid("the body is not a JSON object")
    if check_values:
        refuse_unkept(value)
    return value


async def read_json_object(request: Request) -> dict[str, Any]:
    """Read and parse the request's JSON object body."""
    return parse_json_object(await read_body(request))


def json_text(value: Any) -> str:
    """A parsed JSON value as the compact text a component receives."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def start_input(body: Mapping[str, Any]) -> str:
    """The ``input`` object of a start body, as compact JSON text."""
    exact_members(body, ("input",))
    value = body["input"]
    if not isinstance(value, dict):
        raise RequestInvalid("/input: must be a JSON object")
    return json_text(value)


def idempotency_key(headers: Headers) -> str:
    """The single ``Idempotency-Key`` header: 1–255 visible ASCII characters."""
    values = headers.getlist("idempotency-key")
    if len(values) != 1:
        raise RequestInvalid("Idempotency-Key: exactly one header is required")
    check_idempotency_key(values[0])
    return values[0]


def _single(params: QueryParams, name: str) -> str | None:
    values = params.getlist(name)
    if len(values) > 1:
        raise RequestInvalid(f"{name}: given more than once")
    return values[0] if values else None


LIST_PARAMETERS: Final = (
    "attention",
    "state",
    "workflow",
    "step",
    "cause",
    "updatedBefore",
    "order",
    "limit",
    "cursor",
)


@dataclass(frozen=True)
class ListParameters:
    """The validated query of ``GET /v1/runs``."""

    attention: bool | None
    """``attention=true|false`` when given."""
    state: str | None
    """One of :data:`RUN_STATES` when given."""
    workflow: str | None
    """A workflow id when given."""
    limit: int
    """1..100, default 20."""
    cursor: str | None
    """The opaque cursor of the previous page."""
    order: str = NEWEST
    """``newest`` (the default) or ``oldest``."""
    step: str | None = None
    """A step id: only runs whose step of that name needs attention."""
    cause: str | None = None
    """Only runs with a step that needs attention for this cause."""
    updated_before: str | None = None
    """An RFC 3339 date-time with an offset, as the caller wrote it."""


def list_parameters(params: QueryParams) -> ListParameters:
    """Validate a list request's query; unknown or repeated parameters are refused."""
    for name in params:
        if name not in LIST_PARAMETERS:
            raise RequestInvalid("the query names an unknown parameter")
    attention_text = _single(params, "attention")
    attention: bool | None = None
    if attention_text is not None:
        if attention_text not in ("true", "false"):
            raise RequestInvalid("attention: must be true or false")
        attention = attention_text == "true"
    state = _single(params, "state")
    if state is not None and state not in RUN_STATES:
        raise RequestInvalid("state: must be a run state")
    workflow = _single(params, "workflow")
    if workflow is not None and not WORKFLOW_ID_PATTERN.fullmatch(workflow):
        raise RequestInvalid("workflow: must be a workflow id")
    limit_text = _single(params, "limit")
    limit = DEFAULT_LIST_LIMIT
    if limit_text is not None:
        if not _LIMIT_DIGITS.fullmatch(limit_text) or not 1 <= int(limit_text) <= MAX_LIST_LIMIT:
            raise RequestInvalid(f"limit: must be an integer from 1 to {MAX_LIST_LIMIT}")
        limit = int(limit_text)
    cursor = _single(params, "cursor")
    if cursor is not None and not CURSOR_PATTERN.fullmatch(cursor):
        raise RequestInvalid("cursor: not a cursor this service gave")
    order = _single(params, "order") or NEWEST
    if order not in LIST_ORDERS:
        raise RequestInvalid("order: must be newest or oldest")
    step = _single(params, "step")
    if step is not None and not STEP_NAME.fullmatch(step):
        raise RequestInvalid("step: must be a step id")
    cause = _single(params, "cause")
    if cause is not None and cause not in ATTENTION_CAUSES:
        raise RequestInvalid("cause: must be one of " + ", ".join(ATTENTION_CAUSES))
    updated_before = _single(params, "updatedBefore")
    if updated_before is not None and parse_offset_instant(updated_before) is None:
        raise RequestInvalid("updatedBefore: must be an RFC 3339 date-time with an offset")
    return ListParameters(
        attention, state, workflow, limit, cursor, order, step, cause, updated_before
    )
