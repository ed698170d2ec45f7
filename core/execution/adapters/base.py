"""The shared shape of a product request, built from the operation catalogue (CONTRACT §14).

Every connection type speaks the same way: ``POST`` (or the catalogued method) to the
catalogued route under the run's recorded ``baseUrl``, with ``{profile}`` filled from the
binding, a JSON body made of the mapped command plus the fields the catalogue says come
from the connection (Casework's ``producer``), and the three headers every product expects:
``Authorization: Bearer``, ``Idempotency-Key`` and ``Content-Type: application/json``.
The per-type modules choose which catalogue entry they serve; nothing here knows a product.

A request is built, and so checked, once and without a token: a command that cannot become
a request fails before any token is asked for. The token is attached for each sending
(:meth:`ProductRequest.authorized`), so a resend after a 401 carries a fresh one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.bindings import Binding
from core.workflow.catalogue import Operation, connection_type, fill_path
from core.workflow.jsonvalue import pointer_token


class RequestUnbuildable(ValueError):
    """The request cannot be built; ``pointer`` names the command field at fault."""

    def __init__(self, pointer: str, reason: str) -> None:
        super().__init__(f"{pointer or '/'}: {reason}")
        self.pointer = pointer
        self.reason = reason


@dataclass(frozen=True)
class ProductRequest:
    """One request built from the catalogue, ready but for its access token."""

    method: str
    url: str
    body: bytes = field(repr=False)
    command_key: str

    def authorized(self, token: str) -> AuthorizedRequest:
        """This request carrying ``token``."""
        return AuthorizedRequest(self.method, self.url, self.body, self.command_key, token)


@dataclass(frozen=True)
class AuthorizedRequest(ProductRequest):
    """A request with its access token, ready to send. The token is kept out of ``repr``."""

    token: str = field(repr=False)

    @property
    def headers(self) -> dict[str, str]:
        """The request headers."""
        return {
            "Authorization": f"Bearer {self.token}",
            "Idempotency-Key": self.command_key,
            "Content-Type": "application/json",
            "Accept": "application/json",
        }


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The JSON bytes of a request body (compact, keys in a stable order)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()


@dataclass(frozen=True)
class CatalogueAdapter:
    """Builds the requests of one connection type from the catalogue."""

    connection_type: str

    def operation(self, name: str) -> Operation:
        """The catalogued operation ``name`` of this connection type."""
        kind = connection_type(self.connection_type)
        found = kind.operations.get(name) if kind else None
        if found is None:
            raise KeyError(f"{self.connection_type} has no operation {name!r}")
        return found

    def body(self, op: Operation, binding: Binding, command: Mapping[str, Any]) -> dict[str, Any]:
        """The request body: the command plus the fields the connection supplies."""
        body = dict(command)
        for body_field, setting in op.connection_fields:
            value = binding.setting(setting)
            if not value:
                raise RequestUnbuildable(
                    f"/{pointer_token(body_field)}",
                    f"the connection '{binding.connection}' has no {setting}",
                )
            body[body_field] = value
        return body

    def url(self, op: Operation, binding: Binding) -> str:
        """The absolute URL of ``op`` under the binding's base URL."""
        try:
            path = fill_path(op.path, {"profile": binding.profile})
        except ValueError:
            raise RequestUnbuildable(
                "", f"the connection '{binding.connection}' has a profile unfit for a URL path"
            ) from None
        return binding.base_url.rstrip("/") + path

    def build(
        self,
        op: Operation,
        binding: Binding,
        command: Mapping[str, Any],
        command_key: str,
    ) -> ProductRequest:
        """The request that sends ``command`` under ``command_key``.

        Raises :class:`RequestUnbuildable` when the binding cannot supply what it needs.
        """
        return ProductRequest(
            method=op.method,
            url=self.url(op, binding),
            body=encode_body(self.body(op, binding, command)),
            command_key=command_key,
        )
