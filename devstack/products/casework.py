"""Casework stand-in: review requests, reviewers' decisions and completion events (CONTRACT §14).

Product routes:

- ``POST /v1/projects/{profile}/review-requests`` ``{producer, subjectRef, summary}`` → 201
  ``{reviewId}``. ``producer`` must be one of the project's trusted producers when those
  are configured (and, if the entry names a client, the caller must be that client).
- ``GET /v1/projects/{profile}/review-requests/{reviewId}`` → ``{status: pending}`` or
  ``{status: decided, decision: {outcome, decidedAt}}``.

Dev routes (no token):

- ``GET /dev/projects/{profile}/review-requests`` lists the project's reviews, so a person or
  a script can find the one to decide.
- ``POST /dev/projects/{profile}/review-requests/{reviewId}/decision`` ``{outcome}`` records a
  reviewer's decision, then sends a completion event when the producer has a destination.
- ``POST /dev/completions`` ``{enabled}`` switches completion events off or on.

A completion event is ``POST <destination url>`` with ``{"reviewId"}``, the destination's
bearer token and its ``registry-recipient-binding`` header. It is retried with exponential
backoff while the destination cannot be reached or answers 408, 429 or 5xx; other answers
end the delivery. ``python -m devstack.products.casework decide`` records a decision from a
shell.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from devstack.products.common import (
    Caller,
    Outcome,
    Problem,
    Sleep,
    StandIn,
    iso,
    json_body,
    new_id,
    serve_main,
    settings_from_json,
)

_log = logging.getLogger("devstack.casework")
_OUTCOME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_RETRY_STATUSES = frozenset({408, 425, 429})


@dataclass(frozen=True)
class CompletionDestination:
    """Where completion events for one trusted producer go."""

    url: str
    """The coordinator's ``/v1/review-completions`` URL."""
    token: str = dataclasses.field(repr=False)
    """The bearer token presented; never logged."""
    recipient_binding: str
    """Value of the ``registry-recipient-binding`` header."""


@dataclass(frozen=True)
class TrustedProducer:
    """One entry of a project's trusted producers."""

    client_id: str | None = None
    """If set, only this client may create requests as this producer."""
    completion: CompletionDestination | None = None
    """Where completion events go; None sends none."""


@dataclass(frozen=True)
class Decision:
    """A reviewer's decision."""

    outcome: str
    decided_at: str


@dataclass(frozen=True)
class Review:
    """One review request."""

    review_id: str
    project: str
    producer: str
    subject_ref: str
    summary: str
    client_id: str
    created_at: str
    decision: Decision | None = None

    def status_body(self) -> dict[str, Any]:
        """The product's answer to a result read."""
        if self.decision is None:
            return {"status": "pending"}
        return {
            "status": "decided",
            "decision": {"outcome": self.decision.outcome, "decidedAt": self.decision.decided_at},
        }


