"""Scheduling stand-in: book-slot, and receipts by idempotency key (CONTRACT §14).

``POST /v1/profiles/{profile}/bookings`` answers 201 ``{bookingId}``. A receipt repeats the
original answer with the instant it was accepted: ``{bookingId, acceptedAt}``. A slot can be
booked once: booking a taken slot under a new key is refused with 409 ``slot.taken``.
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
    Problem,
    StandIn,
    new_id,
    serve_main,
    settings_from_json,
)


class SchedulingStandIn(StandIn):
    """The Scheduling product as the coordinator sees it."""

    connection_type = "scheduling"
    default_scopes = MappingProxyType({"book-slot": "bookings:write", "receipts": "receipts:read"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bookings: dict[str, dict[str, Any]] = {}
        """Bookings by bookingId."""
        self._taken: dict[tuple[str, str], str] = {}

    def product_routes(self) -> list[BaseRoute]:
        book = self.operations["book-slot"]
        return [
            Route(book.path, self._book_slot, methods=[book.method]),
            Route(str(book.receipt_path), self.receipt, methods=["GET"]),
        ]

    async def _book_slot(self, request: Request) -> Response:
        return await self.command(request, "book-slot", self._book)

    def _book(self, caller: Caller, profile: str, body: Mapping[str, Any]) -> dict[str, Any]:
        slot = (profile, str(body["slotRef"]))
        if slot in self._taken:
            # Refused before anything is kept, so the key stays free (as in a real product
            # that validates before it commits).
            raise Problem(409, "slot.taken", "the slot is already booked")
        booking_id = new_id("bkg")
        self._taken[slot] = booking_id
        self.bookings[booking_id] = {"profile": profile, **body}
        return {"bookingId": booking_id}


def build(document: Mapping[str, Any], folder: Path) -> SchedulingStandIn:
    """A stand-in from its JSON settings (see :func:`settings_from_json`)."""
    return SchedulingStandIn(settings_from_json(document))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Scheduling stand-in under uvicorn."""
    return serve_main("python -m devstack.products.scheduling", build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
