"""deploy/dra/ (rendered by kubectl kustomize) agrees with what `run-dra` expects and publishes."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml_fast
from kustomize_render import render

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.cli.dra import FLAGS
from sharing_plugin.config.loader import parse_configs
from sharing_plugin.errors import PlanError
from sharing_plugin.gpus.catalog import MODELS
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sim.nvml.node import preset_names
from sharing_plugin.views.dra import config_resource_names
from sharing_plugin.views.dra_api import V1, device_class

ROOT = Path(__file__).resolve().parents[2]
DRA = ROOT / "deploy" / "dra"
DRIVER = "gpu.sharing-plugin.io"

pytestmark = [
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
    pytest.mark.kubectl,
]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render(DRA)


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def example_resources() -> set[str]:
    """What the example ConfigMap gives: on every preset node, and on every catalogued MIG
    profile under its MIG configs."""
    configs = parse_configs((ROOT / "deploy" / "configmap.yaml").read_text(), file="cm")
    names = {
        "nvidia.com/mig-" + p.name.replace("+", ".")
        for m in MODELS
        if m.mig
        for p in m.mig.profiles
    }
    for preset in preset_names():
        inventory = discover(backend_from_spec(f"simulated:{preset}"))
        for loaded in configs.values():
            names |= config_resource_names(loaded.config)
            try:
                names |= {r.name for r in plan_node(loaded.config, inventory).plan.resources}
            except PlanError:
                continue  # a config for other GPUs (e.g. the A100 layout on a T4 node)
    return names


def test_one_device_class_per_example_resource_as_run_dra_names_them(
    rendered: list[dict[str, Any]],
) -> None:
    classes = of_kind(rendered, "DeviceClass")
    expected = sorted(example_resources())
    assert {"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"} <= set(expected)
    wanted = [device_class(n, DRIVER, api_version=V1) for n in expected]
    by_name = {c["metadata"]["name"]: c for c in classes}
    assert len(by_name) == len(classes) == len(wanted)
    # Each claims its resource name as extended resource, and no two claim the same one (the
    # API server would take both, and the scheduler only the newer).
    claimed = [c["spec"]["extendedResourceName"] for c in classes]
    assert sorted(claimed) == expected
    for document in wanted:
        found = by_name.get(document["metadata"]["name"])
        assert found is not None, f"deploy/dra has no DeviceClass {document['metadata']['name']}"
        labels = found["metadata"].pop("labels")
        assert labels == {"app.kubernetes.io/part-of": "gpu-sharing-plugin"}
        assert found == document  # cluster-scoped: no namespace given by kustomize


def test_the_configmap_is_the_example_one() -> None:
    ours = yaml_fast.load((DRA / "plugin" / "configmap.yaml").read_text())
    base = yaml_fast.load((ROOT / "deploy" / "configmap.yaml").read_text())
    assert ours == base


def test_the_daemonset_runs_run_dra_with_its_flags(rendered: list[dict[str, Any]]) -> None:
    (daemonset,) = of_kind(rendered, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["sharing-plugin", "run-dra"]
    env = {e["name"]: e for e in container["env"]}
    known = {flag[1] for flag in FLAGS} | {"POD_NAMESPACE"}
    unknown = {n for n in env if n not in known and not n.startswith("NVIDIA_")}
    assert not unknown, f"run-dra reads no such env var: {sorted(unknown)}"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    kubelet = PurePosixPath(env["KUBELET_DIR"]["value"])
    mounts = {m["name"]: PurePosixPath(m["mountPath"]) for m in container["volumeMounts"]}
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert mounts["plugins-registry"] == kubelet / "plugins_registry"
    assert mounts["plugins"] == kubelet / "plugins"
    assert mounts["cdi"] == PurePosixPath(env["CDI_DIR"]["value"])
    # Read-only: run-dra only connects to the device plugin's sockets there (a refusal to start).
    assert mounts["device-plugins"] == kubelet / "device-plugins"
    readonly = {m["name"] for m in container["volumeMounts"] if m.get("readOnly")}
    assert "device-plugins" in readonly
    for name in ("plugins-registry", "plugins", "cdi", "device-plugins"):
        assert PurePosixPath(host[name]) == mounts[name], f"{name}: same path as on the host"
    assert pod["serviceAccountName"] == "sharing-plugin-dra"
    port = int(env["METRICS_ADDRESS"]["value"].rpartition(":")[2])
    assert container["livenessProbe"]["httpGet"]["port"] == port


def test_rbac_is_what_run_dra_uses(rendered: list[dict[str, Any]]) -> None:
    (role,) = of_kind(rendered, "ClusterRole")
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("", "nodes"): ["get", "list", "watch"],
        ("resource.k8s.io", "resourceslices"): ["create", "delete", "list", "update"],
        ("resource.k8s.io", "resourceclaims"): ["get"],
        ("", "events"): ["create", "patch"],  # Node events: created, a repeat's count patched
    }
    (binding,) = of_kind(rendered, "ClusterRoleBinding")
    (account,) = of_kind(rendered, "ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    (config_role,) = of_kind(rendered, "Role")
    assert config_role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["sharing-plugin-config"],
            "verbs": ["get", "list", "watch"],
        }
    ]
