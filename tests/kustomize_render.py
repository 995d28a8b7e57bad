"""deploy/ rendered by `kubectl kustomize`, as a cluster admin renders it: the base or an overlay
of it, and components used the way an admin's overlay uses them (from outside deploy/, since
kustomize refuses an overlay inside its base).

kubectl takes ~0.35 s of CPU per render and many tests read the same render, so each distinct
one runs once per test run: pytest-xdist's workers share the result through a directory made for
the run (a lock makes a second worker wait for the first instead of rendering again);
every caller gets freshly parsed documents to keep or change. `daemonset_env` is the rendered
DaemonSet's container env as the kubelet hands it over on a node.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
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
# A directory every test process of one run shares (made by tests/conftest.py).
SHARED_DIR_ENV = "SHARING_PLUGIN_TEST_SHARED_DIR"

_overlays = tempfile.TemporaryDirectory(prefix="kustomize-overlays-")


def render(root: Path = DEPLOY, components: Iterable[str | Path] = ()) -> list[dict[str, Any]]:
    """The documents of `root` through an overlay using `components` (names under
    deploy/components/, or paths); with no components, `root` itself."""
    return [doc for doc in yaml_fast.load_all(render_text(root, components)) if doc is not None]


def render_text(root: Path = DEPLOY, components: Iterable[str | Path] = ()) -> str:
    """What `kubectl kustomize` prints for `render(root, components)`."""
    paths = tuple(str(c if isinstance(c, Path) else COMPONENTS / c) for c in components)
    return _shared_render(str(root), paths)


@functools.cache
def _shared_render(root: str, components: tuple[str, ...]) -> str:
    shared = os.environ.get(SHARED_DIR_ENV)
    if shared is None:  # run without the suite's conftest: nothing to share
        return _render(root, components)
    # Named by the paths, not by the files' contents: the directory lives for one run, and a
    # test that writes its own component renders a path no other test uses.
    key = hashlib.sha256(repr((root, components)).encode()).hexdigest()[:16]
    done = Path(shared) / f"kustomize-{key}.yaml"
    with open(Path(shared) / f"kustomize-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return done.read_text()
        text = _render(root, components)
        partial = done.with_suffix(".partial")
        partial.write_text(text)
        partial.rename(done)
        return text


def daemonset_env(docs: list[dict[str, Any]], *, node: str) -> dict[str, str]:
    """The env of the rendered DaemonSet's container as kubelet hands it over on `node`: downward
    API values filled in, `$(VAR)` expanded from the variables before it."""
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    fields = {"spec.nodeName": node, "metadata.namespace": daemonset["metadata"]["namespace"]}
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)),
                str(item["value"]),
            )
    return env


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
