"""``coordinatorctl workflow test``: every simulation script of a workflow, and the parts of
its graph that none of them reached.

Each script runs exactly as ``workflow simulate`` runs it (:mod:`cli.simulate`). Coverage is
counted over the drawn graph's edges (:func:`core.workflow.graph.graph_of`: the start, each
``next``, each ``choose`` branch and its ``otherwise``, ``onRefused``, ``onTimeout`` and
``onCancel``) and, for every call step, its way to the run's failure (a refusal with no
``onRefused``, a missed deadline, an answer the output mapping cannot read): the one way out
of a call that no edge draws, and the one authors forget to try. The simulator records the
edges a run takes as it takes them (:attr:`cli.simulate.Simulation.taken`), so a ``choose``
whose branch and ``otherwise`` lead to the same step is still told apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from cli import simulate as sim
from cli import simulation_report as report
from cli import simulation_script as script_file
from core.errors import CoordinatorError
from core.workflow.graph import CANCEL, START, Highlight, graph_of, svg
from core.workflow.graph_model import Edge
from core.workflow.model import CallStep, Workflow

SIMULATIONS: Final = "simulations"
"""The folder of a workflow source whose ``*.yaml`` scripts ``workflow test`` runs."""


@dataclass(frozen=True)
class Way:
    """One way out of a step that coverage counts: a graph edge, or a call's failure."""

    source: str
    """A step id, or :data:`~core.workflow.graph.START` / :data:`~core.workflow.graph.CANCEL`."""
    target: str | None
    """The step it leads to; ``None`` for the run's failure."""
    kind: str
    """``start``, ``next``, ``choose``, ``otherwise``, ``onRefused``, ``onTimeout``,
    ``onCancel`` or ``failure``."""
    branch: int | None = None

    @property
    def key(self) -> tuple[str, str, int | None]:
        return (self.source, self.kind, self.branch)

    @property
    def kind_name(self) -> str:
        """The kind as authors write it: a choose branch is ``choose[i]``."""
        return f"choose[{self.branch}]" if self.kind == "choose" else self.kind

    def document(self) -> dict[str, Any]:
        """``{"from", "to", "kind"}``; ``from`` is null for the start and for a cancel (no
        step), ``to`` null for the run's failure."""
        source = None if self.source in (START, CANCEL) else self.source
        return {"from": source, "to": self.target, "kind": self.kind_name}

    def text(self) -> str:
        source = {START: "(start)", CANCEL: "(a cancel)"}.get(self.source, self.source)
        target = self.target if self.target is not None else "(the run fails)"
        return f"{source} -> {target} ({self.kind_name})"


def ways_of(workflow: Workflow) -> tuple[Way, ...]:
    """Every way out of a step that coverage counts, in the graph's order, each call's
    failure after its edges."""
    ways: list[Way] = []
    for edge in graph_of(workflow).edges:
        ways.append(_way(edge))
        step = workflow.steps.get(edge.source)
        if isinstance(step, CallStep) and edge.kind == _last_kind(step):
            ways.append(Way(step.id, None, sim.FAILURE))
    return tuple(ways)


def _way(edge: Edge) -> Way:
    return Way(edge.source, edge.target, edge.kind, edge.branch)


def _last_kind(step: CallStep) -> str:
    return "onRefused" if step.on_refused is not None else "next"


# ------------------------------------------------------------------------------------ a suite


@dataclass(frozen=True)
class ScriptResult:
    """One script's verdict."""

    script: str
    """As the command line named it, or its path under the workflow folder."""
    passed: bool
    refused: CoordinatorError | None = None
    """The refusal of a script that could not run (exit 2)."""
    differences: tuple[str, ...] = ()
    """Where the run's end differs from ``expect``, first first."""
    simulation: sim.Simulation | None = None

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"script": self.script, "passed": self.passed}
        difference = self.difference
        if difference is not None:
            out["difference"] = difference
        if self.refused is not None:
            out["code"] = f"coordinator.{self.refused.code}"
        return out

    @property
    def difference(self) -> str | None:
        if self.refused is not None:
            return self.refused.detail
        return self.differences[0] if self.differences else None


