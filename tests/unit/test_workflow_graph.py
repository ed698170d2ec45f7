"""`coordinatorctl workflow graph`: the workflow drawn as SVG, Mermaid and DOT.

The edges each picture must show are read from the YAML here, not from the graph model, so a
step or edge the model forgets fails these tests.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.workflow.check import check_source_dir
from core.workflow.graph import (
    CANCEL,
    START,
    Graph,
    graph_of,
    legend_size,
    mermaid,
    read_folder,
    render,
    run_picture,
)
from core.workflow.graph import dot as dot_text
from core.workflow.graph import svg as svg_text
from core.workflow.graph_layout import Box, layout
from core.workflow.package import build_package
from tests.helpers.cli_run import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/workflow.yaml"))
NS = {"s": "http://www.w3.org/2000/svg"}

Point = tuple[float, float]
Segment = tuple[Point, Point]
Triple = tuple[str, str, str]  # (from, kind, to); kind "choose" for every branch


def source_edges(document: dict[str, Any]) -> Counter[Triple]:
    """Every edge the workflow's YAML declares, the start and the onCancel jump included."""
    edges: Counter[Triple] = Counter({(START, "start", document["start"]): 1})
    if "onCancel" in document:
        edges[(CANCEL, "onCancel", document["onCancel"])] += 1
    for step_id, step in document["steps"].items():
        for kind in ("next", "onRefused", "onTimeout"):
            if kind in step:
                edges[(step_id, kind, step[kind])] += 1
        for branch in step.get("choose", []):
            edges[(step_id, "choose", branch["next"])] += 1
        if "otherwise" in step:
            edges[(step_id, "otherwise", step["otherwise"])] += 1
    return edges


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples" / name / "workflow.yaml").read_text()
    )
    return loaded


def parse_svg(text: str) -> ET.Element:
    return ET.fromstring(text)  # noqa: S314 - our own output, parsed to check it


