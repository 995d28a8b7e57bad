"""Regenerate the kubelet DRA plugin API Python code from the .proto files in this package.

    python -m sharing_plugin.dra.api.generate            # rewrite the committed files
    python -m sharing_plugin.dra.api.generate OUT_DIR    # write the tree under OUT_DIR

The generated `_pb2.py`, `_pb2_grpc.py` and their `.pyi` stubs are committed so that installing
the plugin needs no protoc. A test regenerates them into a temporary directory and compares
bytes, which catches a hand edit and a .proto change that was not regenerated.

protoc runs with the repository root as its only import path, so each file is registered in the
descriptor pool under its full package path (the three `api.proto` never clash, nor with the
device plugin API's) and the generated `_pb2_grpc` imports its `_pb2` as
`from sharing_plugin.dra.api... import api_pb2`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

PROTOS = (
    "sharing_plugin/dra/api/pluginregistration/v1/api.proto",
    "sharing_plugin/dra/api/dra/v1beta1/api.proto",
    "sharing_plugin/dra/api/dra/v1/api.proto",
)

# Every file that generate() writes, relative to the repository root.
GENERATED = tuple(
    proto.removesuffix(".proto") + suffix
    for proto in PROTOS
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
)


def source_root() -> Path:
    """The directory that holds the `sharing_plugin` package (the repository root)."""
    return Path(__file__).resolve().parents[3]


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
    """Run protoc on PROTOS, writing under `out_dir` (default: in place). Returns the files."""
    import grpc_tools
    from grpc_tools import protoc

    root = source_root()
    out = (out_dir or root).resolve()
    for proto in PROTOS:
        (out / proto).parent.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={root}",
        f"--proto_path={well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(root / proto) for proto in PROTOS),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    return [out / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else None
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
