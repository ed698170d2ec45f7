"""RFC 9457 problem documents for every refusal the gateway answers (CONTRACT §8).

One handler turns the domain error root, :class:`core.errors.CoordinatorError`, into
``application/problem+json`` using its :class:`core.codes.Code`'s status and title.
Starlette's own 404/405 become ``not-found`` / ``method-not-allowed``. ``internal`` (which
:func:`core.rpc.errors.rebuild` gives for an unexpected gRPC failure) and a code with no HTTP
status are answered like any unexpected error: a bare 500 whose only particular is a
correlation id, with the cause written to the server's log under that id.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any, Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from core.codes import Code
from core.errors import CoordinatorError
from core.rpc.errors import OMITTED_KEY

PROBLEM_MEDIA_TYPE: Final = "application/problem+json"
WWW_AUTHENTICATE: Final = 'Bearer error="invalid_token"'

# Members a problem always carries; an error's ``extra`` can never overwrite them.
_RESERVED: Final = frozenset({"type", "title", "status", "detail", "code", "instance"})
# Extra members that may travel to a caller: JSON pointers and reasons, never values, and
# how many errors the gRPC carrier left out (core/rpc/errors.py bounds what it carries).
_SAFE_EXTRAS: Final = frozenset({"errors", OMITTED_KEY})

log = logging.getLogger("coordinator.gateway")


class JsonProblemResponse(JSONResponse):
    """A JSON response with the problem media type."""

    media_type = PROBLEM_MEDIA_TYPE


def correlation_id() -> str:
    """A random id that links a 500 answer to its log line."""
    return secrets.token_hex(8)


def instance_for(path: str, public_url: str | None) -> str:
    """The ``instance`` member: the public URL of the request's path when one is configured."""
    if public_url:
        return public_url.rstrip("/") + path
    return path


def problem_document(
    code: Code,
    detail: str,
    *,
    instance: str | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The problem members for ``code``, which must have an HTTP status."""
    if code.status is None:
        raise ValueError(f"{code} is not an HTTP problem code")
    document: dict[str, Any] = {
        "type": code.type_uri,
        "title": code.info.title,
        "status": code.status,
        "detail": detail,
        "code": code.value,
    }
    if instance is not None:
        document["instance"] = instance
    for name, value in (extra or {}).items():
        if name in _SAFE_EXTRAS and name not in _RESERVED:
            document[name] = value
    return document


def problem_response(
    code: Code,
    detail: str,
    *,
    instance: str | None,
    extra: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An ``application/problem+json`` response for ``code``, which must have an HTTP status."""
    document = problem_document(code, detail, instance=instance, extra=extra)
    merged = dict(headers or {})
    if code is Code.AUTHENTICATION_REFUSED:
        merged["WWW-Authenticate"] = WWW_AUTHENTICATE
    return JsonProblemResponse(document, status_code=document["status"], headers=merged)


def internal_response(correlation: str, *, instance: str | None) -> Response:
    """The bare 500 problem: nothing about the cause, only the id that finds the log line."""
    document = {
        "type": Code.INTERNAL.type_uri,
        "title": Code.INTERNAL.info.title,
        "status": Code.INTERNAL.status,
        "detail": "the request could not be completed; quote the correlation id to the operator",
        "code": Code.INTERNAL.value,
        "correlationId": correlation,
    }
    if instance is not None:
        document["instance"] = instance
    return JsonProblemResponse(document, status_code=500)


def _instance(request: Request) -> str:
    public_url = getattr(request.app.state, "public_url", None)
    return instance_for(request.url.path, public_url if isinstance(public_url, str) else None)


def error_response(error: CoordinatorError, instance: str | None) -> Response:
    """The response for a domain error; ``internal`` and non-HTTP codes become a logged 500."""
    if error.code.status is None or error.code is Code.INTERNAL:
        correlation = correlation_id()
        # The code and detail come from our own components, never from the caller.
        log.error(
            "refusal %s (%s) answered as internal [correlation %s]",
            error.code,
            error.detail,
            correlation,
        )
        return internal_response(correlation, instance=instance)
    return problem_response(error.code, error.detail, instance=instance, extra=error.extra)


async def coordinator_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette handler for :class:`CoordinatorError` and its subclasses."""
    if not isinstance(exc, CoordinatorError):  # pragma: no cover - registered for this class
        raise exc
    return error_response(exc, _instance(request))


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette handler for the router's own 404 and 405 (and any other HTTPException)."""
    if not isinstance(exc, HTTPException):  # pragma: no cover - registered for this class
        raise exc
    instance = _instance(request)
    if exc.status_code == 404:
        return problem_response(Code.NOT_FOUND, "no route matches this path", instance=instance)
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow")
        return problem_response(
            Code.METHOD_NOT_ALLOWED,
            "this route does not accept the request's method",
            instance=instance,
            headers={"Allow": allow} if allow else None,
        )
    if exc.status_code == 400:
        return problem_response(Code.REQUEST_INVALID, "the request is malformed", instance=instance)
    correlation = correlation_id()
    log.error("unexpected HTTP %s from the router [correlation %s]", exc.status_code, correlation)
    return internal_response(correlation, instance=instance)