@dataclass(frozen=True)
class Coverage:
    """What the scripts that ran reached of the workflow."""

    workflow: Workflow
    reached: frozenset[str]
    """The steps some script reached."""
    taken: frozenset[tuple[str, str, int | None]]
    """The :attr:`Way.key` of each way some script took."""

    @property
    def steps(self) -> tuple[str, ...]:
        return tuple(self.workflow.steps)

    @cached_property
    def ways(self) -> tuple[Way, ...]:
        """(Drawn once: the counts, the missing list and the picture all read it.)"""
        return ways_of(self.workflow)

    @property
    def missing_steps(self) -> list[str]:
        return [step for step in self.steps if step not in self.reached]

    @property
    def missing_ways(self) -> list[Way]:
        return [way for way in self.ways if way.key not in self.taken]

    @property
    def ways_taken(self) -> int:
        return len(self.ways) - len(self.missing_ways)

    @property
    def percent(self) -> float:
        """Of the ways out of steps (edges and failures), the share some script took."""
        return 100.0 * self.ways_taken / len(self.ways) if self.ways else 100.0

    def document(self) -> dict[str, Any]:
        return {
            "steps": {
                "reached": len(self.steps) - len(self.missing_steps),
                "total": len(self.steps),
                "missing": self.missing_steps,
            },
            "edges": {
                "taken": self.ways_taken,
                "total": len(self.ways),
                "percent": round(self.percent, 1),
                "missing": [way.document() for way in self.missing_ways],
            },
        }

    def picture(self) -> str:
        """The workflow drawn with the edges some script took solid, the others and the
        steps none reached marked (``--coverage-svg``)."""
        graph = graph_of(self.workflow)
        taken_ids = frozenset(edge.id for edge in graph.edges if _way(edge).key in self.taken)
        failures = [w for w in self.missing_ways if w.kind == sim.FAILURE]
        notes = (
            f"edges and failures taken: {self.ways_taken} of {len(self.ways)}",
            *(f"never failed at {way.source}" for way in failures),
        )
        return svg(graph, Highlight(covered=taken_ids, reached=self.reached, notes=notes))


@dataclass
class Suite:
    """The scripts of one workflow, run."""

    workflow: Workflow
    results: list[ScriptResult] = field(default_factory=list)

    @property
    def coverage(self) -> Coverage:
        reached: set[str] = set()
        taken: set[tuple[str, str, int | None]] = set()
        for result in self.results:
            if result.simulation is not None:
                reached |= result.simulation.reached
                taken |= {(t.source, t.kind, t.branch) for t in result.simulation.taken}
        return Coverage(self.workflow, frozenset(reached), frozenset(taken))

    @property
    def refused(self) -> bool:
        return any(result.refused is not None for result in self.results)

    @property
    def failed(self) -> bool:
        return any(not result.passed for result in self.results)


def scripts_of(source: Path) -> list[Path]:
    """The scripts ``workflow test DIR`` runs by default: ``DIR/simulations/*.yaml`` (and
    ``*.yml``), by name."""
    folder = source / SIMULATIONS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def run_suite(workflow: Workflow, scripts: Iterable[tuple[str, Path]]) -> Suite:
    """Run each ``(name, path)`` script; a refused one is recorded, and the others still run."""
    suite = Suite(workflow)
    for name, path in scripts:
        try:
            script = script_file.read_script(workflow, path)
            simulation = sim.simulate(workflow, script)
        except CoordinatorError as refused:
            suite.results.append(ScriptResult(name, False, refused=refused))
            continue
        wrong = tuple(report.differences(script.expect, simulation))
        suite.results.append(ScriptResult(name, not wrong, None, wrong, simulation))
    return suite


# ------------------------------------------------------------------------------------ output


def document(suite: Suite) -> dict[str, Any]:
    """``--output json``: ``{"scripts": [...], "coverage": {...}}``."""
    return {
        "workflow": {"id": suite.workflow.id, "version": suite.workflow.version},
        "scripts": [result.document() for result in suite.results],
        "coverage": suite.coverage.document(),
    }


def text(suite: Suite, min_coverage: float | None = None) -> list[str]:
    """One line per script, then the coverage and what it misses."""
    wf = suite.workflow
    lines = [f"testing {wf.id} {wf.version}: {len(suite.results)} scripts"]
    for result in suite.results:
        if result.refused is not None:
            lines.append(f"  refused  {result.script}: {result.refused.cli_line()}")
        elif result.passed:
            lines.append(f"  pass     {result.script}")
        else:
            lines.append(f"  FAIL     {result.script}: {result.difference}")
    coverage = suite.coverage
    missing_steps = coverage.missing_steps
    reached = len(coverage.steps) - len(missing_steps)
    lines.append(f"steps reached: {reached} of {len(coverage.steps)}")
    if missing_steps:
        lines.append("  never reached: " + ", ".join(missing_steps))
    lines.append(
        f"edges taken: {coverage.ways_taken} of {len(coverage.ways)} "
        f"({_percent(coverage.percent)})"
        + (f", at least {_percent(min_coverage)} wanted" if min_coverage is not None else "")
    )
    for way in coverage.missing_ways:
        lines.append(f"  never taken: {way.text()}")
    passed = sum(1 for result in suite.results if result.passed)
    lines.append(f"{passed} of {len(suite.results)} scripts passed")
    return lines


def _percent(value: float) -> str:
    return f"{value:.1f} %".replace(".0 %", " %")


def verdict(suite: Suite, min_coverage: float | None) -> int:
    """The exit status: 2 when a script was refused, 1 when one failed or the edges taken
    are under ``min_coverage`` percent, else 0."""
    if suite.refused:
        return 2
    if suite.failed:
        return 1
    if min_coverage is not None and suite.coverage.percent < min_coverage:
        return 1
    return 0


def named(source: Path, given: Sequence[Path]) -> list[tuple[str, Path]]:
    """The scripts to run with the names the output gives them: those given as written, or
    the folder's, relative to the workflow source."""
    if given:
        return [(str(path), path) for path in given]
    return [(str(path.relative_to(source)), path) for path in scripts_of(source)]
