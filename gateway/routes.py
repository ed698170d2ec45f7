"""The HTTP routes of CONTRACT §8.2 and what each one checks, in order.

Every route but ``/ready``, ``/v1/review-completions`` and ``/v1/events`` first verifies the
bearer token (401 without a usable one, 503 when the verifier holds no keys). From then on
the request is an audited action (:mod:`gateway.auditing`): the policy check
(:mod:`gateway.policies`) and ownership of the run, then validation of the body and the
parameters, then the component's answer, all end in one audit record before the answer
leaves. The policy comes before the body, so a caller who may not act learns nothing about
what the body should have been. ``HEAD`` is answered only on ``/ready``: on the other
``GET`` routes it would act (and be audited) for an answer nobody reads, so it is 405.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from core.actions import ACTIONS, DEPLOYMENT, RUN, Action, operator_actions
from core.codes import Code
from core.config.model import Policy
from core.errors import CoordinatorError
from gateway import bodies, bulk
from gateway.auditing import AuditNote, audited
from gateway.auth import AuthenticationRefused, TokenVerifier, VerifiedToken
from gateway.backend import Backend, BackendCaller, ListQuery
from gateway.health import summarize
from gateway.metrics import CONTENT_TYPE, HttpMetrics, merge, readiness_text
from gateway.policies import (
    allow_action,
    authorize_deployment,
    authorize_run,
    authorize_start,
    is_operator,
)
from gateway.policies import list_scope as policy_list_scope

log = logging.getLogger("coordinator.gateway")

Hook = Callable[[Request, "GatewayContext"], Awaitable[Response]]
"""A handler for the unauthenticated producer routes (review completions, signed events)."""

UUID_TEXT: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""What a run id in a path must look like to be looked up (and audited); anything else is a
missing run at once. Looser than :func:`core.derive.is_run_id` on purpose: the audit record
keeps any well-formed UUID an operator asked about."""


@dataclass(frozen=True)
class GatewayContext:
    """Everything the routes use; one per running gateway."""

    backend: Backend
    """The components behind the gateway."""
    verifier: TokenVerifier
    """Verifies callers' access tokens."""
    policies: Mapping[str, Policy]
    """``deployment.authentication.policies`` by client id."""
    public_url: str | None = None
    """``deployment.listener.publicUrl``, for problem ``instance`` members."""
    http_metrics: HttpMetrics = field(default_factory=HttpMetrics)
    """The main listener's request counter (read by the metrics listener)."""
    completions: Hook | None = None
    """Handler of ``POST /v1/review-completions``; ``None`` refuses every event."""
    events: Hook | None = None
    """Handler of ``POST /v1/events``; ``None`` refuses every event."""


def context(request: Request) -> GatewayContext:
    """The gateway context the app was built with."""
    found = request.app.state.gateway
    if not isinstance(found, GatewayContext):  # pragma: no cover - set by the app factory
        raise TypeError("the app has no gateway context")
    return found


async def authenticate(ctx: GatewayContext, request: Request) -> VerifiedToken:
    """The verified caller of ``request``; refusals carry no token material."""
    values = request.headers.getlist("authorization")
    try:
        if len(values) > 1:
            raise AuthenticationRefused("repeated Authorization header")
        return await ctx.verifier.verify_authorization(values[0] if values else None)
    except AuthenticationRefused as exc:
        log.info("access token refused: %s", exc.reason)
        raise


def backend_caller(ctx: GatewayContext, token: VerifiedToken) -> BackendCaller:
    """The caller as the components see it."""
    return BackendCaller(
        iss=token.iss,
        sub=token.sub,
        client_id=token.client_id,
        operator=is_operator(ctx.policies, token),
    )


def _json(document: Mapping[str, Any], status: int = 200, **headers: str) -> Response:
    return JSONResponse(dict(document), status_code=status, headers=headers or None)


async def _authorize_run(
    ctx: GatewayContext, token: VerifiedToken, action: str, run_id: str, note: AuditNote
) -> None:
    # A string that cannot be a run id is a missing run; it never reaches the components.
    if UUID_TEXT.fullmatch(run_id):
        note.run_id = run_id
        owner = await ctx.backend.run_owner(run_id)
    else:
        owner = None
    authorize_run(ctx.policies, token, action, owner)


# ------------------------------------------------------------------------- unauthenticated


