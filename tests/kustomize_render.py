"""deploy/ rendered by `kubectl kustomize`, as a cluster admin renders it: the base or an overlay
of it, and components used the way an admin's overlay uses them (from outside deploy/, since
kustomize refuses an overlay inside its base).

kubectl takes ~0.35 s of CPU per render and many tests read the same render, so each distinct
one runs once per test process; every caller gets freshly parsed documents to keep or change.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
import yaml_fast

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPONENTS = DEPLOY / "components"
HAS_KUBECTL = shutil.which("kubectl") is not None

_overlays = tempfile.TemporaryDirectory(prefix="kustomize-overlays-")


def render(root: Path = DEPLOY, components: Iterable[str | Path] = ()) -> list[dict[str, Any]]:
    """The documents of `root` through an overlay using `components` (names under
    deploy/components/, or paths); with no components, `root` itself."""
    paths = tuple(str(c if isinstance(c, Path) else COMPONENTS / c) for c in components)
    return [doc for doc in yaml_fast.load_all(_render(str(root), paths)) if doc is not None]


@functools.cache
def _render(root: str, components: tuple[str, ...]) -> str:
    target = Path(root)
    if components:
        target = Path(tempfile.mkdtemp(dir=_overlays.name))
        (target / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(root, target)],
                    "components": [os.path.relpath(c, target) for c in components],
                }
            )
        )
    out = subprocess.run(
        ["kubectl", "kustomize", str(target)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout
