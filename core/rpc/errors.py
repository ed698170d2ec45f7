"""Refusals across gRPC: a CoordinatorError leaves a servicer as a status plus trailing
metadata and is rebuilt, code and detail intact, on the calling side.

Trailing metadata is small: gRPC refuses a call whose metadata passes 8 KiB in all. So
what travels is bounded by design, never cut mid-way: the detail to
:data:`MAX_DETAIL_CHARS`, and the extra members (JSON) to :data:`MAX_EXTRA_CHARS`. An
``errors`` list (input.invalid's JSON pointers) keeps its first entries, at most
:data:`MAX_CARRIED_ERRORS` and as many as fit, and ``errorsOmitted`` counts the rest.
Extra members that still do not fit are left behind, logged by size; the code and detail
always arrive.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import grpc

from core.codes import Code
from core.errors import CoordinatorError

CODE_KEY = "coordinator-code"
DETAIL_KEY = "coordinator-detail"
EXTRA_KEY = "coordinator-extra"

MAX_DETAIL_CHARS: Final = 2000
MAX_EXTRA_CHARS: Final = 4096
"""With the detail and the keys, well under gRPC's 8 KiB of metadata."""
MAX_CARRIED_ERRORS: Final = 20
"""The most ``errors`` entries a refusal carries; ``errorsOmitted`` counts the others."""
OMITTED_KEY: Final = "errorsOmitted"

log = logging.getLogger("coordinator.rpc")

_BY_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
}


def status_for(code: Code) -> grpc.StatusCode:
    """The gRPC status a refusal travels with: the one of its HTTP status, else INTERNAL."""
    if code.status is None:
        return grpc.StatusCode.INTERNAL
    return _BY_STATUS.get(code.status, grpc.StatusCode.INTERNAL)


def _metadata_safe(text: str) -> str:
    # gRPC metadata values must be printable ASCII.
    return "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in text[:MAX_DETAIL_CHARS])


def _compact(value: Any) -> str:
    # Metadata-safe as it stands: json.dumps escapes all but printable ASCII and DEL.
    return json.dumps(value, separators=(",", ":")).replace("\x7f", "\\u007f")


def carried_extra(extra: Mapping[str, Any]) -> str | None:
    """The extra members as the JSON text that travels, within :data:`MAX_EXTRA_CHARS`:
    whole when they fit; else with the first ``errors`` that fit and ``errorsOmitted``;
    ``None`` when even that does not fit."""
    errors = extra.get("errors")
    if isinstance(errors, list) and errors:
        total = len(errors)
        # The members around the list, with the count as long as it can be: each entry
        # kept adds its own length and a comma, so the size is known before encoding.
        size = len(_compact({**extra, "errors": [], OMITTED_KEY: total}))
        kept: list[Any] = []
        for entry in errors[:MAX_CARRIED_ERRORS]:
            grown = size + len(_compact(entry)) + (1 if kept else 0)
            if grown > MAX_EXTRA_CHARS:
                break
            kept.append(entry)
            size = grown
        bounded = {**extra, "errors": kept}
        if len(kept) < total:
            bounded[OMITTED_KEY] = total - len(kept)
        extra = bounded
    text = _compact(extra)
    if len(text) > MAX_EXTRA_CHARS:
        log.warning("refusal members of %d characters left behind", len(text))
        return None
    return text


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def refusals(method: F) -> F:
    """Decorate a servicer method: CoordinatorError becomes status + metadata."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except CoordinatorError as exc:
            metadata: list[tuple[str, str]] = [
                (CODE_KEY, exc.code.value),
                (DETAIL_KEY, _metadata_safe(exc.detail)),
            ]
            extra = carried_extra(exc.extra) if exc.extra else None
            if extra is not None:
                metadata.append((EXTRA_KEY, extra))
            context.set_trailing_metadata(tuple(metadata))
            await context.abort(status_for(exc.code), exc.code.value)

    return wrapper  # type: ignore[return-value]


def rebuild(error: grpc.aio.AioRpcError, component: str) -> CoordinatorError:
    """The CoordinatorError a failed call carried, or service.unavailable for transport loss.

    A code this side does not know (a component of another version) becomes ``internal``,
    logged with the spelling that arrived.
    """
    found = {key: value for key, value in (error.trailing_metadata() or ())}
    text = found.get(CODE_KEY)
    if isinstance(text, str):
        detail = found.get(DETAIL_KEY)
        extra = _extra(found.get(EXTRA_KEY), component)
        code = Code.parse(text)
        if code is None:
            log.error("unknown code %r from the %s component", text, component)
            code = Code.INTERNAL
        return CoordinatorError(code, detail if isinstance(detail, str) else "", extra)
    if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return CoordinatorError(
            Code.SERVICE_UNAVAILABLE, f"the {component} component is unavailable"
        )
    log.error("unexpected gRPC failure from %s: %s", component, error.code().name)
    return CoordinatorError(Code.INTERNAL, f"the {component} component failed unexpectedly")


def _extra(text: object, component: str) -> dict[str, Any] | None:
    # A peer of another version may send members this side cannot read: the refusal
    # still stands on its code and detail.
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        log.error("unreadable refusal members from the %s component", component)
        return None
    return value if isinstance(value, dict) else None
