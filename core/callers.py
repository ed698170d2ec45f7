"""The verified caller of a request, as every component sees it.

The gateway verifies the access token and passes the caller on (``pb.Caller`` over gRPC);
the gateway's policies are found by the caller's client, and admission records the
caller's principal ``(iss, sub)`` on the runs it starts. A run a signed event starts
belongs to the principal ``(EVENT_ISSUER, <source>)`` and has no client.
"""

from __future__ import annotations

from typing import Final, Protocol

EVENT_ISSUER: Final = "event-source"
"""The principal ``iss`` of every run a signed event starts (CONTRACT §9.6)."""


class Caller(Protocol):
    """A verified caller: ``gateway.auth.VerifiedToken`` and ``pb.Caller`` are ones."""

    @property
    def iss(self) -> str:
        """The token's issuer; with ``sub`` the principal."""
        ...

    @property
    def sub(self) -> str:
        """The token's subject."""
        ...

    @property
    def client_id(self) -> str:
        """The verified OAuth client (empty for an event source)."""
        ...
