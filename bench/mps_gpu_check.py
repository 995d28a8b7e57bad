"""On a machine with an NVIDIA GPU: MPS limits enforced for real (issue 13, item 7).

Not a benchmark and not part of `make bench`: it needs a GPU, its driver (with
`nvidia-cuda-mps-control`) and `cuda-python` (`pip install cuda-python`). It starts, as child
processes, `sharing-plugin mps-control` and `sharing-plugin run` for a 2-replica MPS config on
GPU 0 (the kubelet side is the in-package simulator), waits until the plugin advertises the two
replicas as Healthy, then runs two CUDA clients through the daemon's pipe directory, one after
the other started and both alive together: each allocates GPU memory in 256 MiB steps until the
driver refuses. With MPS enforcing the pinned limit, each stops near GPU memory / 2 while the
other holds its share; without MPS the first would take (nearly) the whole GPU.

    .venv/bin/python bench/mps_gpu_check.py [--json PATH]

Exit 0 when both clients were held to their limit (within 5 %), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import FigureLog, add_json_option

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

RESOURCE = "nvidia.com/gpu"
STEP_MIB = 256

# One CUDA client: allocate until refused, report the total, hold it until stdin closes.
CLIENT = r"""
import sys
from cuda.bindings import driver as cu
def ok(result):
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err)
    return result[1:] if len(result) > 2 else (result[1] if len(result) > 1 else None)
ok(cu.cuInit(0))
device = ok(cu.cuDeviceGet(0))
context = ok(cu.cuCtxCreate(0, device))
held = 0
while True:
    err, _ = cu.cuMemAlloc(STEP << 20)
    if err != cu.CUresult.CUDA_SUCCESS:
        break
    held += STEP
print(held, flush=True)
sys.stdin.read()
""".replace("STEP", str(STEP_MIB))


def gpu_memory_mib() -> tuple[str, int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    uuid, memory = (part.strip() for part in out.split(","))
    return uuid, int(memory)


async def start_client(pipe: Path, uuid: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_VISIBLE_DEVICES": uuid}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def held_by(client: asyncio.subprocess.Process) -> int:
    assert client.stdout is not None
    return int(await asyncio.wait_for(client.stdout.readline(), 120))


async def main(figures: FigureLog) -> int:
    uuid, memory = gpu_memory_mib()
    limit = memory // 2
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    mps_root = root / "mps"
    pipe = mps_root / RESOURCE / "pipe"
    config = root / "config.yaml"
    config.write_text(
        f"version: v1\nflags:\n  mpsRoot: {mps_root}\nsharing:\n  mps:\n    resources:\n"
        "    - name: gpu\n      replicas: 2\n      devices: [0]\n"
    )
    common = ["--config", str(config), "--gpus", "nvml", "--kubelet-dir", str(root)]
    plugin = (sys.executable, "-m", "sharing_plugin")
    async with KubeletSimulator(root) as kubelet:
        run = await asyncio.create_subprocess_exec(
            *plugin, "run", *common, "--metrics-address", "off"
        )
        control = await asyncio.create_subprocess_exec(*plugin, "mps-control", *common)
        try:
            started = time.monotonic()
            await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2, timeout=60)
            figures.add(
                "mps-control + run start -> 2 Healthy replicas",
                "",
                f"{time.monotonic() - started:.2f} s",
            )
            state = json.loads((mps_root / RESOURCE / "daemon.json").read_text())
            print("daemon:", json.dumps(state, indent=1))
            first = await start_client(pipe, uuid)
            held_first = await held_by(first)
            second = await start_client(pipe, uuid)  # while the first holds its memory
            held_second = await held_by(second)
            for client in (first, second):
                assert client.stdin is not None
                client.stdin.close()
                await client.wait()
        finally:
            for process in (control, run):
                process.terminate()
                await process.wait()
            quit_daemon = await asyncio.create_subprocess_exec(
                "nvidia-cuda-mps-control",
                stdin=asyncio.subprocess.PIPE,
                env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
            )
            await quit_daemon.communicate(b"quit\n")
    figures.add("client 1 allocated before refusal", f"<= {limit} MiB", f"{held_first} MiB")
    figures.add("client 2 allocated while client 1 held", f"<= {limit} MiB", f"{held_second} MiB")
    low, high = limit * 0.95 - STEP_MIB, limit * 1.05
    ok = all(low <= held <= high for held in (held_first, held_second))
    print(
        f"GPU {uuid}: {memory} MiB, limit per client {limit} MiB; clients held {held_first} and "
        f"{held_second} MiB: {'OK' if ok else 'NOT ENFORCED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(FigureLog(args.json))))
