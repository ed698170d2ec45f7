"""Regenerate the gRPC stubs in core/rpc/ from proto/ (``make proto``).

One pinned generator (grpcio-tools from the project's environment, plus mypy-protobuf for the
.pyi stubs), so the committed output is reproducible; a test regenerates into a scratch
folder and compares, catching drift.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
SOURCE = "registry_coordinator/v1/coordinator.proto"
OUT = ROOT / "core" / "rpc"
GENERATED = (
    "coordinator_pb2.py",
    "coordinator_pb2.pyi",
    "coordinator_pb2_grpc.py",
    "coordinator_pb2_grpc.pyi",
)


def generate(out_dir: Path) -> None:
    """Write the generated modules into ``out_dir``."""
    with tempfile.TemporaryDirectory() as scratch:
        plugin = Path(sys.executable).with_name("protoc-gen-mypy")
        plugin_grpc = Path(sys.executable).with_name("protoc-gen-mypy_grpc")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"--python_out={scratch}",
                f"--grpc_python_out={scratch}",
                f"--plugin=protoc-gen-mypy={plugin}",
                f"--plugin=protoc-gen-mypy_grpc={plugin_grpc}",
                f"--mypy_out={scratch}",
                f"--mypy_grpc_out={scratch}",
                SOURCE,
            ],
            check=True,
        )
        made = Path(scratch) / "registry_coordinator" / "v1"
        for name in GENERATED:
            text = (made / name).read_text()
            # Generated code imports its sibling by proto path; we ship it inside core.rpc.
            text = text.replace(
                "from registry_coordinator.v1 import coordinator_pb2",
                "from core.rpc import coordinator_pb2",
            )
            (out_dir / name).write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    generate(args.out)
    print(f"generated {', '.join(GENERATED)} in {args.out}")


if __name__ == "__main__":
    main()