@dataclass
class Delivery:
    """Progress of one completion event (mutable: updated while it is retried)."""

    review_id: str
    attempts: int = 0
    delivered: bool = False
    gave_up: bool = False
    last_status: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``/dev/stats`` form."""
        return {
            "attempts": self.attempts,
            "delivered": self.delivered,
            "gaveUp": self.gave_up,
            "lastStatus": self.last_status,
        }


class CompletionSender:
    """Sends completion events in the background, with exponential backoff."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        sleep: Sleep = asyncio.sleep,
        enabled: bool = True,
        first_delay: float = 0.5,
        max_delay: float = 30.0,
        max_attempts: int = 40,
    ) -> None:
        self.http = http
        self.sleep = sleep
        self.enabled = enabled
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.max_attempts = max_attempts
        self.deliveries: dict[str, Delivery] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, review_id: str, destination: CompletionDestination) -> None:
        """Start delivering one event, unless events are switched off."""
        if not self.enabled:
            return
        delivery = Delivery(review_id)
        self.deliveries[review_id] = delivery
        task = asyncio.get_running_loop().create_task(self._deliver(delivery, destination))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait until every started delivery has finished (delivered or given up)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    async def aclose(self) -> None:
        """Stop deliveries still retrying."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _deliver(self, delivery: Delivery, destination: CompletionDestination) -> None:
        delay = self.first_delay
        headers = {
            "Authorization": f"Bearer {destination.token}",
            "registry-recipient-binding": destination.recipient_binding,
        }
        while delivery.attempts < self.max_attempts:
            delivery.attempts += 1
            try:
                answer = await self.http.post(
                    destination.url, json={"reviewId": delivery.review_id}, headers=headers
                )
            except httpx.HTTPError as exc:
                _log.info("completion event not delivered yet: %s", type(exc).__name__)
            else:
                delivery.last_status = answer.status_code
                if answer.is_success:
                    delivery.delivered = True
                    return
                if answer.status_code < 500 and answer.status_code not in _RETRY_STATUSES:
                    _log.warning("completion event refused with %d", answer.status_code)
                    delivery.gave_up = True
                    return
            if delivery.attempts < self.max_attempts:
                await self.sleep(delay)
                delay = min(delay * 2, self.max_delay)
        delivery.gave_up = True


class CaseworkStandIn(StandIn):
    """The Casework product as a review producer sees it."""

    connection_type = "casework-review-producer"
    default_scopes = MappingProxyType(
        {
            "create-review-request": "review-requests:write",
            "review-decision": "review-requests:read",
        }
    )

    def __init__(
        self,
        *args: Any,
        trusted_producers: Mapping[str, TrustedProducer] | None = None,
        completion_http: httpx.AsyncClient | None = None,
        completions_enabled: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.trusted_producers = trusted_producers
        """Trusted producers by key; None accepts any producer (and sends no events)."""
        self.reviews: dict[str, Review] = {}
        self.completions = CompletionSender(
            completion_http if completion_http is not None else self.http,
            sleep=self.sleep,
            enabled=completions_enabled,
        )

    def product_routes(self) -> list[BaseRoute]:
        create = self.operations["create-review-request"]
        result = self.results["review-decision"]
        return [
            Route(create.path, self._create_review, methods=[create.method]),
            Route(result.path, self._read_review, methods=[result.method]),
            Route(
                "/dev/projects/{profile}/review-requests", self._dev_list_reviews, methods=["GET"]
            ),
            Route(
                "/dev/projects/{profile}/review-requests/{reviewId}/decision",
                self._dev_decide,
                methods=["POST"],
            ),
            Route("/dev/completions", self._dev_completions, methods=["POST"]),
        ]

    def stats(self) -> dict[str, Any]:
        stats = super().stats()
        stats["completions"] = {
            review_id: delivery.to_json()
            for review_id, delivery in self.completions.deliveries.items()
        }
        stats["completionsEnabled"] = self.completions.enabled
        return stats

    async def aclose(self) -> None:
        await self.completions.aclose()
        await super().aclose()

    # -- product routes -----------------------------------------------------------------------

    async def _create_review(self, request: Request) -> Response:
        return await self.command(
            request, "create-review-request", self._create, check=self._check_producer
        )

    def _check_producer(self, caller: Caller, profile: str, body: Mapping[str, Any]) -> None:
        if self.trusted_producers is None:
            return
        entry = self.trusted_producers.get(str(body["producer"]))
        if entry is None or (entry.client_id is not None and entry.client_id != caller.client_id):
            raise Problem(403, "producer.untrusted", "/producer: not a trusted producer here")

    def _create(self, caller: Caller, profile: str, body: Mapping[str, Any]) -> dict[str, Any]:
        review = Review(
            review_id=new_id("rev"),
            project=profile,
            producer=str(body["producer"]),
            subject_ref=str(body["subjectRef"]),
            summary=str(body["summary"]),
            client_id=caller.client_id,
            created_at=iso(self.clock()),
        )
        self.reviews[review.review_id] = review
        return {"reviewId": review.review_id}

    async def _read_review(self, request: Request) -> Response:
        def produce(caller: Caller) -> Outcome:
            review = self._review(request)
            return Outcome(200, review.status_body())

        return await self.read(request, self.scopes["review-decision"], produce)

    def _review(self, request: Request) -> Review:
        review = self.reviews.get(str(request.path_params["reviewId"]))
        if review is None or review.project != request.path_params["profile"]:
            raise Problem(404, "review.not-found", "no such review request in this project")
        return review

    # -- dev routes ---------------------------------------------------------------------------

    async def _dev_list_reviews(self, request: Request) -> Response:
        project = str(request.path_params["profile"])
        reviews = [
            {
                "reviewId": r.review_id,
                "producer": r.producer,
                "subjectRef": r.subject_ref,
                "summary": r.summary,
                "createdAt": r.created_at,
                **r.status_body(),
            }
            for r in self.reviews.values()
            if r.project == project
        ]
        return JSONResponse({"reviews": reviews})

    async def _dev_decide(self, request: Request) -> Response:
        review = self._review(request)
        body = await _json_object(request)
        outcome = body.get("outcome")
        if not isinstance(outcome, str) or not _OUTCOME.match(outcome):
            raise Problem(400, "request.invalid", "/outcome: must be a lowercase word")
        if review.decision is not None:
            raise Problem(409, "review.already-decided", "the review was already decided")
        decided = dataclasses.replace(review, decision=Decision(outcome, iso(self.clock())))
        self.reviews[review.review_id] = decided
        destination = self._destination(decided.producer)
        if destination is not None:
            self.completions.send(decided.review_id, destination)
        return JSONResponse({"reviewId": decided.review_id, **decided.status_body()})

    def _destination(self, producer: str) -> CompletionDestination | None:
        entry = (self.trusted_producers or {}).get(producer)
        return entry.completion if entry is not None else None

    async def _dev_completions(self, request: Request) -> Response:
        body = await _json_object(request)
        enabled = body.get("enabled")
        if not isinstance(enabled, bool):
            raise Problem(400, "request.invalid", "/enabled: must be true or false")
        self.completions.enabled = enabled
        return JSONResponse({"enabled": enabled})


async def _json_object(request: Request) -> dict[str, Any]:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise Problem(400, "request.invalid", "the body must be a JSON object")
    return body


# ---------------------------------------------------------------------------------------------
# Settings and the command line


def trusted_producers_from_json(
    document: Mapping[str, Any], folder: Path
) -> dict[str, TrustedProducer] | None:
    """``trustedProducers`` of a settings file; a ``tokenFile`` is relative to ``folder``."""
    entries = document.get("trustedProducers")
    if entries is None:
        return None
    producers: dict[str, TrustedProducer] = {}
    try:
        for key, entry in entries.items():
            completion = entry.get("completion")
            destination = None
            if completion is not None:
                token_file = folder / str(completion["tokenFile"])
                token = token_file.read_text().removesuffix("\n")
                destination = CompletionDestination(
                    url=str(completion["url"]),
                    token=token,
                    recipient_binding=str(completion["recipientBinding"]),
                )
            client_id = entry.get("clientId")
            producers[str(key)] = TrustedProducer(
                client_id=None if client_id is None else str(client_id), completion=destination
            )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            "trustedProducers entries need completion.url, tokenFile and recipientBinding"
        ) from exc
    return producers


def build(document: Mapping[str, Any], folder: Path) -> CaseworkStandIn:
    """A stand-in from its JSON settings: the common keys plus ``trustedProducers`` and
    ``completionEvents`` (default true)."""
    return CaseworkStandIn(
        settings_from_json(document),
        trusted_producers=trusted_producers_from_json(document, folder),
        completions_enabled=bool(document.get("completionEvents", True)),
    )


def decide(url: str, project: str, review_id: str, outcome: str) -> dict[str, Any]:
    """Record a reviewer's decision on a running stand-in (the dev route); its answer."""
    answer = httpx.post(
        f"{url.rstrip('/')}/dev/projects/{project}/review-requests/{review_id}/decision",
        json={"outcome": outcome},
        timeout=10.0,
    )
    body: dict[str, Any] = answer.json()
    if answer.is_error:
        raise ValueError(f"{answer.status_code} {body.get('code', '')}".strip())
    return body


def main(argv: Sequence[str] | None = None) -> int:
    """``serve``, ``list`` and ``decide`` subcommands."""
    prog = "python -m devstack.products.casework"
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        return serve_main(f"{prog} serve", build, argv[1:])
    parser = argparse.ArgumentParser(prog=prog, description="Casework stand-in tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the stand-in (--settings FILE [--bind HOST:PORT])")
    listing = commands.add_parser("list", help="list a project's review requests")
    decision = commands.add_parser("decide", help="record a reviewer's decision")
    for sub in (listing, decision):
        sub.add_argument("--url", required=True, help="the stand-in's base URL")
        sub.add_argument("--project", required=True, help="the Casework project (profile)")
    decision.add_argument("--review-id", required=True)
    decision.add_argument("--outcome", required=True, help="e.g. approved or rejected")
    args = parser.parse_args(argv)
    try:
        if args.command == "decide":
            result = decide(args.url, args.project, args.review_id, args.outcome)
        else:
            answer = httpx.get(
                f"{args.url.rstrip('/')}/dev/projects/{args.project}/review-requests",
                timeout=10.0,
            )
            answer.raise_for_status()
            result = answer.json()
    except (httpx.HTTPError, ValueError) as exc:
        print(f"{prog}: {args.command} failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
