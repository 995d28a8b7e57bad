"""deploy/ and deploy/dra/ with the GPU Operator and NodeFeature components, as a real
kube-apiserver validates them (tests/realapi.py): every rendered object applied with
`kubectl apply --server-side --dry-run=server`, so that the server's own validation (the pod
spec's volumes, mounts, propagation, node selector; the RBAC objects) accepts what an admin's
overlay would apply, and nothing is stored. Skipped where ../shared/tools or kubectl is absent.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import realapi
from kustomize_render import render
from realapi_support import applied

pytestmark = [
    pytest.mark.realtools,
    pytest.mark.kubectl,
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DRA = DEPLOY / "dra"

OVERLAYS: dict[str, tuple[Path, list[str | Path]]] = {
    "gpu-operator": (DEPLOY, ["gpu-operator"]),
    "gpu-operator+node-feature+usage+labels": (
        DEPLOY,
        ["gpu-operator", "node-feature", "usage", "labels"],
    ),
    "node-feature": (DEPLOY, ["node-feature"]),
    "dra+gpu-operator": (DRA, [DRA / "components" / "gpu-operator"]),
}


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_server_accepts_every_object_of_the_overlay(
    real_api: realapi.RealApi, overlay: str
) -> None:
    root, components = OVERLAYS[overlay]
    docs = render(root, components)
    said = applied(real_api, docs, dry_run=True)
    kinds = {d["kind"] for d in docs}
    assert "DaemonSet" in kinds
    assert said.count("(server dry run)") == len(docs), said
