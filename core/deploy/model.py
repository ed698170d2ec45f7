"""The records plan, apply, deployment-status and startup hand back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["install", "replace", "unchanged", "remove"]


@dataclass(frozen=True)
class PlanEntry:
    """What apply does (or did) to one workflow's active package."""

    id: str
    """The workflow id."""
    action: Action
    """``install``, ``replace``, ``unchanged`` or ``remove``."""
    active_digest: str | None
    """The digest active before; ``None`` for an install."""
    planned_digest: str | None
    """The digest active after; ``None`` for a removal."""

    def to_json(self) -> dict[str, Any]:
        """One element of ``plan --output json``'s ``workflows``."""
        return {
            "id": self.id,
            "action": self.action,
            "activeDigest": self.active_digest,
            "plannedDigest": self.planned_digest,
        }


@dataclass(frozen=True)
class ActivePackage:
    """A workflow's active package as the database keeps it."""

    workflow_id: str
    """The workflow id."""
    digest: str
    """``sha256:`` + 64 hex digits."""
    version: str
    """The workflow's semantic version."""
    manifest_bytes: bytes
    """The canonical manifest, byte for byte."""
    source_bytes: bytes
    """``workflow.yaml``, byte for byte."""
    activated_serial: int
    """The activation serial that made this package active."""


@dataclass(frozen=True)
class Activation:
    """A verified activation: what a component may serve."""

    namespace: str
    """The deployment's namespace."""
    database_id: str
    """The recorded databaseId (equal to the runtime file's)."""
    schema_version: int
    """Always 4 once verified."""
    serial: int
    """The activation serial; services compare it later to notice a newer apply."""
    packages: Mapping[str, ActivePackage]
    """Active packages by workflow id, ordered by id."""


@dataclass(frozen=True)
class DeploymentStatus:
    """The ``deployment-status`` report."""

    schema_version: int
    """The verified schema version (4)."""
    database_id: str
    """The verified databaseId."""
    workflows: tuple[tuple[str, str], ...]
    """(workflow id, active digest), ordered by id."""

    def to_json(self) -> dict[str, Any]:
        """The ``deployment-status --output json`` document."""
        return {
            "status": "checked",
            "schemaVersion": self.schema_version,
            "databaseId": self.database_id,
            "workflows": [{"id": wid, "digest": digest} for wid, digest in self.workflows],
        }
