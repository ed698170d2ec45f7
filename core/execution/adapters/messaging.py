"""Requests to Messaging (connection type ``messaging``), as the catalogue describes them."""

from __future__ import annotations

from core.execution.adapters.base import CatalogueAdapter

ADAPTER = CatalogueAdapter("messaging")
