"""deploy/dra/components/mps: the mps-control container beside run-dra, rendered by kustomize,
agreeing with the MPS paths a claim's CDI edits hand the client."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from kustomize_render import render

from sharing_plugin.cli.mps import FLAGS as MPS_FLAGS
from sharing_plugin.config.model import Flags, SharingKind
from sharing_plugin.gpus.inventory import GpuUuid
from sharing_plugin.plan.model import DeviceId, Plan, ResourcePlan, VirtualDevice
from sharing_plugin.views.cdi import claim_spec
from sharing_plugin.views.dra import DraDevice
from sharing_plugin.views.dra_attributes import GpuFacts

ROOT = Path(__file__).resolve().parents[2]
DRA = ROOT / "deploy" / "dra"
COMPONENT = DRA / "components" / "mps"
MPS_ENV_VARS = {flag[1] for flag in MPS_FLAGS}

pytestmark = [
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed"),
    pytest.mark.kubectl,
]


def pod() -> dict[str, Any]:
    (daemonset,) = [d for d in render(DRA, [COMPONENT]) if d["kind"] == "DaemonSet"]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in items}


def mps_claim_mounts(mps_root: str) -> dict[str, str]:
    """Container path -> host path of the mounts a prepared MPS claim's CDI spec gives."""
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
    resource = ResourcePlan("nvidia.com/gpu", (device,), sharing=SharingKind.MPS)
    dra_device = DraDevice(
        name="gpu-0",
        resource="nvidia.com/gpu",
        sharing="mps",
        device=device,
        facts=GpuFacts("NVIDIA A100-SXM4-80GB"),
        gpu_index=0,
        mig_profile=None,
        memory_mib=81920,
    )
    spec = claim_spec(
        driver="gpu.sharing-plugin.io",
        claim_uid="uid",
        devices=[dra_device],
        plan=Plan(resources=(resource,)),
        flags=Flags(mps_root=mps_root),
    )
    (edits,) = [d["containerEdits"] for d in spec["devices"]]
    return {m["containerPath"]: m["hostPath"] for m in edits.get("mounts", ())}


def test_mps_control_runs_beside_run_dra_sharing_ipc_and_mps_root() -> None:
    spec = pod()
    assert spec["hostIPC"] is True
    containers = by_name(spec["containers"])
    plugin, control = containers["sharing-plugin-dra"], containers["mps-control"]
    assert control["command"] == ["sharing-plugin", "mps-control"]
    assert control["image"] == plugin["image"]
    volumes = by_name(spec["volumes"])
    mounts = by_name(control["volumeMounts"])
    mps_root = Flags().mps_root  # the config's default
    assert volumes["mps-root"]["hostPath"]["path"] == mps_root
    assert mounts["mps-root"]["mountPath"] == mps_root and not mounts["mps-root"].get("readOnly")
    # What a claim's CDI edits mount into the client are the directories the daemons use.
    given = mps_claim_mounts(mps_root)
    assert given["/dev/shm"] == volumes["mps-shm"]["hostPath"]["path"]
    assert mounts["mps-shm"]["mountPath"] == "/dev/shm"
    assert given["/mps/nvidia.com/gpu/pipe"].startswith(mounts["mps-root"]["mountPath"] + "/")


def test_mps_control_reads_run_dras_config_as_its_service_account_allows() -> None:
    spec = pod()
    containers = by_name(spec["containers"])
    plugin, control = containers["sharing-plugin-dra"], containers["mps-control"]
    env, plugin_env = by_name(control["env"]), by_name(plugin["env"])
    unknown = {n for n in env if n not in MPS_ENV_VARS | {"POD_NAMESPACE"}}
    assert not {n for n in unknown if not n.startswith("NVIDIA_")}, unknown
    for same in ("CONFIG_MAP", "CONFIG_FILE", "NODE_NAME", "KUBELET_DIR", "GPUS", "DRIVER_NAME"):
        assert env[same] == plugin_env[same]
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")
    # Limits come from each claim's consumed capacity (its CDI edits), not from the daemons.
    assert env["MPS_LIMITS_FROM"]["value"] == "claims"
    mounts = by_name(control["volumeMounts"])
    kubelet_dir = env["KUBELET_DIR"]["value"]
    assert mounts["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": f"{kubelet_dir}/pod-resources",
        "readOnly": True,
    }
    volumes = by_name(spec["volumes"])
    assert volumes["pod-resources"]["hostPath"]["path"] == f"{kubelet_dir}/pod-resources"
    # run-dra's checkpoint, where the claims holding a daemon are: read, never written.
    driver = env["DRIVER_NAME"]["value"]
    assert mounts["dra-plugin"] == {
        "name": "dra-plugin",
        "mountPath": f"{kubelet_dir}/plugins/{driver}",
        "readOnly": True,
    }
    assert volumes["dra-plugin"]["hostPath"]["path"] == f"{kubelet_dir}/plugins/{driver}"
    assert mounts["config"] == by_name(plugin["volumeMounts"])["config"]
    assert mounts["tmp"]["mountPath"] == "/tmp"
    assert control["securityContext"]["readOnlyRootFilesystem"] is True
    # One pod, one ServiceAccount: deploy/dra/plugin's RBAC covers mps-control's config feed.
    assert spec["serviceAccountName"] == "sharing-plugin-dra"


def test_without_the_component_run_dra_runs_alone() -> None:
    (daemonset,) = [d for d in render(DRA) if d["kind"] == "DaemonSet"]
    spec = daemonset["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["sharing-plugin-dra"]
    assert "hostIPC" not in spec
