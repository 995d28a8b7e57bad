"""On a machine with an NVIDIA GPU: NVML's per-process answers reach the usage metrics (issue 25).

Not a benchmark and not part of `make bench`: it needs a GPU, its driver and `cuda-python`
(`pip install cuda-python`). It starts `sharing-plugin run --gpus nvml` as a child process for
a config that time-slices GPU 0 two ways (the kubelet side is the in-package simulator), admits
one pod holding one replica, and starts two CUDA processes on GPU 0: each allocates `--mib` MiB
and keeps the SMs busy with a small kernel. The proc root given to `run` is an empty directory,
so no cgroup can be read and the processes are attributed the way a node without the host's
/proc does it: to the one pod PodResources says holds the GPU. It then reads the plugin's
/status and /metrics until both pids are there and checks that:

- /status lists both pids under the pod on GPU 0, each with at least the memory it allocated
  (NVML counts the CUDA context too);
- `sharing_plugin_pod_gpu_memory_used_bytes` of the pod on GPU 0 is at least both allocations,
  and `sharing_plugin_gpu_memory_used_bytes` of GPU 0 at least that;
- utilization is printed as NVML gave it (a GPU in MIG mode, or a driver without the calls,
  gives none: said, not failed).

`sharing-plugin top --once` is printed at the end.

    .venv/bin/python bench/usage_gpu_check.py [--mib N] [--json PATH]
    .venv/bin/python bench/usage_gpu_check.py --simulate   # the same, no GPU: see below

`--simulate` runs every step but CUDA: `run` gets a simulated node file instead of NVML, the
two "CUDA processes" are plain child processes, and the script writes their pids and memory
into the node file's `processes` (what NVML would list). It checks the script itself where no
GPU is lent.

Exit 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import FigureLog, add_json_option

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

RESOURCE = "nvidia.com/gpu"
POD = "usage-check"
MIB = 1 << 20

# One CUDA process: allocate __MIB__ MiB, start a spinning kernel on a stream, say its pid, hold
# everything until stdin closes. The kernel is PTX, JIT-compiled by the driver for the GPU.
CLIENT = r"""
import ctypes, os, sys
from cuda.bindings import driver as cu
PTX = b'''
.version 6.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 n)
{
  .reg .u64 %rd<3>;
  .reg .pred %p;
  ld.param.u64 %rd1, [n];
  mov.u64 %rd2, 0;
LOOP:
  add.u64 %rd2, %rd2, 1;
  setp.lt.u64 %p, %rd2, %rd1;
  @%p bra LOOP;
  ret;
}
'''
def ok(result):
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err)
    return result[1:] if len(result) > 2 else (result[1] if len(result) > 1 else None)
ok(cu.cuInit(0))
context = ok(cu.cuCtxCreate(0, ok(cu.cuDeviceGet(0))))
memory = ok(cu.cuMemAlloc(__MIB__ << 20))
kernel = "none"
try:
    module = ok(cu.cuModuleLoadData(PTX + b"\0"))
    spin = ok(cu.cuModuleGetFunction(module, b"spin"))
    stream = ok(cu.cuStreamCreate(0))
    params = ((1 << 40,), (ctypes.c_uint64,))  # (values, their ctypes types)
    ok(cu.cuLaunchKernel(spin, 64, 1, 1, 128, 1, 1, 0, stream, params, 0))
    kernel = "spinning"
except Exception as exc:  # memory is the point; a kernel that does not start is only said
    kernel = f"no kernel: {exc}"
