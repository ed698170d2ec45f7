"""The workflow drawn: its step graph as SVG, Mermaid or DOT text.

:func:`graph_of` turns a checked :class:`~core.workflow.model.Workflow` into a :class:`Graph`:
one node per step (with its type and what it does in a few words), a ``start`` node, an
``on cancel`` node where the workflow declares ``onCancel``, and one edge per way a run can
move on: ``next``, each ``choose`` branch with its condition, ``otherwise``, ``onRefused``,
``onTimeout`` and ``onCancel``. The three writers draw that one graph; each is deterministic
(the same workflow gives the same bytes), so the pictures in the docs can be checked for drift.

The SVG is laid out by :mod:`core.workflow.graph_layout`, a small layered (Sugiyama) layout
of our own rather than Graphviz or a layout package: ``workflow graph`` stays a pure-Python
command that needs no system binary on an author's or operator's machine (docs/authoring.md,
"The workflow drawn", says why).

The SVG uses presentation attributes only (no ``<style>``, no script), so a page under a
strict Content-Security-Policy can inline it. :func:`run_picture` is the operator console's
entry: the same picture with a run's path, its current step and unknown effects marked.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.workflow.graph_layout import (
    DETAIL_PX,
    LABEL_PX,
    TITLE_PX,
    Box,
    layout,
    text_width,
)
from core.workflow.graph_model import Edge as Edge
from core.workflow.graph_model import Graph as Graph
from core.workflow.graph_model import Node as Node
from core.workflow.model import (
    All,
    CallStep,
    ChooseStep,
    Equals,
    Exists,
    FinishStep,
    In,
    Not,
    Predicate,
    WaitForStep,
    WaitUntilStep,
    Workflow,
    step_kind,
)

FORMATS = ("svg", "mermaid", "dot")
START = "_start"
CANCEL = "_cancel"
"""Pseudo-node ids; a step id starts with a letter, so neither can be a step's."""

# ------------------------------------------------------------------------------- the graph


def _seconds(n: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} s"


