"""The committed gRPC stubs are exactly what `make proto` generates from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (
    "coordinator_pb2.py",
    "coordinator_pb2.pyi",
    "coordinator_pb2_grpc.py",
    "coordinator_pb2_grpc.pyi",
)


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in GENERATED:
        committed = (ROOT / "core" / "rpc" / name).read_text()
        fresh = (tmp_path / name).read_text()
        assert committed == fresh, f"core/rpc/{name} is stale: run make proto"
