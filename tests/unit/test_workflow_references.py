"""Property: a ``${steps.X.f}`` reference at step U is accepted exactly when X ran before U.

"Ran before" means: on every path from ``start`` to U, the run passed X and left it along its
``next`` edge (a refused call or a timed-out wait keeps no values). The oracle enumerates
every path by brute force, independently of the checker's data-flow analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from core.errors import PackageInvalid
from core.workflow.check import check_source


@dataclass(frozen=True)
class Graph:
    kinds: dict[int, str]
    edges: dict[int, list[tuple[str, int]]]  # (edge kind, target)
    user: int
    source: int


def oracle(graph: Graph) -> bool:
    """True iff every path start → user leaves ``source`` by its ``next`` edge."""

    def paths(node: int, trail: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
        if node == graph.user:
            return [trail]
        found = []
        for kind, target in graph.edges[node]:
            found += paths(target, [*trail, (node, kind)])
        return found

    every = paths(0, [])
    assert every, "the user step is reachable by construction"
    return all((graph.source, "next") in path for path in every)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    """Random acyclic step graphs: a spine s0 → s1 → … → finish, plus forward jumps.

    Every step is reachable through the spine; jumps (a second edge, or a first edge that
    skips ahead) make diamonds, refusal and timeout detours.
    """
    size = draw(st.integers(min_value=3, max_value=9))
    kinds: dict[int, str] = {size - 1: "finish"}
    edges: dict[int, list[tuple[str, int]]] = {size - 1: []}
    for node in range(size - 1):
        spine, jump = node + 1, draw(st.integers(min_value=node + 1, max_value=size - 1))
        first, second = (jump, spine) if draw(st.booleans()) else (spine, jump)
        if node == 0:
            kind = "call"  # so every graph has a step to read from and a place to read in
        else:
            kind = draw(st.sampled_from(["call", "call", "wait-until", "choose", "wait-for"]))
        # choose and wait-for always have two ways out; a call has onRefused half the time.
        detour = kind in ("choose", "wait-for") or (kind == "call" and draw(st.booleans()))
        if kind == "wait-until" or not detour:
            kinds[node], edges[node] = kind, [("next", spine)]
            continue
        label = {"call": "onRefused", "choose": "otherwise", "wait-for": "onTimeout"}[kind]
        kinds[node] = kind
        edges[node] = [("choose" if kind == "choose" else "next", first), (label, second)]
    users = sorted(n for n, k in kinds.items() if k in ("call", "choose"))
    sources = sorted(n for n, k in kinds.items() if k in ("call", "wait-for"))
    user = draw(st.sampled_from(users))
    # Half the time, draw among the sources the oracle accepts: random graphs branch so much
    # that an accepted reference would otherwise be rare.
    good = [s for s in sources if oracle(Graph(kinds, edges, user, s))]
    prefer_good = draw(st.booleans())
    pool = good if good and prefer_good else sources
    return Graph(kinds, edges, user, draw(st.sampled_from(pool)))


def render(graph: Graph) -> bytes:
    name = {n: f"s{n}" for n in graph.kinds}
    field = "outcome" if graph.kinds[graph.source] == "wait-for" else "f"
    reference = f"${{steps.s{graph.source}.{field}}}"
    steps: dict[str, Any] = {}
    uses = set()
    for node, kind in graph.kinds.items():
        out = graph.edges[node]
        if kind == "finish":
            steps[name[node]] = {"finish": {"outcome": "end"}}
        elif kind == "call":
            uses.add("notices")
            parameters = {"v": reference} if node == graph.user else {}
            step: dict[str, Any] = {
                "call": {
                    "connection": "notices",
                    "operation": "send-notice",
                    "input": {"template": "t", "recipientRef": "r", "parameters": parameters},
                    "output": {"f": "${response.messageId}"},
                },
                "next": name[out[0][1]],
            }
            if len(out) > 1:
                step["onRefused"] = name[out[1][1]]
            steps[name[node]] = step
        elif kind == "choose":
            when = {"exists": reference} if node == graph.user else {"equals": [1, 1]}
            steps[name[node]] = {
                "choose": [{"when": when, "next": name[out[0][1]]}],
                "otherwise": name[out[1][1]],
            }
        elif kind == "wait-until":
            steps[name[node]] = {"wait-until": {"afterSeconds": 60}, "next": name[out[0][1]]}
        else:
            uses.add("review")
            steps[name[node]] = {
                "wait-for": {
                    "connection": "review",
                    "result": "review-decision",
                    "reviewId": "R-1",
                    "timeoutSeconds": 60,
                },
                "next": name[out[0][1]],
                "onTimeout": name[out[1][1]],
            }
    types = {"notices": "messaging", "review": "casework-review-producer"}
    document = {
        "format": "registry-coordinator/workflow/v1",
        "id": "random",
        "version": "0.0.1",
        "input": {"type": "object", "additionalProperties": False},
        "connections": {n: types[n] for n in sorted(uses)},
        "outcomes": ["end"],
        "start": "s0",
        "steps": steps,
    }
    return yaml.safe_dump(document, sort_keys=False).encode()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(graphs())
def test_step_reference_is_accepted_iff_the_step_precedes_on_every_path(graph: Graph) -> None:
    source = render(graph)
    expected = oracle(graph)
    try:
        check_source(source)
        accepted = True
    except PackageInvalid as exc:
        assert "does not run before this step on every path" in exc.reason, exc.detail
        user = f"steps.s{graph.user}"
        assert exc.path in (
            f"{user}.call.input.parameters.v",
            f"{user}.choose[0].when.exists",
        )
        accepted = False
    event("accepted" if accepted else "refused")
    assert accepted == expected


def test_the_oracle_tells_a_diamond_from_a_chain() -> None:
    # A fixed check that the oracle itself discriminates: 0 -> {1, 2} -> 3.
    diamond = Graph(
        kinds={0: "choose", 1: "call", 2: "call", 3: "call", 4: "finish"},
        edges={
            0: [("choose", 1), ("otherwise", 2)],
            1: [("next", 3)],
            2: [("next", 3)],
            3: [("next", 4)],
            4: [],
        },
        user=3,
        source=1,
    )
    assert oracle(diamond) is False
    assert oracle(Graph(diamond.kinds, diamond.edges, user=3, source=0)) is False  # choose
    chain = Graph(
        kinds={0: "call", 1: "call", 2: "finish"},
        edges={0: [("next", 1)], 1: [("next", 2)], 2: []},
        user=1,
        source=0,
    )
    assert oracle(chain) is True
    with_refusal = Graph(
        kinds={0: "call", 1: "call", 2: "finish"},
        edges={0: [("next", 1), ("onRefused", 1)], 1: [("next", 2)], 2: []},
        user=1,
        source=0,
    )
    assert oracle(with_refusal) is False
    for graph, accepted in ((chain, True), (with_refusal, False)):
        try:
            check_source(render(graph))
            assert accepted
        except PackageInvalid:
            assert not accepted
