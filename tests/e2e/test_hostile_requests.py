"""Hostile gRPC input against the real `sharing-plugin run` process: memory stays bounded.

Issue 16: ten refused Allocates of ~10 MiB each took the plugin from 63 to 366 MiB of RSS (the
DaemonSet's limit is 256 Mi), because `context.abort()` left every refused request in a reference
cycle that only a full garbage collection frees. The peak (VmHWM) is what the kernel's OOM killer
would have seen, so it is what is checked.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from plugin_process import PluginProcess

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

pytestmark = pytest.mark.subprocess

GPU = "nvidia.com/gpu"
MIB = 1024 * 1024
REQUESTS = 30  # with the old abort() refusal, 20 already peaked at 187 MiB and 50 at 275 MiB
PEAK_RSS_LIMIT_MIB = 150
START_S = 10.0


def allocate_request(size: int) -> dp.AllocateRequest:
    """An Allocate naming unknown device IDs, serialised to at most `size` bytes (within 64)."""
    # Each 41-character ID costs 43 bytes on the wire (tag, length, ID); framing takes < 16.
    ids = [f"GPU-hostile-{n:029d}" for n in range((size - 16) // 43)]
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    assert size - 64 < request.ByteSize() <= size
    return request


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def test_refused_4mib_requests_keep_peak_rss_bounded(
    kubelet: KubeletSimulator, short_dir: Path
) -> None:
    config = short_dir / "config.yaml"
    config.write_text("version: v1\n", encoding="utf-8")
    args = [
        "--config", str(config),
        "--gpus", "simulated:dgx-a100-80gb",
        "--kubelet-dir", str(short_dir),
        "--metrics-address", "off",
    ]  # fmt: skip
    async with PluginProcess(args) as plugin:
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8, timeout=START_S)
        (socket,) = kubelet.plugin_dir.glob("sharing-*.sock")
        just_under = allocate_request(4 * MIB - 4096)
        before = vm_kib(plugin.pid, "VmRSS")
        async with grpc.aio.insecure_channel(
            f"unix://{socket}", options=[("grpc.max_send_message_length", 8 * MIB)]
        ) as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            for _ in range(REQUESTS):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Allocate(just_under, timeout=10)
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "unknown device: GPU-hostile-" in (refused.value.details() or "")
            # Past the receive limit, gRPC refuses before anything is parsed.
            with pytest.raises(grpc.aio.AioRpcError) as too_large:
                await stub.Allocate(allocate_request(4 * MIB + 4096), timeout=10)
            assert too_large.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            # And the plugin still answers a real request.
            answer = await stub.Allocate(
                dp.AllocateRequest(
                    container_requests=[
                        dp.ContainerAllocateRequest(devices_ids=[next(iter(kubelet.devices(GPU)))])
                    ]
                ),
                timeout=5,
            )
            assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
        peak_mib = vm_kib(plugin.pid, "VmHWM") / 1024
        after_mib = vm_kib(plugin.pid, "VmRSS") / 1024
        print(f"RSS before {before / 1024:.1f} MiB, peak {peak_mib:.1f} MiB, after {after_mib:.1f}")
        assert peak_mib <= PEAK_RSS_LIMIT_MIB, (before / 1024, peak_mib, after_mib)
        assert await plugin.stop() == 0
