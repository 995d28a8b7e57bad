"""On a machine with an NVIDIA GPU: a cgroup's GPU memory cap enforced by the driver (issue 30, 7).

Not a benchmark and not part of `make bench`: it needs a GPU, driver R615 or later, cgroup v2
mounted writable at /sys/fs/cgroup (root), nvidia-ml-py 13.615 or later, and one CUDA binding
in this Python (PyTorch, CuPy or cuda-python). It:

1. reads the driver version through NVML and says whether it can cap a cgroup's memory;
2. makes a throw-away cgroup `/sys/fs/cgroup/sharing-plugin-memcheck-<pid>` and caps it on GPU 0
   through NVML (`nvmlDeviceSetMemoryLimits_v1`, soft = hard = `--cap-mib`), then reads the cap
   back (`nvmlDeviceGetMemoryLimits_v1`) through the plugin's own adapter;
3. runs two CUDA processes on GPU 0, each allocating in 256 MiB steps until the driver refuses
   (up to `--cap-mib` x 2): the first inside the cgroup must stop at the cap; the second,
   outside it, must get past it;
4. removes the cap (NVML_DEVICE_MEMORY_LIMIT_MAX) and the cgroup, whatever happened.

It changes no other GPU setting. What it could not check is printed as `not checked: <why>`.

    sudo .venv/bin/python bench/memory_limit_gpu_check.py [--cap-mib 2048] [--json PATH]

Exit 0 when the capped process stopped within 5 % of the cap and the other got past it; 1 when
enforcement failed; 2 when it could not be checked here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import FigureLog, add_json_option

CGROUP_ROOT = Path("/sys/fs/cgroup")
STEP_MIB = 256
NOT_CHECKED = 2

# One CUDA client on the first visible GPU: allocate in steps until refused or `limit` is
# reached, print the MiB held. Whichever binding this Python has.
CLIENT = r"""
import sys
step, limit = int(sys.argv[1]), int(sys.argv[2])
held, blocks = 0, []
def alloc_torch():
    import torch
    return lambda: blocks.append(torch.empty(step << 20, dtype=torch.uint8, device="cuda:0"))
def alloc_cupy():
    import cupy
    return lambda: blocks.append(cupy.cuda.alloc(step << 20))
def alloc_cuda_python():
    from cuda.bindings import driver as cu
    assert cu.cuInit(0)[0] == cu.CUresult.CUDA_SUCCESS
    device = cu.cuDeviceGet(0)[1]
    blocks.append(cu.cuCtxCreate(0, device)[1])
    def one():
        err, ptr = cu.cuMemAlloc(step << 20)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise MemoryError(err)
        blocks.append(ptr)
    return one
for make in (alloc_torch, alloc_cupy, alloc_cuda_python):
    try:
        allocate = make()
        break
    except ImportError:
        continue
else:
    print("no-binding", flush=True)
    sys.exit(0)
while held < limit:
    try:
        allocate()
    except Exception:
        break
    held += step
print(held, flush=True)
"""


def _binding() -> str | None:
    for name in ("torch", "cupy", "cuda.bindings"):
        try:
            __import__(name)
        except ImportError:
            continue
        return name
    return None


def _client(uuid: str, cap_mib: int, cgroup: Path | None) -> int | None:
    """MiB the client held before the driver refused (None: no CUDA binding)."""

    def enter() -> None:  # runs in the child before it execs: CUDA starts inside the cgroup
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(STEP_MIB), str(2 * cap_mib)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=enter,
        check=False,
    )
    out = done.stdout.strip().splitlines()
    if not out or out[-1] == "no-binding":
        return None
    return int(out[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap-mib", type=int, default=2048)
    add_json_option(parser)
    args = parser.parse_args()
    figures = FigureLog(args.json)
    try:
        import pynvml
    except ImportError:
        print("not checked: nvidia-ml-py is not installed")
        return NOT_CHECKED
    from sharing_plugin.nvml.memory_limits import bindings_problem, read_limit, set_limit
    from sharing_plugin.plan.caps import FIRST_DRIVER, driver_major

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print(f"not checked: NVML did not start here ({exc})")
        return NOT_CHECKED
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        print(f"driver {driver}")
        problems = []
        if driver_major(driver) < FIRST_DRIVER:
            problems.append(f"driver {driver} is older than R{FIRST_DRIVER}")
        if not (CGROUP_ROOT / "cgroup.controllers").exists():
            problems.append(f"{CGROUP_ROOT} is not a cgroup v2 mount")
        if (missing := bindings_problem(pynvml)) is not None:
            problems.append(missing)
        if _binding() is None:
            problems.append("no CUDA binding (PyTorch, CuPy or cuda-python) in this Python")
        if problems:
            for problem in problems:
                print(f"not checked: {problem}")
            return NOT_CHECKED
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        cgroup = CGROUP_ROOT / f"sharing-plugin-memcheck-{os.getpid()}"
        namespace = "/" + cgroup.name
        cgroup.mkdir()
        try:
            set_limit(pynvml, handle, namespace, args.cap_mib)
            try:
                limit = read_limit(pynvml, handle, namespace)
                print(f"cap on {uuid} for {namespace}: {limit.hard_mib} MiB (read back)")
                capped = _client(uuid, args.cap_mib, cgroup)
                free = _client(uuid, args.cap_mib, None)
            finally:
                # NVML_DEVICE_MEMORY_LIMIT_MAX on both limits: no cap.
                limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
                limits.nameSpace = namespace.encode()
                limits.softLimit = limits.hardLimit = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX
                pynvml.nvmlDeviceSetMemoryLimits_v1(handle, limits)
        finally:
            cgroup.rmdir()
    finally:
        pynvml.nvmlShutdown()
    if capped is None or free is None:
        print("not checked: the CUDA client found no binding")
        return NOT_CHECKED
    print(f"inside the cgroup: held {capped} MiB before refused (cap {args.cap_mib} MiB)")
    print(f"outside it: held {free} MiB (stops at {2 * args.cap_mib} MiB)")
    figures.add(
        "GPU memory cap on a cgroup, real driver: MiB a capped process got",
        goal=f"<= {args.cap_mib} MiB (within 5 %)",
        value=f"{capped} MiB (outside the cgroup: {free} MiB)",
    )
    held_to_cap = capped <= args.cap_mib * 1.05 and free > args.cap_mib
    print("enforced" if held_to_cap else "NOT enforced")
    return 0 if held_to_cap else 1


if __name__ == "__main__":
    sys.exit(main())
