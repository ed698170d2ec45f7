"""Regenerate docs/pictures/<example>.svg, the picture of each example workflow, and
docs/pictures/<example>-coverage.svg, what its shipped simulations cover.

The first is what ``coordinatorctl workflow graph examples/<example>`` prints, the second
what ``coordinatorctl workflow test examples/<example> --coverage-svg`` writes. They are
committed (docs/authoring.md shows them); a test regenerates them and compares, catching drift.

    python scripts/gen_workflow_pictures.py            # rewrite docs/pictures/*.svg
    python scripts/gen_workflow_pictures.py --out DIR  # write them into DIR instead
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli import suite
from core.workflow.graph import read_folder, render

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TARGET = ROOT / "docs" / "pictures"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TARGET, help="folder to write into")
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted(p.parent for p in EXAMPLES.glob("*/workflow.yaml")):
        workflow = read_folder(source)
        target = out / f"{source.name}.svg"
        target.write_text(render(workflow, "svg"), encoding="utf-8")
        print(target)
        tested = suite.run_suite(workflow, suite.named(source, []))
        target = out / f"{source.name}-coverage.svg"
        target.write_text(tested.coverage.picture(), encoding="utf-8")
        print(target)


if __name__ == "__main__":
    main()
