"""Refusals across gRPC: a CoordinatorError leaves a servicer as a status plus trailing
metadata and is rebuilt, code and detail intact, on the calling side.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from core.codes import Code
from core.errors import CoordinatorError

CODE_KEY = "coordinator-code"
DETAIL_KEY = "coordinator-detail"
EXTRA_KEY = "coordinator-extra"

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
    return "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in text)[:2000]


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
            if exc.extra:
                metadata.append((EXTRA_KEY, _metadata_safe(json.dumps(exc.extra))))
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
        extra_text = found.get(EXTRA_KEY)
        extra = json.loads(extra_text) if isinstance(extra_text, str) else None
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
