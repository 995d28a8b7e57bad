"""A dynamic MIG claim NVML refuses, through real Kubernetes 1.36 code (`realdra136`: the
allocator and the kubelet's DRA manager; its README in ../shared/tools). The plugin runs
in-process here, so the test can take a GPU's slices behind its back (as `nvidia-smi mig -cgi`
would): the allocator then grants a placement the GPU cannot hold, and the kubelet must get
NVML's reason as that claim's error. Skipped where the tools are absent; CI has them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightkube
import pytest
import realdra
from support.observe import recording_backend

from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.daemon.run_dra.driver import DraDriver, DraOptions
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.mig_ops import create_compute_instance, create_gpu_instance

DRIVER = realdra.DRIVER
NODE = "node-1"
GPUS = "simulated:a100-mig-mixed"  # GPU 3: A100-SXM4-80GB, MIG on, empty
CONFIG = "version: v1\npartitioning:\n  mig:\n    - devices: [3]\n      dynamic: true\n"

pytestmark = [
    pytest.mark.skipif(
        not realdra.available("realdra136"), reason=realdra.skip_reason("realdra136")
    ),
    pytest.mark.realtools,
]


async def test_a_claim_nvml_refuses_gets_nvmls_reason_at_the_kubelet(short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    nvml = recording_backend(GPUS)
    gpu = discover(nvml).gpus[3].uuid
    options = DraOptions(
        source=SourceOptions(config_path=config, gpus=GPUS, kubelet_dir=short_dir, node_name=NODE),
        driver_name=DRIVER,
        cdi_dir=short_dir / "cdi",
    )
    async with realdra.running("realdra136", short_dir, node=NODE) as real:
        client = lightkube.AsyncClient(config=lightkube.KubeConfig.from_file(real.kubeconfig))
        try:
            async with DraDriver(options, nvml=nvml, kube_client=client):
                await real.ok({"cmd": "wait-plugin", "driver": DRIVER, "timeout": 15})
                await real.wait_slices(5 + 25)  # five whole GPUs, GPU 3's placements
                await real.create(_class())
                # Slice 0 taken behind the plugin's back: its pool still offers the 7g.
                gi = create_gpu_instance(nvml, gpu, profile_index=0, start=0)
                create_compute_instance(nvml, gpu, gi_id=gi, ci_profile_index=0)
                before = len(nvml.mig_calls)
                await real.claim_for_pod("seven", {"deviceClassName": "seven"}, node=NODE)
                await real.ok({"cmd": "allocate", "pod": {"namespace": "default", "name": "seven"}})
                answer = await real.cmd(
                    {"cmd": "prepare", "pod": {"namespace": "default", "name": "seven"}}
                )
                assert answer["ok"] is False
                assert "creating MIG instance 7g.80gb@0 on GPU 3" in answer["error"]
                assert "NVML_ERROR_INSUFFICIENT_RESOURCES" in answer["error"]
                assert [(c.op, c.result) for c in nvml.mig_calls[before:]] == [
                    ("create_gpu_instance", "NVML_ERROR_INSUFFICIENT_RESOURCES")
                ]
                assert [f"{g.spec.name}@{g.start}" for g in nvml.gpus[3].gpu_instances] == [
                    "1g.10gb@0"
                ]
                assert not list((short_dir / "cdi").glob("*.json"))
        finally:
            await client.close()


def _class() -> dict[str, Any]:
    expression = (
        f'device.driver == "{DRIVER}" && '
        f'device.attributes["{DRIVER}"].resource == "nvidia.com/mig-7g.80gb"'
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "seven"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
