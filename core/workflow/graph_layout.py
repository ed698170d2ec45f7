"""A small layered (Sugiyama) layout for a workflow's graph, for :mod:`core.workflow.graph`.

A workflow is a DAG of at most 64 steps. The layout takes the classic four stages:
longest-path layers; long edges broken by placeholders, one per layer they pass (an edge's
label is the placeholder next to its source, so a label takes room like a box); barycentre
sweeps that reduce crossings, the best order kept; and per layer the x positions closest to
the neighbours' that keep the order and the gaps (isotonic regression, pool-adjacent-
violators). Edges run vertically inside a layer, through their own placeholder's slot or
their own box's width, and diagonally only in the empty strips between layers, so an edge
never crosses a box; ``tests/unit/test_workflow_graph.py`` checks that, and that no two boxes
overlap, on every example. Text is measured as monospace (the SVG asks for such a font).
Everything is iterated in source order, so the same graph gives the same coordinates.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from core.workflow.graph_model import Edge, Graph, Node

TITLE_PX, DETAIL_PX, LABEL_PX = 13, 11, 11
CHAR = 0.6  # a monospace glyph's advance, in ems: what text widths are measured with
NODE_H, MARKER_H = 46, 28
GAP_X, GAP_Y, MARGIN, LABEL_WRAP = 28, 34, 16, 34
POINT_W = 10


def text_width(text: str, px: int) -> float:
    return len(text) * px * CHAR


def wrap(text: str, width: int = LABEL_WRAP) -> list[str]:
    """Break a label at spaces into lines of about ``width`` characters (long words whole)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


# ------------------------------------------------------------------------------ the layout


@dataclass
class Box:
    """A laid-out node or edge label: its centre and size."""

    key: str
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0
    layer: int = 0
    node: Node | None = None
    edge: Edge | None = None
    """For a placeholder: the edge it carries (a label placeholder has lines)."""
    lines: list[str] = field(default_factory=list)

    @property
    def left(self) -> float:
        return self.x - self.w / 2

    @property
    def top(self) -> float:
        return self.y - self.h / 2


@dataclass(frozen=True)
class Layout:
    """Where everything goes: the boxes (nodes and labels), each edge's polyline, the size."""

    boxes: tuple[Box, ...]
    paths: Mapping[str, tuple[tuple[float, float], ...]]
    width: float
    height: float
    legend: tuple[float, float, float, float]
    """The legend's left, top, width and height."""


def _layers(graph: Graph) -> dict[str, int]:
    """Longest-path layers; an edge with a label spans at least two (its label between)."""
    preds: dict[str, list[Edge]] = {n.id: [] for n in graph.nodes}
    succs: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for e in graph.edges:
        preds[e.target].append(e)
        succs[e.source].append(e.target)
    indegree = {n: len(p) for n, p in preds.items()}
    ready = [n.id for n in graph.nodes if indegree[n.id] == 0]
    layer: dict[str, int] = {}
    while ready:
        current = ready.pop(0)
        layer[current] = max(
            (layer[e.source] + (2 if e.label else 1) for e in preds[current]), default=0
        )
        for target in succs[current]:
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)
    return layer


def _crossings(rows: list[list[Box]], links: list[tuple[str, str]]) -> int:
    position = {b.key: (b.layer, i) for row in rows for i, b in enumerate(row)}
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for a, b in links:
        (la, ia), (_, ib) = position[a], position[b]
        by_layer.setdefault(la, []).append((ia, ib))
    total = 0
    for pairs in by_layer.values():
        for i, (a1, b1) in enumerate(pairs):
            for a2, b2 in pairs[i + 1 :]:
                total += (a1 - a2) * (b1 - b2) < 0
    return total


