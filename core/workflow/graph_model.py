"""A workflow's graph as data: its nodes and edges, which :mod:`core.workflow.graph` builds
and writes, and :mod:`core.workflow.graph_layout` places. Kept apart from both so that
neither imports the other for its types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    """A step, or the ``start`` / ``on cancel`` marker."""

    id: str
    kind: str
    """The step type (``call``, ``choose``, ``wait-until``, ``wait-for``, ``finish``), or
    ``start`` / ``cancel`` for the markers."""
    title: str
    detail: str


@dataclass(frozen=True)
class Edge:
    """One way a run moves on from ``source`` to ``target``."""

    source: str
    target: str
    kind: str
    """``start``, ``next``, ``choose``, ``otherwise``, ``onRefused``, ``onTimeout`` or
    ``onCancel``."""
    label: str
    branch: int | None = None

    @property
    def id(self) -> str:
        """Unique in a graph: a step has at most one edge of each kind (branches numbered)."""
        suffix = f"-{self.branch}" if self.branch is not None else ""
        return f"edge-{self.source}-{self.kind}{suffix}"


@dataclass(frozen=True)
class Graph:
    """A workflow's nodes (markers first, then steps in source order) and edges."""

    workflow_id: str
    version: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