print(os.getpid(), kernel, flush=True)
sys.stdin.read()
os._exit(0)  # the kernel never ends: leave without waiting for it
"""

# The same shape without a GPU, for --simulate.
SIMULATED_CLIENT = "import os, sys; print(os.getpid(), 'simulated', flush=True); sys.stdin.read()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body


def real_gpu() -> tuple[str, int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    finally:
        pynvml.nvmlShutdown()
    return uuid.decode() if isinstance(uuid, bytes) else uuid, total


def write_node(path: Path, processes: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        json.dumps({"gpus": [{"product": "NVIDIA A100-SXM4-80GB"}], "processes": processes})
    )
    tmp.replace(path)


async def start_client(code: str) -> tuple[asyncio.subprocess.Process, int, str]:
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert client.stdout is not None
    line = (await asyncio.wait_for(client.stdout.readline(), 120)).decode().strip()
    if not line:
        raise RuntimeError("a client ended before it was ready (is cuda-python installed?)")
    pid, _, kernel = line.partition(" ")
    return client, int(pid), kernel


def pod_rows(status: dict[str, Any], gpu: str) -> list[dict[str, Any]]:
    usage = status.get("usage") or {}
    return [
        c
        for g in usage.get("gpus", ())
        if g["uuid"] == gpu
        for d in g["devices"]
        for c in d["containers"]
    ]


def series(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def main(args: argparse.Namespace, figures: FigureLog) -> int:
    root = Path(tempfile.mkdtemp(prefix="usage", dir="/tmp"))
    empty_proc = root / "no-proc"  # no cgroup readable: attribution through PodResources
    empty_proc.mkdir()
    config = root / "config.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: gpu\n      replicas: 2\n      devices: [0]\n"
    )
    node = root / "node.yaml"
    if args.simulate:
        write_node(node, [])
        gpus = f"simulated:{node}"
    else:
        gpus = "nvml"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "sharing_plugin"]
    clients: list[asyncio.subprocess.Process] = []
    async with KubeletSimulator(root) as kubelet:
        run = await asyncio.create_subprocess_exec(
            *command, "run", "--config", str(config), "--gpus", gpus, "--kubelet-dir", str(root),
            "--metrics-address", f"127.0.0.1:{port}", "--proc-root", str(empty_proc),
        )  # fmt: skip
        try:
            await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2, timeout=60)
            pod = await kubelet.admit_pod(POD, containers={"main": {RESOURCE: 1}})
            gpu = pod.device_ids("main", RESOURCE)[0].split("::")[0]
            code = SIMULATED_CLIENT if args.simulate else CLIENT.replace("__MIB__", str(args.mib))
            started = []
            for _ in range(2):
                client, pid, kernel = await start_client(code)
                clients.append(client)
                started.append((pid, kernel))
            if args.simulate:  # what NVML would list for them
                write_node(
                    node,
                    [
                        {"gpu": 0, "pid": pid, "memory": (args.mib + 300) * MIB, "sm": 40}
                        for pid, _ in started
                    ],
                )
            pids = {pid for pid, _ in started}
            t0 = time.monotonic()
            while True:
                # in a thread: the kubelet simulator answering the plugin runs on this loop
                status = json.loads(await asyncio.to_thread(get, f"{url}/status"))
                rows = [r for r in pod_rows(status, gpu) if r["pod"] == POD]
                if rows and pids <= set(rows[0]["pids"]):
                    break
                if time.monotonic() - t0 > 30:
                    print(json.dumps(status.get("usage"), indent=1))
                    raise RuntimeError(f"pids {sorted(pids)} never reached /status")
                await asyncio.sleep(1.0)
            seen_after = time.monotonic() - t0
            metrics = (await asyncio.to_thread(get, f"{url}/metrics")).decode()
            top = await asyncio.create_subprocess_exec(
                *command, "top", "--url", url, "--once", stdout=asyncio.subprocess.PIPE
            )
            frame, _ = await top.communicate()
        finally:
            for client in clients:
                if client.stdin is not None:
                    client.stdin.close()
            for client in clients:
                await client.wait()
            run.terminate()
            await run.wait()
    (row,) = rows
    allocated = 2 * args.mib * MIB
    pod_memory = series(metrics, "sharing_plugin_pod_gpu_memory_used_bytes", pod=POD, gpu=gpu)
    gpu_memory = series(metrics, "sharing_plugin_gpu_memory_used_bytes", gpu=gpu)
    utilization = row["utilization"]
    print(frame.decode())
    for pid, kernel in started:
        print(f"client pid {pid}: {kernel}")
    print(
        f"GPU {gpu}: pod {POD} holds {row['replicas']}, runs pids {row['pids']}; "
        f"/status memoryUsed {row['memoryUsed'] / MIB:.0f} MiB, /metrics pod series "
        f"{pod_memory / MIB:.0f} MiB, GPU used {gpu_memory / MIB:.0f} MiB, utilization "
        f"{utilization if utilization is not None else 'not given by NVML'}"
    )
    checks = {
        "both pids under the pod in /status": pids <= set(row["pids"]),
        "/status memory >= both allocations": row["memoryUsed"] >= allocated,
        "pod series >= both allocations": pod_memory >= allocated,
        "GPU memory used >= the pod's": gpu_memory >= pod_memory,
    }
    for what, held in checks.items():
        print(f"  {'ok ' if held else 'NOT'} {what}")
    figures.add("two CUDA processes -> both pids in /status", "", f"{seen_after:.1f} s")
    figures.add("pod GPU memory in /metrics / allocated", ">= 1", f"{pod_memory / allocated:.2f}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB each CUDA process allocates")
    parser.add_argument(
        "--simulate", action="store_true", help="no GPU: simulated NVML, plain child processes"
    )
    add_json_option(parser)
    arguments = parser.parse_args()
    if not arguments.simulate:
        real_gpu()  # fails here, with NVML's words, on a machine without a GPU
    sys.exit(asyncio.run(main(arguments, FigureLog(arguments.json))))
