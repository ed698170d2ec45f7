"""Product adapters, one module per connection type (CONTRACT §14)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from core.execution.adapters import breg_action, casework, messaging, scheduling
from core.execution.adapters.base import (
    AuthorizedRequest,
    CatalogueAdapter,
    ProductRequest,
    RequestUnbuildable,
    encode_body,
)

ADAPTERS: Mapping[str, CatalogueAdapter] = MappingProxyType(
    {
        module.ADAPTER.connection_type: module.ADAPTER
        for module in (messaging, scheduling, breg_action, casework)
    }
)


def adapter_for(connection_type: str) -> CatalogueAdapter:
    """The adapter of ``connection_type`` (KeyError for an unknown type)."""
    return ADAPTERS[connection_type]


__all__ = [
    "ADAPTERS",
    "AuthorizedRequest",
    "CatalogueAdapter",
    "ProductRequest",
    "RequestUnbuildable",
    "adapter_for",
    "encode_body",
]
