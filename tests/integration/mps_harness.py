"""MPS for integration tests: the simulated control binary as a process, `mps-control` in-process.

Every daemon the simulated binary starts is a real background process; `reap_daemons` kills
whatever a test left under its directory, so no daemon outlives the test that started it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from support.mps import alive, pid_of

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.daemon.mps_control.controller import MpsController, MpsControlOptions
from sharing_plugin.daemon.mps_control.keeper import KeeperTiming
from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.mps import ControlBinary, DaemonRecord, read_record

# Two GPUs of different memory, so "memory / replicas" is checked per device.
TWO_GPUS: dict[str, Any] = {
    "gpus": [
        {"product": "NVIDIA A100-SXM4-40GB", "count": 1},
        {"product": "NVIDIA A100-SXM4-80GB", "count": 1},
    ]
}
RESOURCE = "nvidia.com/gpu"
FAST = KeeperTiming(heartbeat_s=30.0, backoff_s=(0.05, 0.2), stable_s=5.0)


def mps_config(root: Path, *, replicas: int = 4, extra: str = "") -> str:
    return (
        f"version: v1\nflags:\n  mpsRoot: {root}\nsharing:\n  mps:\n    resources:\n"
        f"    - name: {RESOURCE}\n      replicas: {replicas}\n{extra}"
    )


def resource_root(mps_root: Path, resource: str = RESOURCE) -> Path:
    return mps_root / resource


def pipe_of(mps_root: Path, resource: str = RESOURCE) -> Path:
    return resource_root(mps_root, resource) / "pipe"


def ask(binary: Path, pipe: Path, commands: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run the control binary as a client, as an admin would on the node."""
    return subprocess.run(
        [str(binary)],
        input="".join(f"{c}\n" for c in commands),
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        timeout=10,
        check=False,
    )


def limits_of(binary: Path, pipe: Path, devices: int) -> tuple[str, list[str]]:
    """(default thread percentage, pinned memory limit per device) as the daemon reports."""
    commands = [
        "get_default_active_thread_percentage",
        *(f"get_default_device_pinned_mem_limit {i}" for i in range(devices)),
    ]
    done = ask(binary, pipe, commands)
    assert done.returncode == 0, done.stderr
    first, *rest = done.stdout.split()
    return first, rest


def record(mps_root: Path, resource: str = RESOURCE) -> DaemonRecord | None:
    return read_record(resource_root(mps_root, resource))


def daemon_pid(mps_root: Path, resource: str = RESOURCE) -> int | None:
    return pid_of(pipe_of(mps_root, resource))


def reap_daemons(root: Path) -> None:
    """SIGKILL every simulated daemon whose pid file lies under `root`."""
    for pid_file in root.rglob("nvidia-cuda-mps-control.pid"):
        pid = pid_of(pid_file.parent)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


async def eventually_record(
    mps_root: Path,
    predicate: Any,
    *,
    resource: str = RESOURCE,
    within: float = 10.0,
) -> DaemonRecord:
    """Wait until the state file satisfies `predicate` (the file has no notification here)."""
    async with asyncio.timeout(within):
        while True:
            found = record(mps_root, resource)
            if found is not None and predicate(found):
                return found
            await asyncio.sleep(0.01)


@asynccontextmanager
async def controller(
    config: Path,
    binary: Path,
    *,
    gpus: str,
    kubelet_dir: Path | None = None,
    timing: KeeperTiming = FAST,
    limits_from_claims: bool = False,
) -> AsyncIterator[MpsController]:
    options = MpsControlOptions(
        source=SourceOptions(
            config_path=config, gpus=gpus, kubelet_dir=kubelet_dir or config.parent
        ),
        control_bin=str(binary),
        timing=timing,
        limits_from_claims=limits_from_claims,
        recheck_s=0.05,
    )
    async with MpsController(
        options, nvml=backend_from_spec(gpus), control=ControlBinary(str(binary))
    ) as running:
        yield running


def write(path: Path, text: str) -> None:
    """Replace `path`'s content in one rename, as an editor saving it does."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
