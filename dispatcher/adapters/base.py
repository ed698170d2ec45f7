"""The shared shape of a product request, built from the operation catalogue (CONTRACT §14).

Every connection type speaks the same way: ``POST`` (or the catalogued method) to the
catalogued route under the run's recorded ``baseUrl``, with ``{profile}`` filled from the
binding, a JSON body made of the mapped command plus the fields the catalogue says come
from the connection (Casework's ``producer``), and the three headers every product expects:
``Authorization: Bearer``, ``Idempotency-Key`` and ``Content-Type: application/json``.
The per-type modules choose which catalogue entry they serve; nothing here knows a product.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.workflow.catalogue import Operation, connection_type, fill_path
from core.workflow.jsonvalue import pointer_token


@dataclass(frozen=True)
class Binding:
    """The connection settings a run recorded at admission (one ``binding`` row)."""

    connection: str
    connection_type: str
    base_url: str
    client_id: str
    issuer: str
    scopes: tuple[str, ...]
    audience: str
    profile: str
    producer: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Binding:
        """The binding of a ``dispatcher_binding_read`` row."""
        return cls(
            connection=str(row["connection"]),
            connection_type=str(row["connection_type"]),
            base_url=str(row["base_url"]),
            client_id=str(row["client_id"]),
            issuer=str(row["issuer"]),
            scopes=tuple(row["scopes"]),
            audience=str(row["audience"]),
            profile=str(row["profile"]),
            producer=None if row["producer"] is None else str(row["producer"]),
        )

    def setting(self, name: str) -> str | None:
        """A connection setting by its runtime-file key (``producer``, ``profile``)."""
        return {"producer": self.producer, "profile": self.profile, "baseUrl": self.base_url}.get(
            name
        )


class RequestUnbuildable(ValueError):
    """The request cannot be built; ``pointer`` names the command field at fault."""

    def __init__(self, pointer: str, reason: str) -> None:
        super().__init__(f"{pointer or '/'}: {reason}")
        self.pointer = pointer
        self.reason = reason


@dataclass(frozen=True)
class ProductRequest:
    """One request ready to send. The token is kept out of ``repr``."""

    method: str
    url: str
    body: bytes = field(repr=False)
    command_key: str
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
        token: str,
    ) -> ProductRequest:
        """The request that sends ``command`` under ``command_key`` with ``token``."""
        return ProductRequest(
            method=op.method,
            url=self.url(op, binding),
            body=encode_body(self.body(op, binding, command)),
            command_key=command_key,
            token=token,
        )
