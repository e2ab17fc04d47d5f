"""Regenerate the protocol stubs: `python tools/genproto.py [OUTDIR]`.

Runs protoc from grpcio-tools (pinned to the grpcio floor in pyproject's dev group) with
mypy-protobuf for the `.pyi` files. Without OUTDIR it writes beside the sources in
`proto/`; the drift test passes a temporary folder and compares.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
SOURCES = sorted((PROTO_ROOT / "rlslice" / "v1alpha1").glob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Generate stubs for every .proto into `out`; return the files written."""
    out.mkdir(parents=True, exist_ok=True)
    plugin = Path(sys.executable).with_name("protoc-gen-mypy")
    plugin_grpc = Path(sys.executable).with_name("protoc-gen-mypy_grpc")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={plugin}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_grpc}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *[str(s.relative_to(PROTO_ROOT)) for s in SOURCES],
    ]
    subprocess.run(cmd, check=True, cwd=PROTO_ROOT)
    return sorted(p for p in (out / "rlslice" / "v1alpha1").iterdir() if p.is_file())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT
    for path in generate(target):
        print(path.relative_to(target))
