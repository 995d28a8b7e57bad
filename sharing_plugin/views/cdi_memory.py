"""The CDI spec `run` writes for enforced shares: one device per GPU that caps memory.

A container given capped replicas is answered with `NVIDIA_GPU_MEMORY_REQUEST/LIMIT` and the
CDI device of each of its GPUs (docs/contract.md, "Enforced shares"). The runtime resolves those
devices from this spec: each carries the container toolkit's `createRuntime` hook
`apply-cuda-memory-limits` for its GPU, which reads the two env vars and sets the limit through
NVML on the container's cgroup. The spec holds every GPU of the node, whatever the config: a
container created while the plugin restarts, or after a reload took its resource away, must
still resolve its device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from sharing_plugin.plan.allocate import MEMORY_LIMIT_CDI_KIND

CDI_VERSION: Final = "0.5.0"  # hooks with hookName: understood by every CDI-aware runtime
HOOK_NAME: Final = "createRuntime"


def spec_file_name() -> str:
    """The spec's file name in the CDI directory: `<vendor>-<class>.json`, as the CDI library
    names specs it writes."""
    vendor, cdi_class = MEMORY_LIMIT_CDI_KIND.split("/")
    return f"{vendor}-{cdi_class}.json"


def hook_args(*, gpu_uuid: str, driver_root: str) -> list[str]:
    """The hook's argv, as the toolkit's own specs write it (argv[0] is the program name)."""
    return [
        "nvidia-cdi-hook",
        "apply-cuda-memory-limits",
        "--driver-root",
        driver_root,
        "--gpu-id",
        gpu_uuid,
    ]


def memory_hook(*, hook_path: str, gpu_uuid: str, driver_root: str) -> dict[str, Any]:
    return {
        "hookName": HOOK_NAME,
        "path": hook_path,
        "args": hook_args(gpu_uuid=gpu_uuid, driver_root=driver_root),
    }


def memory_limit_spec(
    gpu_uuids: Iterable[str], *, hook_path: str, driver_root: str
) -> dict[str, Any]:
    """The spec: one device per GPU, named by its UUID, in the order given."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": MEMORY_LIMIT_CDI_KIND,
        "devices": [
            {
                "name": uuid,
                "containerEdits": {
                    "hooks": [
                        memory_hook(hook_path=hook_path, gpu_uuid=uuid, driver_root=driver_root)
                    ]
                },
            }
            for uuid in gpu_uuids
        ],
    }