def _value(value: Any) -> str:
    """An operand as an author reads it: an expression bare, a literal as JSON."""
    single = isinstance(value, str) and value.startswith("${") and value.count("${") == 1
    if single and value.endswith("}"):  # exactly one expression, no text around it
        return str(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


def condition_text(predicate: Predicate) -> str:
    """A predicate in one line: ``${steps.a.outcome} = "approved"``, ``not exists …``."""
    if isinstance(predicate, Equals):
        return f"{_value(predicate.left)} = {_value(predicate.right)}"
    if isinstance(predicate, In):
        return f"{_value(predicate.item)} in {_value(predicate.options)}"
    if isinstance(predicate, Exists):
        return f"exists {_value(predicate.value)}"
    if isinstance(predicate, Not):
        inner = condition_text(predicate.item)
        return f"not {inner}" if isinstance(predicate.item, Exists) else f"not ({inner})"
    joiner = " and " if isinstance(predicate, All) else " or "
    return joiner.join(f"({condition_text(p)})" for p in predicate.items)


def _detail(step: Any) -> str:
    if isinstance(step, CallStep):
        return f"call {step.connection}: {step.operation}"
    if isinstance(step, WaitForStep):
        timeout = f", timeout {_seconds(step.timeout_seconds)}" if step.timeout_seconds else ""
        return f"wait-for {step.connection}: {step.result}{timeout}"
    if isinstance(step, WaitUntilStep):
        if step.after_seconds is not None:
            return f"wait-until after {_seconds(step.after_seconds)}"
        return f"wait-until {step.at}"
    if isinstance(step, FinishStep):
        return f"finish: {step.outcome}"
    return "choose"


_KIND_LABEL = {"onRefused": "refused", "onTimeout": "timeout", "otherwise": "otherwise"}


def graph_of(workflow: Workflow) -> Graph:
    """The graph of a checked workflow."""
    nodes = [Node(START, "start", "start", "")]
    edges = [Edge(START, workflow.start, "start", "")]
    if workflow.on_cancel is not None:
        nodes.append(Node(CANCEL, "cancel", "on cancel", "any step"))
        edges.append(Edge(CANCEL, workflow.on_cancel, "onCancel", "cancelled"))
    for step in workflow.steps.values():
        nodes.append(Node(step.id, step_kind(step), step.id, _detail(step)))
        if isinstance(step, ChooseStep):
            for index, branch in enumerate(step.branches):
                label = condition_text(branch.when)
                edges.append(Edge(step.id, branch.next, "choose", label, index))
            edges.append(Edge(step.id, step.otherwise, "otherwise", "otherwise"))
            continue
        for kind, target in step.edges():
            edges.append(Edge(step.id, target, kind, _KIND_LABEL.get(kind, "")))
    return Graph(workflow.id, workflow.version, tuple(nodes), tuple(edges))


# ------------------------------------------------------------------------------- the looks

_FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"


# kind: (fill, stroke, shape)
NODE_STYLE: dict[str, tuple[str, str, str]] = {
    "call": ("#e8f0fe", "#1a4d8f", "rect"),
    "choose": ("#fff4d6", "#8a6100", "hexagon"),
    "wait-for": ("#e6f4ea", "#1e6b35", "rounded"),
    "wait-until": ("#f3e8fd", "#5b2c8f", "slanted"),
    "finish": ("#eceff1", "#263238", "stadium"),
    "start": ("#263238", "#263238", "stadium"),
    "cancel": ("#fce8e6", "#8e24aa", "stadium"),
}
# kind: (stroke, dash pattern, legend words)
EDGE_STYLE: dict[str, tuple[str, str, str]] = {
    "next": ("#455a64", "", "next"),
    "choose": ("#1a4d8f", "", "choose branch (its condition)"),
    "otherwise": ("#1a4d8f", "", ""),
    "start": ("#455a64", "", ""),
    "onRefused": ("#c5221f", "7 4", "onRefused: the product refused"),
    "onTimeout": ("#b06000", "2 4", "onTimeout: the wait timed out"),
    "onCancel": ("#8e24aa", "9 3 2 3", "onCancel: an operator cancelled"),
}
_LEGEND_NODES = ("call", "choose", "wait-for", "wait-until", "finish")
_LEGEND_EDGES = ("next", "choose", "onRefused", "onTimeout", "onCancel")
_HIGHLIGHT, _UNKNOWN = "#e8710a", "#c5221f"
_UNCOVERED, _UNCOVERED_DASH = "#d01c8b", "3 3"


# --------------------------------------------------------------------------------- writing


def _clean(text: str) -> str:
    """Text with every character XML 1.0 cannot carry written as ``\\uXXXX``."""
    return "".join(
        f"\\u{ord(c):04x}"
        if (ord(c) < 0x20 and c not in "\t") or 0xD800 <= ord(c) <= 0xDFFF or c in "\ufffe\uffff"
        else c
        for c in text
    )


def _xml(text: str) -> str:
    return (
        _clean(text)
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
    )


def _n(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Highlight:
    """What the operator console marks on a run's picture (step ids)."""

    path: tuple[str, ...] = ()
    """The steps the run went through, in order."""
    current: str | None = None
    unknown: frozenset[str] = frozenset()
    """Steps whose effect is unknown (an uncertain call)."""
    covered: frozenset[str] | None = None
    """A coverage picture (``workflow test --coverage-svg``): the ids of the edges some
    script took; the others, and the steps none reached, are marked. ``None``: not one."""
    reached: frozenset[str] = frozenset()
    """With ``covered``: the steps some script reached."""
    notes: tuple[str, ...] = ()
    """With ``covered``: lines the legend adds (what the drawing cannot show)."""

    @property
    def legend_rows(self) -> tuple[tuple[str, str], ...]:
        """The legend's rows past the step and edge kinds: ``(swatch, words)``."""
        if self.covered is None:
            return ()
        return (
            ("uncovered-edge", "taken by no script"),
            ("unreached-step", "reached by no script"),
            *(("text", note) for note in self.notes),
        )


def _shape(kind: str, b: Box, fill: str, stroke: str, width: float, extra: str = "") -> str:
    left, top, right, bottom = b.left, b.top, b.left + b.w, b.top + b.h
    paint = f'fill="{fill}" stroke="{stroke}" stroke-width="{_n(width)}"{extra}'
    shape = NODE_STYLE[kind][2]
    if shape == "hexagon":
        c = 12.0
        pts = [(left + c, top), (right - c, top), (right, b.y), (right - c, bottom)]
        pts += [(left + c, bottom), (left, b.y)]
    elif shape == "slanted":
        s = 10.0
        pts = [(left + s, top), (right, top), (right - s, bottom), (left, bottom)]
    else:
        radius = {"rect": 3.0, "rounded": 12.0, "stadium": b.h / 2}[shape]
        return (
            f'<rect x="{_n(left)}" y="{_n(top)}" width="{_n(b.w)}" height="{_n(b.h)}" '
            f'rx="{_n(radius)}" {paint}/>'
        )
    points = " ".join(f"{_n(x)},{_n(y)}" for x, y in pts)
    return f'<polygon points="{points}" {paint}/>'


def _node_svg(b: Box, marks: set[str], dim: bool) -> list[str]:
    assert b.node is not None
    node = b.node
    fill, stroke, _ = NODE_STYLE[node.kind]
    width = 2.5 if node.kind == "finish" else 1.5
    classes = ["node", node.kind, *sorted(marks)]
    outline = ""
    if "unknown" in marks:
        stroke, width = _UNKNOWN, 3.0
    elif marks & {"on-path", "current"}:
        stroke, width = _HIGHLIGHT, 3.0
    elif "unreached" in marks:
        stroke, width, outline = _UNCOVERED, 2.5, f' stroke-dasharray="{_UNCOVERED_DASH}"'
    opacity = ' opacity="0.45"' if dim and not marks else ""
    out = [
        f'<g class="{" ".join(classes)}" id="step-{_xml(node.id)}" data-step="{_xml(node.id)}"'
        f"{opacity}>",
        f"<title>{_xml(node.title)}{': ' + _xml(node.detail) if node.detail else ''}"
        f"{' (no script reached it)' if 'unreached' in marks else ''}</title>",
    ]
    if "current" in marks:
        halo = Box(b.key, b.x, b.y, b.w + 12, b.h + 12)
        out.append(_shape(node.kind, halo, "none", _HIGHLIGHT, 2, ' stroke-dasharray="5 3"'))
    out.append(_shape(node.kind, b, fill, stroke, width, outline))
    font = f'font-family="{_FONT}" text-anchor="middle"'
    if node.kind in ("start", "cancel"):
        colour = "#ffffff" if node.kind == "start" else stroke
        out.append(
            f'<text class="marker" x="{_n(b.x)}" y="{_n(b.y + 4)}" {font} '
            f'font-size="{DETAIL_PX}" fill="{colour}">{_xml(node.title)}</text>'
        )
    else:
        out.append(
            f'<text class="step-id" x="{_n(b.x)}" y="{_n(b.y - 4)}" {font} '
            f'font-size="{TITLE_PX}" font-weight="bold" fill="#202124">{_xml(node.title)}</text>'
        )
        out.append(
            f'<text class="step-type" x="{_n(b.x)}" y="{_n(b.y + 13)}" {font} '
            f'font-size="{DETAIL_PX}" fill="#3c4043">{_xml(node.detail)}</text>'
        )
    if "unknown" in marks:
        cx, cy = b.left + b.w - 2, b.top + 2
        out.append(
            f'<g class="unknown-badge"><title>effect unknown</title>'
            f'<circle cx="{_n(cx)}" cy="{_n(cy)}" r="9" fill="{_UNKNOWN}"/>'
            f'<text x="{_n(cx)}" y="{_n(cy + 4)}" {font} font-size="12" font-weight="bold" '
            f'fill="#ffffff">?</text></g>'
        )
    out.append("</g>")
    return out


def _path_edges(graph: Graph, highlight: Highlight) -> set[str]:
    """The edges a run's path took: between consecutive path steps, the start edge, and the
    cancel edge when the path jumps to the ``onCancel`` step."""
    path = highlight.path
    taken: set[str] = set()
    if not path:
        return taken
    for e in graph.edges:
        if e.kind == "start" and e.target == path[0]:
            taken.add(e.id)
    for a, b in itertools.pairwise(path):
        between = [e.id for e in graph.edges if (e.source, e.target) == (a, b)]
        if not between:
            between = [e.id for e in graph.edges if e.kind == "onCancel" and e.target == b]
        taken.update(between)
    return taken


def svg(graph: Graph, highlight: Highlight | None = None) -> str:
    """The graph as a standalone SVG document (UTF-8 text, ends with a newline)."""
    highlight = highlight or Highlight()
    steps = {n.id for n in graph.nodes}
    for step_id in (*highlight.path, *sorted(highlight.unknown), highlight.current):
        if step_id is not None and step_id not in steps:
            raise ValueError(f"the workflow has no step {step_id!r} to highlight")
    taken = _path_edges(graph, highlight)
    dim = bool(highlight.path or highlight.current or highlight.unknown)
    placed = layout(graph, legend_size(highlight.legend_rows))
    name = f"{graph.workflow_id} {graph.version}"
    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" '
        f'width="{_n(placed.width)}" height="{_n(placed.height)}" '
        f'viewBox="0 0 {_n(placed.width)} {_n(placed.height)}" role="img" '
        f'data-workflow="{_xml(graph.workflow_id)}">',
        f"<title>Workflow {_xml(name)}</title>",
        "<defs>",
    ]
    colours = sorted(
        {s[0] for s in EDGE_STYLE.values()}
        | {_HIGHLIGHT}
        | ({_UNCOVERED} if highlight.covered is not None else set())
    )
    for colour in colours:
        out.append(
            f'<marker id="arrow-{colour[1:]}" viewBox="0 0 10 10" refX="10" refY="5" '
            f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            f'<path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        )
    out.append("</defs>")
    out.append(
        f'<rect class="background" width="{_n(placed.width)}" height="{_n(placed.height)}" '
        'fill="#ffffff"/>'
    )
    out.append('<g class="edges">')
    covered = highlight.covered
    for e in graph.edges:
        colour, dash, _ = EDGE_STYLE[e.kind]
        width = 1.5
        on_path = e.id in taken
        edge_marks = ["on-path"] if on_path else []
        if on_path:
            colour, width = _HIGHLIGHT, 3.0
        elif covered is not None and e.id in covered:
            dash, edge_marks = "", ["covered"]  # taken by some script: solid
        elif covered is not None:
            colour, width, dash, edge_marks = _UNCOVERED, 2.5, _UNCOVERED_DASH, ["uncovered"]
        points = placed.paths[e.id]
        d = "M" + " L".join(f"{_n(x)},{_n(y)}" for x, y in points)
        words = f"{e.source} → {e.target} ({e.kind}{'' if e.branch is None else f' {e.branch}'})"
        if "uncovered" in edge_marks:
            words += ", taken by no script"
        classes = " ".join(["edge", e.kind, *edge_marks])
        opacity = ' opacity="0.45"' if dim and not on_path else ""
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        out += [
            f'<g class="{classes}" id="{_xml(e.id)}" data-from="{_xml(e.source)}" '
            f'data-to="{_xml(e.target)}" data-kind="{e.kind}"{opacity}>',
            f"<title>{_xml(words)}{': ' + _xml(e.label) if e.label else ''}</title>",
            f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{_n(width)}"{dashes} '
            f'marker-end="url(#arrow-{colour[1:]})"/>',
            "</g>",
        ]
    out.append("</g>")
    out.append('<g class="labels">')
    for b in placed.boxes:
        if b.edge is None or not b.lines:
            continue
        colour = EDGE_STYLE[b.edge.kind][0]
        opacity = ' opacity="0.45"' if dim and b.edge.id not in taken else ""
        out.append(f'<g class="edge-label" data-edge="{_xml(b.edge.id)}"{opacity}>')
        out.append(
            f'<rect x="{_n(b.left)}" y="{_n(b.top)}" width="{_n(b.w)}" height="{_n(b.h)}" '
            'rx="3" fill="#ffffff" stroke="#dadce0" stroke-width="0.75"/>'
        )
        for i, line in enumerate(b.lines):
            y = b.top + 3 + 14 * i + 11
            out.append(
                f'<text x="{_n(b.x)}" y="{_n(y)}" font-family="{_FONT}" text-anchor="middle" '
                f'font-size="{LABEL_PX}" fill="{colour}">{_xml(line)}</text>'
            )
        out.append("</g>")
    out.append("</g>")
    out.append('<g class="nodes">')
    for b in placed.boxes:
        if b.node is None:
            continue
        marks = set()
        if b.key in highlight.path or any(e.source == b.key for e in graph.edges if e.id in taken):
            marks.add("on-path")  # a marker too, when the path left it
        if b.key == highlight.current:
            marks.add("current")
        if b.key in highlight.unknown:
            marks.add("unknown")
        marker = b.node.kind in ("start", "cancel")
        if covered is not None and not marker and b.key not in highlight.reached:
            marks.add("unreached")
        out += _node_svg(b, marks, dim)
    out.append("</g>")
    out += _legend(placed.legend, highlight.legend_rows)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def legend_size(rows: Sequence[tuple[str, str]] = ()) -> tuple[float, float]:
    """The width and height of the legend :func:`svg` draws beside the graph (with the
    ``rows`` a coverage picture adds)."""
    words = [EDGE_STYLE[k][2] for k in _LEGEND_EDGES] + [w for _, w in rows]
    width = max(text_width(w, DETAIL_PX) for w in words) + 66
    return width, 24.0 + 22 * (len(_LEGEND_NODES) + len(_LEGEND_EDGES) + len(rows))


def _legend(
    frame: tuple[float, float, float, float], rows: Sequence[tuple[str, str]] = ()
) -> list[str]:
    left, top, width, height = frame
    out = [
        '<g class="legend">',
        f'<rect x="{_n(left)}" y="{_n(top)}" width="{_n(width)}" height="{_n(height)}" rx="4" '
        'fill="#fafafa" stroke="#dadce0"/>',
        f'<text x="{_n(left + 10)}" y="{_n(top + 17)}" font-family="{_FONT}" font-size="12" '
        'font-weight="bold" fill="#202124">legend</text>',
    ]
    y = top + 24
    text = f'font-family="{_FONT}" font-size="{DETAIL_PX}" fill="#3c4043"'
    for kind in _LEGEND_NODES:
        fill, stroke, _ = NODE_STYLE[kind]
        swatch = Box(kind, left + 26, y + 11, 32, 16)
        out.append(_shape(kind, swatch, fill, stroke, 1.5))
        out.append(f'<text x="{_n(left + 50)}" y="{_n(y + 15)}" {text}>{kind}</text>')
        y += 22
    for kind in _LEGEND_EDGES:
        colour, dash, words = EDGE_STYLE[kind]
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<path d="M{_n(left + 10)},{_n(y + 11)} L{_n(left + 42)},{_n(y + 11)}" '
            f'stroke="{colour}" stroke-width="1.5"{dashes} marker-end="url(#arrow-{colour[1:]})"/>'
        )
        out.append(f'<text x="{_n(left + 50)}" y="{_n(y + 15)}" {text}>{_xml(words)}</text>')
        y += 22
    dashes = f' stroke-dasharray="{_UNCOVERED_DASH}"'
    for row_kind, words in rows:
        if row_kind == "uncovered-edge":
            out.append(
                f'<path d="M{_n(left + 10)},{_n(y + 11)} L{_n(left + 42)},{_n(y + 11)}" '
                f'stroke="{_UNCOVERED}" stroke-width="2.5"{dashes} '
                f'marker-end="url(#arrow-{_UNCOVERED[1:]})"/>'
            )
        elif row_kind == "unreached-step":
            box = Box("unreached", left + 26, y + 11, 32, 16)
            out.append(_shape("call", box, "#ffffff", _UNCOVERED, 2.5, dashes))
        out.append(f'<text x="{_n(left + 50)}" y="{_n(y + 15)}" {text}>{_xml(words)}</text>')
        y += 22
    out.append("</g>")
    return out


def run_picture(
    workflow: Workflow,
    *,
    path: Iterable[str] = (),
    current: str | None = None,
    unknown: Iterable[str] = (),
) -> str:
    """The operator console's picture of one run: the workflow's SVG with the run's path, its
    current step and the steps whose effect is unknown marked (the rest dimmed). Step ids
    only: no input, command or response goes into it. ValueError for a step the workflow
    lacks."""
    marks = Highlight(tuple(path), current, frozenset(unknown))
    return svg(graph_of(workflow), marks)


# ------------------------------------------------------------------------ mermaid and dot

_MERMAID_SHAPE = {
    "call": ('["', '"]'),
    "choose": ('{"', '"}'),
    "wait-for": ('("', '")'),
    "wait-until": ('[/"', '"/]'),
    "finish": ('(["', '"])'),
    "start": ('(["', '"])'),
    "cancel": ('(["', '"])'),
}


def _mermaid_text(text: str) -> str:
    """Text for inside a Mermaid ``"…"``: what Mermaid would read as syntax or markup is
    written as its ``#code;`` entity."""
    return "".join(f"#{ord(c)};" if c in '"#&<>|`\\' else c for c in _clean(text))


def mermaid(graph: Graph) -> str:
    """The graph as a Mermaid flowchart (text, ends with a newline)."""
    ids = {n.id: f"n{i}" for i, n in enumerate(graph.nodes)}
    out = [
        f"%% workflow {_mermaid_text(graph.workflow_id)} {_mermaid_text(graph.version)}",
        "flowchart TD",
    ]
    for n in graph.nodes:
        opening, closing = _MERMAID_SHAPE[n.kind]
        text = _mermaid_text(n.title)
        if n.detail and n.kind != "cancel":
            text += "<br/>" + _mermaid_text(n.detail)
        out.append(f"  {ids[n.id]}{opening}{text}{closing}")
    styles: list[str] = []
    for i, e in enumerate(graph.edges):
        arrow = "-.->" if EDGE_STYLE[e.kind][1] else "-->"
        label = f'|"{_mermaid_text(e.label)}"|' if e.label else ""
        out.append(f"  {ids[e.source]} {arrow}{label} {ids[e.target]}")
        colour, dash, _ = EDGE_STYLE[e.kind]
        dashes = f",stroke-dasharray:{dash}" if dash else ""
        styles.append(f"  linkStyle {i} stroke:{colour},stroke-width:1.5px{dashes}")
    out += styles
    for kind, (fill, stroke, _) in NODE_STYLE.items():
        members = [ids[n.id] for n in graph.nodes if n.kind == kind]
        if members:
            colour = ",color:#ffffff" if kind == "start" else ""
            name = kind.replace("-", "_")
            out.append(f"  classDef {name} fill:{fill},stroke:{stroke}{colour}")
            out.append(f"  class {','.join(members)} {name}")
    return "\n".join(out) + "\n"


def _dot_text(text: str) -> str:
    return _clean(text).replace("\\", "\\\\").replace('"', '\\"')


_DOT_SHAPE = {
    "rect": "box",
    "rounded": "box",
    "stadium": "box",
    "hexagon": "hexagon",
    "slanted": "parallelogram",
}


def dot(graph: Graph) -> str:
    """The graph as Graphviz DOT text (ends with a newline)."""
    out = [
        f'digraph "{_dot_text(graph.workflow_id)}" {{',
        f'  graph [label="{_dot_text(graph.workflow_id)} {_dot_text(graph.version)}", '
        f'labelloc=t, rankdir=TB, fontname="{_FONT}"];',
        f'  node [fontname="{_FONT}", fontsize=11, style=filled];',
        f'  edge [fontname="{_FONT}", fontsize=10];',
    ]
    for n in graph.nodes:
        fill, stroke, shape = NODE_STYLE[n.kind]
        label = _dot_text(n.title) + (f"\\n{_dot_text(n.detail)}" if n.detail else "")
        styles = "filled" + (",rounded" if shape in ("rounded", "stadium") else "")
        font = ', fontcolor="#ffffff"' if n.kind == "start" else ""
        width = ", penwidth=2.5" if n.kind == "finish" else ""
        out.append(
            f'  "{_dot_text(n.id)}" [id="step-{_dot_text(n.id)}", label="{label}", '
            f'shape={_DOT_SHAPE[shape]}, style="{styles}", fillcolor="{fill}", '
            f'color="{stroke}"{font}{width}];'
        )
    for e in graph.edges:
        colour, dash, _ = EDGE_STYLE[e.kind]
        style = {"7 4": "dashed", "2 4": "dotted", "9 3 2 3": "dashed"}.get(dash, "solid")
        label = f', label="{_dot_text(e.label)}"' if e.label else ""
        out.append(
            f'  "{_dot_text(e.source)}" -> "{_dot_text(e.target)}" [id="{_dot_text(e.id)}", '
            f'class="{e.kind}", color="{colour}", fontcolor="{colour}", style={style}{label}];'
        )
    out.append("}")
    return "\n".join(out) + "\n"


def render(workflow: Workflow, fmt: str) -> str:
    """``workflow graph``'s output: the workflow drawn as ``svg``, ``mermaid`` or ``dot``."""
    graph = graph_of(workflow)
    writers = {"svg": svg, "mermaid": mermaid, "dot": dot}
    return writers[fmt](graph)


def read_folder(path: Path) -> Workflow:
    """The checked workflow of a package folder (it holds ``manifest.json``: verified as
    ``check`` verifies it, no digest pinned) or of a workflow source folder."""
    from core.workflow.check import check_source_dir
    from core.workflow.package import MANIFEST, verify_package

    if (path / MANIFEST).exists():
        return verify_package(path, None).workflow
    return check_source_dir(path)
