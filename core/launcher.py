"""The ``coordinator`` service launcher.

PRELIMINARY: serving (the five gRPC components) lands with the serving-core work. Until then
the launcher prints its version and refuses to serve with a clear line on standard error.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from core import __version__

COMPONENTS = ("gateway", "admission", "dispatcher", "recovery", "auditd")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordinator", description="Registry Coordinator.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--runtime-config", metavar="FILE", help="the runtime file")
    parser.add_argument(
        "--recovery-only",
        action="store_true",
        help="gateway, recovery and auditd only: admits nothing and never dispatches",
    )
    parser.add_argument("--component", choices=COMPONENTS, help="run one component")
    return parser


def main(argv: list[str] | None = None) -> NoReturn:
    """Parse arguments; serve (not yet available in this version)."""
    args = _parser().parse_args(argv)
    if args.version:
        print(__version__)
        sys.exit(0)
    if not args.runtime_config:
        _parser().error("--runtime-config FILE is required")
    sys.stderr.write("deployment.refused: this build does not serve yet (offline commands only)\n")
    sys.exit(1)
