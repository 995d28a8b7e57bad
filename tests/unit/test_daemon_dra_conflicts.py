"""Which of run-dra's names a device plugin serves, by the Node's allocatable, and the error."""

from __future__ import annotations

from pathlib import Path

from sharing_plugin.daemon.run_dra.conflicts import conflict_message, served_by_a_device_plugin


def test_only_names_with_a_count_above_zero_are_served() -> None:
    allocatable = {
        "cpu": "8",
        "nvidia.com/gpu": "4",
        "nvidia.com/gpu.shared": "0",  # the plugin went away: the kubelet keeps the name at 0
        "nvidia.com/mig-1g.10gb": "2",
    }
    names = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-3g.40gb", "cpu"]
    assert served_by_a_device_plugin(names, allocatable) == ["cpu", "nvidia.com/gpu"]
    assert served_by_a_device_plugin(["nvidia.com/gpu"], {}) == []
    assert served_by_a_device_plugin(["x.io/y"], {"x.io/y": "1k"}) == ["x.io/y"]


def test_the_message_names_what_serves_and_what_to_do() -> None:
    root = Path("/var/lib/kubelet")
    assert conflict_message(node="n", kubelet_dir=root, sockets=[], served={}) is None
    message = conflict_message(
        node="gpu-1",
        kubelet_dir=root,
        sockets=[root / "device-plugins" / "sharing-nvidia.com-gpu-0123abcd.sock"],
        served={"nvidia.com/gpu": "4"},
    )
    assert message is not None
    assert "sharing-nvidia.com-gpu-0123abcd.sock in /var/lib/kubelet/device-plugins" in message
    assert "node gpu-1 has nvidia.com/gpu: 4 allocatable" in message
    assert "stop the device plugin on this node first" in message
