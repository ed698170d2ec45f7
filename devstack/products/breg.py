"""Base Registry Engine (BReg) stand-in: register actions and proposals (CONTRACT §14).

``POST /v1/registers/{profile}/actions`` answers 201 ``{actionId}``;
``POST /v1/registers/{profile}/proposals`` answers 201 ``{proposalId}``. BReg keeps no
receipts the coordinator can read, so reconcile cannot settle these calls; repeated keys are
honoured within 24 hours. Proposals are only recorded: nothing here applies one.
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
    new_id,
    serve_main,
    settings_from_json,
)


class BregStandIn(StandIn):
    """The BReg product as the coordinator sees it."""

    connection_type = "breg-action"
    default_scopes = MappingProxyType(
        {"submit-action": "actions:write", "create-proposal": "proposals:write"}
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actions: dict[str, dict[str, Any]] = {}
        self.proposals: dict[str, dict[str, Any]] = {}

    def product_routes(self) -> list[BaseRoute]:
        action = self.operations["submit-action"]
        proposal = self.operations["create-proposal"]
        return [
            Route(action.path, self._submit_action, methods=[action.method]),
            Route(proposal.path, self._create_proposal, methods=[proposal.method]),
        ]

    async def _submit_action(self, request: Request) -> Response:
        return await self.command(request, "submit-action", self._record_action)

    async def _create_proposal(self, request: Request) -> Response:
        return await self.command(request, "create-proposal", self._record_proposal)

    def _record_action(
        self, caller: Caller, profile: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        action_id = new_id("act")
        self.actions[action_id] = {"register": profile, "clientId": caller.client_id, **body}
        return {"actionId": action_id}

    def _record_proposal(
        self, caller: Caller, profile: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        proposal_id = new_id("prop")
        self.proposals[proposal_id] = {
            "register": profile,
            "clientId": caller.client_id,
            "state": "open",
            **body,
        }
        return {"proposalId": proposal_id}


def build(document: Mapping[str, Any], folder: Path) -> BregStandIn:
    """A stand-in from its JSON settings (see :func:`settings_from_json`)."""
    return BregStandIn(settings_from_json(document))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the BReg stand-in under uvicorn."""
    return serve_main("python -m devstack.products.breg", build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