async def ready(request: Request) -> Response:
    """``GET /ready``."""
    ctx = context(request)
    readiness = summarize(await ctx.backend.checks(), ctx.verifier.ready)
    if readiness.ready:
        return _json({"ready": True})
    return _json({"ready": False, "reasons": list(readiness.reasons)}, 503)


async def review_completions(request: Request) -> Response:
    """``POST /v1/review-completions``: refused until a completion handler is installed."""
    ctx = context(request)
    if ctx.completions is None:
        raise CoordinatorError(Code.AUTHENTICATION_REFUSED, "the completion is not accepted")
    return await ctx.completions(request, ctx)


async def events(request: Request) -> Response:
    """``POST /v1/events``: refused until an event handler is installed."""
    ctx = context(request)
    if ctx.events is None:
        raise CoordinatorError(Code.AUTHENTICATION_REFUSED, "the event is not accepted")
    return await ctx.events(request, ctx)


async def metrics(request: Request) -> Response:
    """``GET /metrics`` (metrics listener only)."""
    ctx = context(request)
    readiness = summarize(await ctx.backend.checks(), ctx.verifier.ready)
    texts = await ctx.backend.metrics()
    document = merge([ctx.http_metrics.render(), readiness_text(readiness), *texts])
    return PlainTextResponse(document, media_type=CONTENT_TYPE)


# --------------------------------------------------------------------------------- runs


async def start(request: Request) -> Response:
    """``POST /v1/workflows/{workflowId}/runs``."""
    ctx = context(request)
    token = await authenticate(ctx, request)
    workflow_id = request.path_params["workflowId"]
    async with audited(ctx.backend, token, "start") as note:
        authorize_start(ctx.policies, token, workflow_id)
        key = bodies.idempotency_key(request.headers)
        input_json = bodies.start_input(await bodies.read_json_object(request))
        result = await ctx.backend.start(backend_caller(ctx, token), workflow_id, key, input_json)
        note.run_id = result.run_id
    if result.created:
        return _json(result.status, 201, Location=f"/v1/runs/{result.run_id}")
    return _json(result.status)


async def status(request: Request) -> Response:
    """``GET /v1/runs/{runId}``."""
    ctx = context(request)
    token = await authenticate(ctx, request)
    run_id = request.path_params["runId"]
    async with audited(ctx.backend, token, "status") as note:
        await _authorize_run(ctx, token, "status", run_id, note)
        document = await ctx.backend.status(run_id)
    return _json(document)


async def inspection(request: Request) -> Response:
    """``GET /v1/runs/{runId}/inspection``."""
    ctx = context(request)
    token = await authenticate(ctx, request)
    run_id = request.path_params["runId"]
    async with audited(ctx.backend, token, "inspect") as note:
        await _authorize_run(ctx, token, "inspect", run_id, note)
        document = await ctx.backend.inspect(run_id)
    return _json(document)


async def list_runs(request: Request) -> Response:
    """``GET /v1/runs``."""
    ctx = context(request)
    token = await authenticate(ctx, request)
    async with audited(ctx.backend, token, "list"):
        params = bodies.list_parameters(request.query_params)
        scope = policy_list_scope(ctx.policies, token, params.workflow)
        document = await ctx.backend.list(
            ListQuery(
                workflows=scope.workflows,
                principal=scope.principal,
                attention=params.attention,
                state=params.state,
                limit=params.limit,
                cursor=params.cursor,
                order=params.order,
                step=params.step,
                cause=params.cause,
                updated_before=params.updated_before,
                run_id_prefix=params.run_id_prefix,
                start=(
                    (token.iss, params.start_sub or token.sub, params.workflow, params.start_key)
                    if params.start_key is not None and params.workflow is not None
                    else None
                ),
                event=(
                    (params.event_source, params.event_id)
                    if params.event_source is not None and params.event_id is not None
                    else None
                ),
            )
        )
    return _json(document)


def _run_action(action: Action) -> Callable[[Request], Awaitable[Response]]:
    assert action.body is not None  # an operator's action on a run takes a reason
    check = action.body

    async def handler(request: Request) -> Response:
        ctx = context(request)
        token = await authenticate(ctx, request)
        run_id = request.path_params["runId"]
        async with audited(ctx.backend, token, action.name) as note:
            # The policy and the run's owner first: a caller who may not act on the run
            # learns nothing about what its body should have been (403/404, never 400/413).
            await _authorize_run(ctx, token, action.name, run_id, note)
            reason = check(await bodies.read_json_object(request)).reference
            assert reason is not None  # a run action's body is its reason
            note.reason = reason
            document = await ctx.backend.run_action(
                backend_caller(ctx, token), run_id, action.name, reason
            )
        return _json(document)

    handler.__name__ = f"run_{action.name.replace('-', '_')}"
    return handler


