"""deploy/components/gpu-operator and deploy/dra/components/gpu-operator, rendered by kustomize:
the plugin beside NVIDIA's GPU Operator (its driver root, its toolkit's CDI hook, its client
label); and deploy/components/node-feature (the NodeFeature object's permission and owner)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from kustomize_render import render

from sharing_plugin.observability.nodefeature import GROUP, PLURAL

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DRA = DEPLOY / "dra"
OPERATOR = DEPLOY / "components" / "gpu-operator"
DRA_OPERATOR = DRA / "components" / "gpu-operator"
TOOLKIT = "/usr/local/nvidia/toolkit"
DRIVER_ROOT = "/run/nvidia/driver"

pytestmark = [
    pytest.mark.kubectl,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed"),
]


def pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def check_operator_paths(spec: dict[str, Any]) -> dict[str, str]:
    """The driver root and the toolkit mounted read-only at their host paths; the hook path
    inside the toolkit mount. The container's env, returned."""
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in (DRIVER_ROOT, TOOLKIT):
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    assert mounts[DRIVER_ROOT]["mountPropagation"] == "HostToContainer"
    assert env["NVIDIA_CDI_HOOK_PATH"] == f"{TOOLKIT}/nvidia-cdi-hook"
    assert spec["nodeSelector"]["nvidia.com/gpu.deploy.client"] == "true"
    return env


def test_device_plugin_beside_the_operator() -> None:
    spec = pod(render(DEPLOY, [OPERATOR]))
    env = check_operator_paths(spec)
    # Enforced shares: the CDI spec where the runtime reads it, written by the plugin.
    (container,) = spec["containers"]
    cdi = next(m for m in container["volumeMounts"] if m["mountPath"] == env["CDI_DIR"])
    assert not cdi.get("readOnly", False)
    (volume,) = [v for v in spec["volumes"] if v["name"] == cdi["name"]]
    assert volume["hostPath"]["path"] == "/var/run/cdi"
    # The base's GPU-node affinity still applies; the label only narrows it.
    assert spec["affinity"] == pod(render(DEPLOY))["affinity"]


def test_run_dra_beside_the_operator() -> None:
    spec = pod(render(DRA, [DRA_OPERATOR]))
    check_operator_paths(spec)
    assert spec["nodeSelector"]["gpu.sharing-plugin.io/dra"] == "true"  # kept


def test_operator_component_composes_with_the_others() -> None:
    docs = render(DEPLOY, ["usage", "node-feature", "labels", OPERATOR])
    spec = pod(docs)
    check_operator_paths(spec)
    (container,) = spec["containers"]
    names = [m["name"] for m in container["volumeMounts"]]
    assert len(names) == len(set(names))


def test_node_feature_component_grants_its_objects_and_names_the_pod() -> None:
    docs = render(DEPLOY, ["node-feature"])
    (container,) = pod(docs)["containers"]
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert fields["POD_NAME"] == "metadata.name"
    assert fields["POD_UID"] == "metadata.uid"
    assert fields["POD_NAMESPACE"] == "metadata.namespace"
    (role,) = [
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("features")
    ]
    assert role["rules"] == [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "create", "patch", "delete"]}
    ]
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert role["metadata"]["namespace"] == account["metadata"]["namespace"]
    # Only with the component: the base grants nothing of NFD's.
    assert GROUP not in str([d.get("rules") for d in render(DEPLOY)])
