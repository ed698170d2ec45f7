"""Messaging stand-in: send-notice, and receipts by idempotency key (CONTRACT §14).

``POST /v1/profiles/{profile}/messages`` answers 202 ``{messageId, acceptedAt}``;
``GET /v1/profiles/{profile}/receipts/{key}`` answers the same body for a processed key,
404 ``receipt.not-found`` for a key never received, 410 ``receipt.expired`` past the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from devstack.products.common import (
    Caller,
    StandIn,
    iso,
    new_id,
    serve_main,
    settings_from_json,
)


class MessagingStandIn(StandIn):
    """The Messaging product as the coordinator sees it."""

    connection_type = "messaging"
    default_scopes = MappingProxyType({"send-notice": "messages:send", "receipts": "receipts:read"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages: dict[str, dict[str, Any]] = {}
        """Accepted notices by messageId (profile, template, recipientRef, parameters)."""

    def product_routes(self) -> list[BaseRoute]:
        send = self.operations["send-notice"]
        return [
            Route(send.path, self._send_notice, methods=[send.method]),
            Route(str(send.receipt_path), self.receipt, methods=["GET"]),
        ]

    async def _send_notice(self, request: Request) -> Response:
        return await self.command(request, "send-notice", self._accept)

    def _accept(self, caller: Caller, profile: str, body: Mapping[str, Any]) -> dict[str, Any]:
        message_id = new_id("msg")
        self.messages[message_id] = {"profile": profile, **body}
        return {"messageId": message_id, "acceptedAt": iso(self.clock())}


def build(document: Mapping[str, Any], folder: Path) -> MessagingStandIn:
    """A stand-in from its JSON settings (see :func:`settings_from_json`)."""
    return MessagingStandIn(settings_from_json(document))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Messaging stand-in under uvicorn."""
    return serve_main("python -m devstack.products.messaging", build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
