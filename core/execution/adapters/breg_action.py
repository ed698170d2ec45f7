"""Requests to the Base Registry Engine (connection type ``breg-action``): actions and
proposals, as the catalogue describes them. The coordinator never applies a proposal."""

from __future__ import annotations

from core.execution.adapters.base import CatalogueAdapter

ADAPTER = CatalogueAdapter("breg-action")
