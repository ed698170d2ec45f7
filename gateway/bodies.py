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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request

from core import derive
from core.actions import bounded_int, exact_members, reference
from core.canonical import unkept_place
from core.clock import parse_offset_instant
from core.codes import Code
from core.errors import CoordinatorError
from core.runs import (
    ATTENTION_CAUSES,
    DEFAULT_BULK_LIMIT,
    DEFAULT_LIST_LIMIT,
    IDEMPOTENCY_KEY,
    LIST_ORDERS,
    MAX_BULK_LIMIT,
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

T = TypeVar("T")


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
    "runIdPrefix",
    "startKey",
    "startSub",
    "eventSource",
    "eventId",
)

_SEARCH_EXCLUDES: Final = (
    "attention",
    "state",
    "step",
    "cause",
    "updatedBefore",
    "order",
    "cursor",
)
"""The list parameters a search (by run id prefix, start key or event) does not take."""

_SEARCH_TEXT: Final = re.compile(r"[^\x00-\x1f\x7f]{1,255}")


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
    run_id_prefix: str | None = None
    """A search: the runs whose id starts with this (lowercased)."""
    start_key: str | None = None
    """A search: the run this ``Idempotency-Key`` started in ``workflow``."""
    start_sub: str | None = None
    """With ``start_key``: the subject of the client that sent it; the caller when unset."""
    event_source: str | None = None
    """A search, with ``event_id``: the run this signed event started."""
    event_id: str | None = None


def _search_text(params: QueryParams, name: str) -> str | None:
    value = _single(params, name)
    if value is not None and not _SEARCH_TEXT.fullmatch(value):
        raise RequestInvalid(f"{name}: must be 1 to 255 characters without control characters")
    return value


def _search(params: QueryParams, workflow: str | None) -> dict[str, str | None]:
    """The search parameters, checked: at most one kind of search, each complete, and none
    of the filters a search does not take."""
    prefix = _single(params, "runIdPrefix")
    if prefix is not None:
        prefix = prefix.lower()
        if not derive.is_run_id_prefix(prefix):
            raise RequestInvalid("runIdPrefix: must be the first 4 to 36 characters of a run id")
    start_key = _single(params, "startKey")
    if start_key is not None and not IDEMPOTENCY_KEY.fullmatch(start_key):
        raise RequestInvalid("startKey: must be 1 to 255 visible ASCII characters")
    start_sub = _search_text(params, "startSub")
    if start_sub is not None and start_key is None:
        raise RequestInvalid("startSub: only with startKey")
    if start_key is not None and workflow is None:
        raise RequestInvalid("workflow: a search by startKey needs the workflow it started")
    event_source = _search_text(params, "eventSource")
    event_id = _search_text(params, "eventId")
    if (event_source is None) != (event_id is None):
        raise RequestInvalid(
            "eventId: needed with eventSource"
            if event_id is None
            else "eventSource: needed with eventId"
        )
    kinds = [
        name
        for name, value in (
            ("runIdPrefix", prefix),
            ("startKey", start_key),
            ("eventSource", event_source),
        )
        if value is not None
    ]
    if len(kinds) > 1:
        raise RequestInvalid(f"{kinds[1]}: one search at a time, not with {kinds[0]}")
    if kinds:
        for name in _SEARCH_EXCLUDES:
            if name in params:
                raise RequestInvalid(f"{name}: not with {kinds[0]}, which searches alone")
    return {
        "run_id_prefix": prefix,
        "start_key": start_key,
        "start_sub": start_sub,
        "event_source": event_source,
        "event_id": event_id,
    }


