"""deploy/components/mps: the mps-control container beside the plugin, rendered by kustomize."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from kustomize_render import render

from sharing_plugin.cli.mps import FLAGS
from sharing_plugin.config.model import Flags, SharingKind
from sharing_plugin.gpus.inventory import GpuUuid
from sharing_plugin.plan.allocate import allocate
from sharing_plugin.plan.model import DeviceId, ResourcePlan, VirtualDevice
from sharing_plugin.plan.mps import resource_root

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPONENT = DEPLOY / "components" / "mps"
MPS_ENV_VARS = {env for _, env, _, _ in FLAGS}

pytestmark = [
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed"),
    pytest.mark.kubectl,
]


def rendered(tmp_path: Path, *components: Path) -> dict[str, Any]:
    """The DaemonSet's pod spec, through an overlay outside deploy/ as an admin writes it."""
    (daemonset,) = [d for d in render(DEPLOY, components) if d["kind"] == "DaemonSet"]
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["containers"]}


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container["volumeMounts"]}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container["env"]}


def test_mps_control_runs_beside_the_plugin_sharing_ipc_and_mps_root(tmp_path: Path) -> None:
    pod = rendered(tmp_path, COMPONENT)
    assert pod["hostIPC"] is True
    plugin, control = containers(pod)["sharing-plugin"], containers(pod)["mps-control"]
    assert control["command"] == ["sharing-plugin", "mps-control"]
    assert control["image"] == plugin["image"]

    volumes = {v["name"]: v for v in pod["volumes"]}
    mps_root = Flags().mps_root  # the config's default
    assert volumes["mps-root"]["hostPath"]["path"] == mps_root
    # The same path inside both containers as on the host: Allocate hands pods the host path.
    for container in (plugin, control):
        assert mounts(container)["mps-root"]["mountPath"] == mps_root
    # Only mps-control writes there; the plugin reads the state files.
    assert not mounts(control)["mps-root"].get("readOnly", False)
    assert mounts(plugin)["mps-root"]["readOnly"] is True
    # /dev/shm of the daemon is the host directory Allocate mounts at /dev/shm in clients.
    device = VirtualDevice(
        id=DeviceId("GPU-0::0"),
        physical="GPU-0",
        gpu_uuid=GpuUuid("GPU-0"),
        index="0",
        numa=None,
        paths=(),
        replica=0,
        replicas=2,
    )
    given = allocate(
        ResourcePlan("nvidia.com/gpu", (device,), sharing=SharingKind.MPS), ["GPU-0::0"], Flags()
    )
    shm = {m.container_path: m.host_path for m in given.mounts}["/dev/shm"]
    assert volumes["mps-shm"]["hostPath"]["path"] == shm
    assert mounts(control)["mps-shm"]["mountPath"] == "/dev/shm"
    pipe = {m.container_path: m.host_path for m in given.mounts}["/mps/nvidia.com/gpu/pipe"]
    assert pipe == f"{resource_root(mps_root, 'nvidia.com/gpu')}/pipe"
    assert pipe.startswith(mounts(control)["mps-root"]["mountPath"] + "/")


def test_mps_control_reads_the_plugins_config_and_pod_resources(tmp_path: Path) -> None:
    pod = rendered(tmp_path, COMPONENT)
    plugin, control = containers(pod)["sharing-plugin"], containers(pod)["mps-control"]
    names = set(env(control))
    unknown = {n for n in names if n not in MPS_ENV_VARS | {"POD_NAMESPACE"}}
    assert not {n for n in unknown if not n.startswith("NVIDIA_")}, unknown
    for same in ("CONFIG_MAP", "CONFIG_FILE", "NODE_NAME", "KUBELET_DIR", "GPUS"):
        assert env(control)[same] == env(plugin)[same]
    assert "compute" in env(control)["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")
    assert env(control)["MPS_CONTROL_BIN"]["value"] == "nvidia-cuda-mps-control"
    kubelet_dir = env(control)["KUBELET_DIR"]["value"]
    assert mounts(control)["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": f"{kubelet_dir}/pod-resources",
        "readOnly": True,
    }
    assert mounts(control)["config"] == mounts(plugin)["config"]
    assert control["securityContext"]["readOnlyRootFilesystem"] is True
    assert mounts(control)["tmp"]["mountPath"] == "/tmp"  # tempfile for the binary's output


def test_mps_combines_with_the_other_components(tmp_path: Path) -> None:
    components = DEPLOY / "components"
    pod = rendered(
        tmp_path,
        COMPONENT,
        components / "runtime-class-nvidia",
        components / "image",
        components / "kubelet-dir-k0s",
    )
    assert pod["runtimeClassName"] == "nvidia"
    for container in pod["containers"]:
        assert container["image"].startswith("registry.example.com/")
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Inside mps-control the socket is where its KUBELET_DIR says, whatever the host path.
    control = containers(pod)["mps-control"]
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    assert mounts(control)["pod-resources"]["mountPath"] == (
        env(control)["KUBELET_DIR"]["value"] + "/pod-resources"
    )
