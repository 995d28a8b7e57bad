"""The committed gRPC code of both API trees is exactly what the generator script makes from the
committed .proto files, and nothing else generated is committed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "generate_api.py"
TREES = ("sharing_plugin/kubelet/api", "sharing_plugin/dra/api")
GENERATED = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py", "*_pb2_grpc.pyi")


def generated_under(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for tree in TREES
        for pattern in GENERATED
        for p in (root / tree).rglob(pattern)
    }


def test_regenerating_both_trees_gives_the_committed_bytes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    written = {str(Path(line).relative_to(tmp_path)) for line in done.stdout.splitlines()}
    committed = generated_under(ROOT)
    # Four files for each .proto: device plugin, PodResources, registration, DRA v1beta1, v1,
    # DRA resource health v1alpha1.
    assert len(committed) == 24
    assert written == generated_under(tmp_path) == committed
    differing = sorted(
        name for name in written if (tmp_path / name).read_bytes() != (ROOT / name).read_bytes()
    )
    assert not differing, (
        f"generated API code differs from the committed files: {differing}; "
        "run `make api` and commit the result"
    )