def _isotonic(desired: list[float], gaps: list[float], weights: list[float]) -> list[float]:
    """The x positions closest (weighted least squares) to ``desired`` that keep each
    ``x[i] - x[i-1] >= gaps[i]``: pool-adjacent-violators on the gap-shifted targets."""
    offsets, acc = [], 0.0
    for g in gaps:
        acc += g
        offsets.append(acc)
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for d, o, w in zip(desired, offsets, weights, strict=True):
        blocks.append([d - o, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    shifted = [m for m, _, c in blocks for _ in range(int(c))]
    return [s + o for s, o in zip(shifted, offsets, strict=True)]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _node_box(node: Node) -> Box:
    if node.kind in ("start", "cancel"):
        width = text_width(node.title, DETAIL_PX) + 28
        return Box(node.id, w=max(width, 64), h=MARKER_H, node=node)
    width = max(text_width(node.title, TITLE_PX), text_width(node.detail, DETAIL_PX)) + 24
    extra = {"choose": 24.0, "wait-until": 16.0, "finish": 16.0}.get(node.kind, 0.0)
    return Box(node.id, w=max(width + extra, 110), h=NODE_H, node=node)


def layout(graph: Graph, legend_size: tuple[float, float] = (0.0, 0.0)) -> Layout:
    """Lay the graph out top to bottom, a legend of ``legend_size`` to its right; every
    coordinate is rounded to 0.1 px."""
    layer = _layers(graph)
    boxes: dict[str, Box] = {}
    for node in graph.nodes:
        boxes[node.id] = _node_box(node)
        boxes[node.id].layer = layer[node.id]
    chains: dict[str, list[str]] = {}
    links: list[tuple[str, str]] = []
    for e in graph.edges:
        chain = [e.source]
        for step in range(layer[e.source] + 1, layer[e.target]):
            key = f"{e.id}#{step}"
            if e.label and step == layer[e.source] + 1:
                lines = wrap(e.label)
                width = max(text_width(line, LABEL_PX) for line in lines) + 10
                box = Box(key, w=width, h=len(lines) * 14 + 6, edge=e, lines=lines)
            else:
                box = Box(key, w=POINT_W, h=0, edge=e)
            box.layer = step
            boxes[key] = box
            chain.append(key)
        chain.append(e.target)
        chains[e.id] = chain
        links.extend(itertools.pairwise(chain))
    depth = max(b.layer for b in boxes.values()) + 1

    # Initial order: depth-first from the markers, following edges in source order, so a
    # choose's first branch starts on the left and the cancel path on the right.
    up: dict[str, list[str]] = {k: [] for k in boxes}
    down: dict[str, list[str]] = {k: [] for k in boxes}
    for upper, lower in links:
        down[upper].append(lower)
        up[lower].append(upper)
    seen: list[str] = []
    stack = [n.id for n in reversed(graph.nodes)]
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.append(key)
        stack.extend(reversed(down[key]))
    rows: list[list[Box]] = [[] for _ in range(depth)]
    for key in seen:
        rows[boxes[key].layer].append(boxes[key])

    def index() -> dict[str, int]:
        return {b.key: i for row in rows for i, b in enumerate(row)}

    best, best_count = [list(r) for r in rows], _crossings(rows, links)
    for sweep in range(8):
        order = range(1, depth) if sweep % 2 == 0 else range(depth - 2, -1, -1)
        for i in order:
            at = index()
            near = up if sweep % 2 == 0 else down

            def centre(b: Box, near: dict[str, list[str]] = near, at: dict[str, int] = at) -> float:
                others = near[b.key]
                return sum(at[o] for o in others) / len(others) if others else at[b.key]

            rows[i].sort(key=lambda b: (centre(b), at[b.key]))
        count = _crossings(rows, links)
        if count < best_count:
            best, best_count = [list(r) for r in rows], count
    rows = best

    # x: pack, then pull each layer toward its neighbours, alternating down and up.
    for row in rows:
        x = 0.0
        for b in row:
            b.x = x + b.w / 2
            x += b.w + GAP_X
    for sweep in range(16):
        near = up if sweep % 2 == 0 else down
        for row in rows if sweep % 2 == 0 else reversed(rows):
            desired = [
                _median([boxes[o].x for o in near[b.key]]) if near[b.key] else b.x for b in row
            ]
            gaps = [0.0] + [
                (a.w + b.w) / 2 + (GAP_X if a.node and b.node else GAP_X / 2)
                for a, b in itertools.pairwise(row)
            ]
            weights = [1.0 if b.node else 4.0 for b in row]
            for b, x in zip(row, _isotonic(desired, gaps, weights), strict=True):
                b.x = x
    shift = MARGIN - min(b.left for b in boxes.values())
    top = float(MARGIN)
    bands: list[tuple[float, float]] = []
    for row in rows:
        height = max((b.h for b in row), default=0.0) or float(MARKER_H)
        for b in row:
            b.x = round(b.x + shift, 1)
            b.y = round(top + height / 2, 1)
        bands.append((top, top + height))
        top += height + GAP_Y
    ports: dict[tuple[str, str], float] = {}
    for end, near_end in (("out", 1), ("in", -2)):
        at_box: dict[str, list[Edge]] = {}
        for e in graph.edges:
            at_box.setdefault(e.source if end == "out" else e.target, []).append(e)
        for key, group in at_box.items():
            group.sort(key=lambda e: (boxes[chains[e.id][near_end]].x, e.id))
            for i, e in enumerate(group):
                ports[(e.id, end)] = _port(boxes[key], len(group), i)
    paths = {
        e.id: _route(chains[e.id], boxes, bands, ports[(e.id, "out")], ports[(e.id, "in")])
        for e in graph.edges
    }
    right = max(b.left + b.w for b in boxes.values())
    legend_w, legend_h = legend_size
    legend = (round(right + 32, 1), float(MARGIN), round(legend_w, 1), float(legend_h))
    width = round(legend[0] + legend_w + MARGIN, 1)
    height = round(max(top - GAP_Y + MARGIN, legend_h + 2 * MARGIN), 1)
    ordered = tuple(b for row in rows for b in row)
    return Layout(ordered, paths, width, height, legend)


def _port(box: Box, count: int, at: int) -> float:
    """The x of the ``at``-th of ``count`` edge ends spread over a box's middle 60 %."""
    if count == 1:
        return box.x
    return box.x - 0.3 * box.w + 0.6 * box.w * (at + 0.5) / count


def _route(
    chain: list[str],
    boxes: Mapping[str, Box],
    bands: list[tuple[float, float]],
    sx: float,
    tx: float,
) -> tuple[tuple[float, float], ...]:
    """Vertical inside a layer (along the edge's own slot), diagonal between layers."""
    src, dst = boxes[chain[0]], boxes[chain[-1]]
    points: list[tuple[float, float]] = [(sx, src.y + src.h / 2), (sx, bands[src.layer][1])]
    for key in chain[1:-1]:
        b = boxes[key]
        band = bands[b.layer]
        points += [(b.x, band[0]), (b.x, band[1])]
    points += [(tx, bands[dst.layer][0]), (tx, dst.y - dst.h / 2)]
    cleaned: list[tuple[float, float]] = []
    for x, y in points:
        p = (round(x, 1), round(y, 1))
        if not cleaned or cleaned[-1] != p:
            cleaned.append(p)
    return tuple(cleaned)