def node_groups(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{{{NS['s']}}}g") if "node" in g.get("class", "").split()]


def edge_groups(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{{{NS['s']}}}g") if "edge" in g.get("class", "").split()]


# ------------------------------------------------------------------------------------- SVG


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_svg_shows_every_step_once_and_every_edge(name: str) -> None:
    document = example(name)
    root = parse_svg(render(check_source_dir(ROOT / "examples" / name), "svg"))
    nodes = node_groups(root)
    steps = [g.get("data-step", "") for g in nodes if g.get("data-step") not in (START, CANCEL)]
    assert sorted(steps) == sorted(document["steps"])
    assert all(g.get("id") == f"step-{g.get('data-step')}" for g in nodes)
    id_texts = Counter(
        t.text for t in root.iter(f"{{{NS['s']}}}text") if t.get("class") == "step-id"
    )
    assert id_texts == Counter(list(document["steps"]))
    for g in nodes:  # the type is shown, and styled per type
        step = document["steps"].get(g.get("data-step"))
        if step is not None:
            kind = next(
                k for k in ("call", "choose", "wait-for", "wait-until", "finish") if k in step
            )
            assert kind in g.get("class", "").split()
            detail = next(t.text for t in g if t.get("class") == "step-type")
            assert detail is not None and detail.startswith(kind)
            if kind == "finish":
                assert detail == f"finish: {step['finish']['outcome']}"
    drawn = Counter(
        (g.get("data-from", ""), g.get("data-kind", ""), g.get("data-to", ""))
        for g in edge_groups(root)
    )
    assert drawn == source_edges(document)
    ids = [g.get("id") for g in edge_groups(root)]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("name", EXAMPLES)
def test_choose_conditions_and_side_edges_carry_labels(name: str) -> None:
    root = parse_svg(render(check_source_dir(ROOT / "examples" / name), "svg"))
    labels = {
        g.get("data-edge"): " ".join(t.text or "" for t in g.iter(f"{{{NS['s']}}}text"))
        for g in root.iter(f"{{{NS['s']}}}g")
        if g.get("class") == "edge-label"
    }
    for g in edge_groups(root):
        kind = g.get("data-kind")
        if kind in ("choose", "otherwise", "onRefused", "onTimeout", "onCancel"):
            assert labels[g.get("id")], f"{g.get('id')} has no label"
        else:
            assert g.get("id") not in labels
    document = example(name)
    for step_id, step in document["steps"].items():
        for i, _ in enumerate(step.get("choose", [])):
            assert "${" in labels[f"edge-{step_id}-choose-{i}"]  # the condition, not a number


@pytest.mark.parametrize("name", EXAMPLES)
def test_side_edges_are_styled_apart_and_the_legend_names_them(name: str) -> None:
    root = parse_svg(render(check_source_dir(ROOT / "examples" / name), "svg"))
    looks: dict[str, set[tuple[str | None, str | None]]] = {}
    for g in edge_groups(root):
        path = g.find("s:path", NS)
        assert path is not None
        looks.setdefault(g.get("data-kind", ""), set()).add(
            (path.get("stroke"), path.get("stroke-dasharray"))
        )
    assert all(len(v) == 1 for v in looks.values())
    for side in ("onRefused", "onTimeout", "onCancel"):
        if side in looks:
            others = set().union(*(v for k, v in looks.items() if k != side))
            assert looks[side].isdisjoint(others)
    legend = next(g for g in root.iter(f"{{{NS['s']}}}g") if g.get("class") == "legend")
    words = " ".join(t.text or "" for t in legend.iter(f"{{{NS['s']}}}text"))
    for term in ("call", "choose", "wait-for", "wait-until", "finish", "onRefused", "onTimeout"):
        assert term in words


# ---------------------------------------------------------------------------------- layout


def overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    """Whether two (left, top, width, height) rectangles share more than an edge."""
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def crosses(p: tuple[float, float], q: tuple[float, float], box: Box) -> bool:
    """Whether segment p–q passes through the inside of a box (sampled finely)."""
    inside = (box.left + 0.5, box.top + 0.5, box.left + box.w - 0.5, box.top + box.h - 0.5)
    for i in range(201):
        x = p[0] + (q[0] - p[0]) * i / 200
        y = p[1] + (q[1] - p[1]) * i / 200
        if inside[0] < x < inside[2] and inside[1] < y < inside[3]:
            return True
    return False


def test_the_geometry_checks_can_fail() -> None:
    assert overlaps((0, 0, 10, 10), (5, 5, 10, 10))
    assert not overlaps((0, 0, 10, 10), (10, 0, 10, 10))
    box = Box("b", x=50, y=50, w=20, h=20)
    assert crosses((0, 50), (100, 50), box)
    assert not crosses((0, 0), (100, 0), box)


@pytest.mark.parametrize("name", EXAMPLES)
def test_no_boxes_overlap_and_no_edge_crosses_a_box(name: str) -> None:
    graph = graph_of(check_source_dir(ROOT / "examples" / name))
    placed = layout(graph, legend_size())
    assert placed.legend[2:] == legend_size()
    solid = [b for b in placed.boxes if b.node is not None or b.lines]
    frames = [(b.left, b.top, b.w, b.h) for b in solid] + [placed.legend]
    for i, a in enumerate(frames):
        for b in frames[i + 1 :]:
            assert not overlaps(a, b), (a, b)
        assert a[0] >= 0 and a[1] >= 0
        assert a[0] + a[2] <= placed.width and a[1] + a[3] <= placed.height
    for e in graph.edges:
        points = placed.paths[e.id]
        for box in solid:
            if box.key in (e.source, e.target) or box.edge == e:
                continue
            for p, q in itertools.pairwise(points):
                assert not crosses(p, q, box), f"{e.id} crosses {box.key}"


def proper_crossing(s1: Segment, s2: Segment) -> bool:
    """Whether two segments cross at a point inside both (touching ends do not count)."""

    def side(a: Point, b: Point, c: Point) -> int:
        v = (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
        return (v > 1e-9) - (v < -1e-9)

    (p, q), (r, t) = s1, s2
    return side(p, q, r) * side(p, q, t) < 0 and side(r, t, p) * side(r, t, q) < 0


def test_the_crossing_check_can_fail() -> None:
    assert proper_crossing(((0, 0), (10, 10)), ((0, 10), (10, 0)))
    assert not proper_crossing(((0, 0), (10, 10)), ((10, 10), (20, 0)))


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_examples_are_drawn_without_edge_crossings(name: str) -> None:
    graph = graph_of(check_source_dir(ROOT / "examples" / name))
    paths = layout(graph, legend_size()).paths
    for a, b in itertools.combinations(graph.edges, 2):
        for s1 in itertools.pairwise(paths[a.id]):
            for s2 in itertools.pairwise(paths[b.id]):
                assert not proper_crossing(s1, s2), f"{a.id} crosses {b.id}"


def test_the_same_workflow_gives_the_same_bytes_and_the_docs_pictures_are_current(
    tmp_path: Path,
) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gen_workflow_pictures.py"),
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    coverage = [f"{name}-coverage" for name in EXAMPLES]
    assert sorted(p.stem for p in tmp_path.glob("*.svg")) == sorted(EXAMPLES + coverage)
    for name in EXAMPLES:
        fresh = (tmp_path / f"{name}.svg").read_text(encoding="utf-8")
        assert fresh == render(check_source_dir(ROOT / "examples" / name), "svg")
    for name in EXAMPLES + coverage:
        fresh = (tmp_path / f"{name}.svg").read_text(encoding="utf-8")
        committed = (ROOT / "docs" / "pictures" / f"{name}.svg").read_text(encoding="utf-8")
        assert committed == fresh, f"docs/pictures/{name}.svg is stale: run make pictures"


# -------------------------------------------------------------------------- mermaid and dot


@pytest.mark.parametrize("name", EXAMPLES)
def test_mermaid_has_every_step_and_edge(name: str) -> None:
    document = example(name)
    text = mermaid(graph_of(check_source_dir(ROOT / "examples" / name)))
    assert text.splitlines()[1] == "flowchart TD"
    titles = dict(re.findall(r'^  (n\d+)[\[({/]+"([^"<]*)', text, re.M))
    ids = {title: node for node, title in titles.items()}
    assert set(document["steps"]) <= set(ids)
    arrows = Counter(
        (a, b) for a, b in re.findall(r"^  (n\d+) -\.?->(?:\|\"[^\"]*\"\|)? (n\d+)$", text, re.M)
    )
    want = Counter(
        (ids.get(src, ids.get({START: "start", CANCEL: "on cancel"}.get(src, ""))), ids[dst])
        for src, _, dst in source_edges(document).elements()
    )
    assert arrows == want
    assert text.count("linkStyle") == sum(want.values())


@pytest.mark.parametrize("name", EXAMPLES)
def test_dot_has_every_step_and_edge(name: str) -> None:
    document = example(name)
    text = dot_text(graph_of(check_source_dir(ROOT / "examples" / name)))
    assert text.startswith(f'digraph "{document["id"]}" {{') and text.endswith("}\n")
    nodes = set(re.findall(r'^  "([^"]+)" \[id="step-', text, re.M))
    assert nodes - {START, CANCEL} == set(document["steps"])
    edges = Counter(
        (a, kind, b)
        for a, b, kind in re.findall(
            r'^  "([^"]+)" -> "([^"]+)" \[id="[^"]+", class="(\w+)"', text, re.M
        )
    )
    assert edges == source_edges(document)


# ------------------------------------------------------------------------------- escaping

TRICKY = "a<b & \"c\" 'd' #e |f| `g` \\h \u0007"

ESCAPE_WORKFLOW = """\
format: registry-coordinator/workflow/v1
id: escapes
version: 1.0.0
input:
  type: object
  additionalProperties: false
  required: [x]
  properties:
    x: {type: string}
connections: {}
outcomes: [one, two]
start: pick
steps:
  pick:
    choose:
      - when: {equals: ["${input.x}", %s]}
        next: one
    otherwise: two
  one: {finish: {outcome: one}}
  two: {finish: {outcome: two}}
"""


@pytest.fixture
def tricky(tmp_path: Path) -> Graph:
    literal = '"' + TRICKY.replace("\\", "\\\\").replace('"', '\\"').replace("\u0007", "\\a") + '"'
    (tmp_path / "workflow.yaml").write_text(ESCAPE_WORKFLOW % literal, encoding="utf-8")
    return graph_of(check_source_dir(tmp_path))


def test_a_condition_with_markup_characters_is_escaped_in_every_format(tricky: Graph) -> None:
    label = next(e.label for e in tricky.edges if e.kind == "choose")
    assert label.startswith("${input.x} = ") and '\\"c\\"' in label  # JSON-quoted literal
    root = parse_svg(svg_text(tricky))  # would raise on a raw < or & or a control character
    shown = " ".join(
        t.text or ""
        for g in root.iter(f"{{{NS['s']}}}g")
        if g.get("data-edge") == "edge-pick-choose-0"
        for t in g.iter(f"{{{NS['s']}}}text")
    )
    assert shown.replace(" ", "") == label.replace(" ", "")
    titles = [t.text or "" for g in edge_groups(root) for t in g.findall("s:title", NS)]
    assert any(title.endswith(label) for title in titles)

    dot = dot_text(tricky)
    found = re.search(r'label="((?:[^"\\]|\\.)*)"\];\n', dot)
    assert found is not None
    assert re.sub(r"\\(.)", r"\1", found.group(1)) == label

    flow = mermaid(tricky)
    edge_line = next(line for line in flow.splitlines() if "|" in line and "-->" in line)
    inner = edge_line.split('|"', 1)[1].rsplit('"|', 1)[0]
    assert not set(inner) & set('"<>&|`\\') and "#" not in re.sub(r"#\d+;", "", inner)
    assert re.sub(r"#(\d+);", lambda m: chr(int(m.group(1))), inner) == label


# ------------------------------------------------------------------------ the console's call


def test_run_picture_marks_the_path_the_current_step_and_an_unknown_effect() -> None:
    workflow = check_source_dir(ROOT / "examples" / "approval-notice")
    path = ["request-review", "await-decision", "decide", "send-rejection"]
    root = parse_svg(
        run_picture(workflow, path=path, current="send-rejection", unknown={"send-rejection"})
    )
    classes = {g.get("data-step"): set(g.get("class", "").split()) for g in node_groups(root)}
    for step in path:
        assert "on-path" in classes[step]
    assert {"current", "unknown"} <= classes["send-rejection"]
    assert "on-path" not in classes["send-approval"] and "current" not in classes["decide"]
    on_path = {g.get("id") for g in edge_groups(root) if "on-path" in g.get("class", "").split()}
    assert on_path == {
        "edge-_start-start",
        "edge-request-review-next",
        "edge-await-decision-next",
        "edge-decide-otherwise",
    }
    plain = parse_svg(svg_text(graph_of(workflow)))
    assert not any("on-path" in g.get("class", "") for g in edge_groups(plain))
    badge = [g for g in root.iter(f"{{{NS['s']}}}g") if g.get("class") == "unknown-badge"]
    assert len(badge) == 1


def test_run_picture_follows_a_cancel_to_the_on_cancel_path() -> None:
    workflow = check_source_dir(ROOT / "examples" / "approval-notice")
    root = parse_svg(
        run_picture(
            workflow, path=["request-review", "notify-cancelled"], current="notify-cancelled"
        )
    )
    on_path = {g.get("id") for g in edge_groups(root) if "on-path" in g.get("class", "").split()}
    assert on_path == {"edge-_start-start", "edge-_cancel-onCancel"}
    marked = {g.get("data-step") for g in node_groups(root) if "on-path" in g.get("class", "")}
    assert marked == {START, CANCEL, "request-review", "notify-cancelled"}


def test_run_picture_refuses_a_step_the_workflow_lacks() -> None:
    workflow = check_source_dir(ROOT / "examples" / "approval-notice")
    with pytest.raises(ValueError, match="no-such-step"):
        run_picture(workflow, path=["request-review"], current="no-such-step")


# ------------------------------------------------------------------------- the command line


def test_graph_of_a_source_and_of_its_package_are_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = build_package(ROOT / "examples" / "register-change", tmp_path)
    assert read_folder(built.path) == check_source_dir(ROOT / "examples" / "register-change")
    code, out, err = run_cli(["workflow", "graph", str(built.path), "--format", "dot"], capsys)
    assert (code, err) == (0, "")
    assert out == render(read_folder(built.path), "dot")


def test_graph_writes_svg_by_default_or_into_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = str(ROOT / "examples" / "appointment-booking")
    code, out, _ = run_cli(["workflow", "graph", source], capsys)
    assert code == 0 and out.startswith("<svg ")
    target = tmp_path / "picture.mmd"
    code, out, _ = run_cli(
        ["workflow", "graph", source, "--format", "mermaid", "--out", str(target)], capsys
    )
    assert (code, out) == (0, "")
    assert target.read_text(encoding="utf-8").splitlines()[1] == "flowchart TD"


@pytest.mark.parametrize("bad", ["missing", "empty", "tampered-package", "broken-source"])
def test_a_bad_folder_is_refused_in_one_line(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / bad
    if bad == "empty":
        folder.mkdir()
    elif bad == "tampered-package":
        folder = build_package(ROOT / "examples" / "approval-notice", tmp_path).path
        (folder / "workflow.yaml").write_bytes(b"format: nonsense\n")
    elif bad == "broken-source":
        folder.mkdir()
        (folder / "workflow.yaml").write_text("steps: [\n", encoding="utf-8")
    code, out, err = run_cli(["workflow", "graph", str(folder)], capsys)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and re.match(
        r"coordinator\.package\.(invalid|digest-mismatch): ", lines[0]
    )


def test_an_unknown_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        ["workflow", "graph", str(ROOT / "examples" / "approval-notice"), "--format", "png"], capsys
    )
    assert code == 2 and out == "" and "png" in err