def _attention(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise RequestInvalid(f"{where}: must be true or false")
    return value


def _state(value: object, where: str) -> str:
    if not isinstance(value, str) or value not in RUN_STATES:
        raise RequestInvalid(f"{where}: must be a run state")
    return value


def _workflow(value: object, where: str) -> str:
    if not isinstance(value, str) or not WORKFLOW_ID_PATTERN.fullmatch(value):
        raise RequestInvalid(f"{where}: must be a workflow id")
    return value


def _step(value: object, where: str) -> str:
    if not isinstance(value, str) or not STEP_NAME.fullmatch(value):
        raise RequestInvalid(f"{where}: must be a step id")
    return value


def _cause(value: object, where: str) -> str:
    if not isinstance(value, str) or value not in ATTENTION_CAUSES:
        raise RequestInvalid(f"{where}: must be one of " + ", ".join(ATTENTION_CAUSES))
    return value


def _instant(value: object, where: str) -> str:
    if not isinstance(value, str) or parse_offset_instant(value) is None:
        raise RequestInvalid(f"{where}: must be an RFC 3339 date-time with an offset")
    return value


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
    if state is not None:
        _state(state, "state")
    workflow = _single(params, "workflow")
    if workflow is not None:
        _workflow(workflow, "workflow")
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
    if step is not None:
        _step(step, "step")
    cause = _single(params, "cause")
    if cause is not None:
        _cause(cause, "cause")
    updated_before = _single(params, "updatedBefore")
    if updated_before is not None:
        _instant(updated_before, "updatedBefore")
    return ListParameters(
        attention,
        state,
        workflow,
        limit,
        cursor,
        order,
        step,
        cause,
        updated_before,
        **_search(params, workflow),
    )


@dataclass(frozen=True)
class RunFilter:
    """Which runs a bulk action chooses: the list's filters (each ``None`` when not given)."""

    attention: bool | None = None
    state: str | None = None
    workflow: str | None = None
    step: str | None = None
    cause: str | None = None
    updated_before: str | None = None


_FILTER_MEMBERS: Final = ("attention", "state", "workflow", "step", "cause", "updatedBefore")
_BULK_MEMBERS: Final = ("reason", "filter", "limit", "dryRun")


@dataclass(frozen=True)
class BulkRequest:
    """The validated body of ``POST /v1/runs/bulk/{action}`` (CONTRACT §8.7)."""

    reason: str
    """The investigation reference every run's audit record carries."""
    filter: RunFilter
    """The runs to choose, as ``GET /v1/runs?order=oldest`` with these filters lists them."""
    limit: int
    """1..:data:`MAX_BULK_LIMIT`, default :data:`DEFAULT_BULK_LIMIT`."""
    dry_run: bool
    """Name the chosen runs and act on none."""


def bulk_request(body: Mapping[str, Any]) -> BulkRequest:
    """Validate a bulk action's body: ``reason`` and ``filter`` required, ``limit`` and
    ``dryRun`` optional; every refusal names the JSON pointer at fault."""
    if any(key not in _BULK_MEMBERS for key in body):
        raise RequestInvalid("the body has a member this request does not take")
    reason = reference(body, "reason")
    found = body.get("filter")
    if not isinstance(found, dict):
        raise RequestInvalid("/filter: required, a JSON object of the list's filters")
    if any(key not in _FILTER_MEMBERS for key in found):
        raise RequestInvalid(
            "/filter: may hold only " + ", ".join(_FILTER_MEMBERS) + " (the list's filters)"
        )

    def member(key: str, check: Callable[[object, str], T]) -> T | None:
        return check(found[key], f"/filter/{key}") if key in found else None

    limit = DEFAULT_BULK_LIMIT
    if "limit" in body:
        limit = bounded_int(body, "limit", 1, MAX_BULK_LIMIT)
    dry_run = body.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise RequestInvalid("/dryRun: must be true or false")
    return BulkRequest(
        reason=reason,
        filter=RunFilter(
            attention=member("attention", _attention),
            state=member("state", _state),
            workflow=member("workflow", _workflow),
            step=member("step", _step),
            cause=member("cause", _cause),
            updated_before=member("updatedBefore", _instant),
        ),
        limit=limit,
        dry_run=dry_run,
    )
