"""Mint an operator's or producer's access token into an owner-only file.

``python -m devstack.mint --issuer-state DIR --client-id X --sub Y --audience A --out FILE``

The token is signed with the key in the issuer's state folder, so it verifies against the
JWKS of a development issuer started on the same folder. The file is written with mode 0600
because coordinatorctl refuses token files that others can read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devstack.issuer import IssuerState, write_token_file

DEFAULT_LIFETIME_SECONDS = 12 * 3600
"""Long enough for a quickstart or a day of local work; a development token only."""


def mint_token_file(
    state_folder: Path,
    *,
    client_id: str,
    subject: str,
    audience: str,
    out: Path,
    scope: str = "",
    lifetime_seconds: int = DEFAULT_LIFETIME_SECONDS,
) -> None:
    """Sign a token with the issuer state's key and write it to ``out`` (mode 0600)."""
    state = IssuerState.open(state_folder)
    token = state.mint(
        client_id=client_id,
        subject=subject,
        audience=audience,
        scope=scope,
        lifetime_seconds=lifetime_seconds,
    )
    write_token_file(out, token)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m devstack.mint",
        description="Mint a development access token into an owner-only file.",
    )
    parser.add_argument("--issuer-state", type=Path, required=True, help="issuer state folder")
    parser.add_argument("--client-id", required=True, help="client_id claim (policy key)")
    parser.add_argument("--sub", required=True, help="sub claim (the principal)")
    parser.add_argument("--audience", required=True, help="aud claim (the coordinator URL)")
    parser.add_argument("--out", type=Path, required=True, help="token file to write (0600)")
    parser.add_argument("--scope", default="", help="space-separated scopes (optional)")
    parser.add_argument(
        "--lifetime-seconds", type=int, default=DEFAULT_LIFETIME_SECONDS, help="token lifetime"
    )
    args = parser.parse_args(argv)
    if args.lifetime_seconds <= 0:
        parser.error("--lifetime-seconds must be positive")
    try:
        mint_token_file(
            args.issuer_state,
            client_id=args.client_id,
            subject=args.sub,
            audience=args.audience,
            out=args.out,
            scope=args.scope,
            lifetime_seconds=args.lifetime_seconds,
        )
    except (ValueError, OSError) as exc:
        # ValueError names the folder; OSError names the path and errno, never the token.
        print(f"devstack.mint: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