def _bulk_action(action: Action) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/runs/bulk/{action}`` (:mod:`gateway.bulk`)."""

    async def handler(request: Request) -> Response:
        ctx = context(request)
        token = await authenticate(ctx, request)
        async with audited(ctx.backend, token, bulk.audit_action(action.name)) as note:
            # The policy must list the action before the body is read, as for one run.
            allow_action(ctx.policies, token, action.name)
            checked = bodies.bulk_request(await bodies.read_json_object(request))
            note.reason = checked.reason
            scope = policy_list_scope(ctx.policies, token, checked.filter.workflow, action.name)
            run_ids = await bulk.choose(ctx.backend, scope, checked)
            document: dict[str, Any] = {"dryRun": checked.dry_run, "matched": len(run_ids)}
            if checked.dry_run:
                document["runIds"] = run_ids
            else:
                document["results"] = await bulk.act_on_each(
                    ctx.backend,
                    token,
                    backend_caller(ctx, token),
                    action.name,
                    checked.reason,
                    run_ids,
                )
        return _json(document)

    handler.__name__ = f"bulk_{action.name.replace('-', '_')}"
    return handler


# ----------------------------------------------------------------------------- operator


async def doctor(request: Request) -> Response:
    """``GET /v1/operator/doctor``."""
    ctx = context(request)
    token = await authenticate(ctx, request)
    async with audited(ctx.backend, token, "doctor"):
        authorize_deployment(ctx.policies, token, "doctor")
        document = await ctx.backend.doctor()
    return _json(document)


def _operator_action(action: Action) -> Callable[[Request], Awaitable[Response]]:
    assert action.body is not None  # (only the actions with a body are routed here)
    check = action.body

    async def handler(request: Request) -> Response:
        ctx = context(request)
        token = await authenticate(ctx, request)
        async with audited(ctx.backend, token, action.name) as note:
            authorize_deployment(ctx.policies, token, action.name)
            checked = check(await bodies.read_json_object(request))
            note.reason = checked.reference
            document = await ctx.backend.operator_action(
                backend_caller(ctx, token), action.name, checked.members
            )
        return _json(document)

    handler.__name__ = f"operator_{action.name.replace('-', '_')}"
    return handler


def _acting(path: str, endpoint: Callable[[Request], Awaitable[Response]], method: str) -> Route:
    """A route that acts for a caller (audited). Starlette answers ``HEAD`` on every ``GET``
    route by running the ``GET`` handler; here that would read state and write an audit
    record for a request whose answer nobody sees, so ``HEAD`` is left out (405)."""
    route = Route(path, endpoint, methods=[method])
    assert route.methods is not None
    route.methods.discard("HEAD")
    return route


def _route(name: str, endpoint: Callable[[Request], Awaitable[Response]]) -> Route:
    """The route of action ``name``, at its path and method in :data:`ACTIONS`."""
    action = ACTIONS[name]
    return _acting(action.route, endpoint, action.method)


def main_routes() -> list[Route]:
    """The routes of the main listener (never ``/metrics``)."""
    routes = [
        Route("/ready", ready, methods=["GET"]),
        _route("start", start),
        _acting("/v1/runs", list_runs, "GET"),
    ]
    # Bulk actions before one run's: /v1/runs/bulk/cancel is never a cancel of run "bulk".
    routes += [
        _acting(bulk.BULK_PATH.replace("{action}", action.name), _bulk_action(action), "POST")
        for action in operator_actions(RUN)
    ]
    routes += [
        _route("status", status),
        _route("inspect", inspection),
    ]
    # The operator's actions with a body (core/actions.py): a run's, then the deployment's.
    routes += [
        _acting(action.route, _run_action(action), action.method)
        for action in operator_actions(RUN)
    ]
    routes.append(_route("doctor", doctor))
    routes += [
        _acting(action.route, _operator_action(action), action.method)
        for action in operator_actions(DEPLOYMENT)
    ]
    routes += [
        Route("/v1/review-completions", review_completions, methods=["POST"]),
        Route("/v1/events", events, methods=["POST"]),
    ]
    return routes


def metrics_routes() -> list[Route]:
    """The routes of the metrics listener: ``/metrics`` only."""
    return [Route("/metrics", metrics, methods=["GET"])]
