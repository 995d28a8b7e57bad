"""Regenerate the committed gRPC code of both API trees from their .proto files.

    .venv/bin/python scripts/generate_api.py            # rewrite the committed files (make api)
    .venv/bin/python scripts/generate_api.py OUT_DIR    # write both trees under OUT_DIR

The trees are `sharing_plugin/kubelet/api/` (device plugin v1beta1, PodResources v1) and
`sharing_plugin/dra/api/` (plugin registration v1, DRA v1beta1 and v1, DRA resource health
v1alpha1); every `.proto` under them is an input. The generated `_pb2.py`, `_pb2_grpc.py` and
their `.pyi` stubs are committed so that installing the plugin needs no protoc; a test runs this
script into a temporary directory and compares bytes, which catches a hand edit, a .proto change
that was not regenerated, and generated files left behind by a removed .proto.

protoc runs once, with the repository root as its import path, so each file is registered in
the descriptor pool under its full package path (the six `api.proto` never clash) and each
generated `_pb2_grpc` imports its `_pb2` as `from sharing_plugin.<adapter>.api... import api_pb2`.
The script lives outside the package: the wheel carries the generated code, not its generator.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("sharing_plugin/kubelet/api", "sharing_plugin/dra/api")
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def protos() -> list[str]:
    """Every .proto of both trees, relative to the repository root, in a stable order."""
    return sorted(
        str(p.relative_to(ROOT)) for tree in TREES for p in (ROOT / tree).rglob("*.proto")
    )


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed next to this interpreter (mypy-protobuf's)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install the dev extras (pip install -e '.[dev]')")
    return found


def generate(out_dir: Path | None = None) -> list[Path]:
    """Run protoc on every .proto of both trees, writing under `out_dir` (default: in place).
    Returns the files written."""
    import grpc_tools
    from grpc_tools import protoc

    out = (out_dir or ROOT).resolve()
    inputs = protos()
    for proto in inputs:
        (out / proto).parent.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={ROOT}",
        f"--proto_path={well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(ROOT / proto) for proto in inputs),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    return [out / (proto.removesuffix(".proto") + s) for proto in inputs for s in SUFFIXES]


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else None
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
