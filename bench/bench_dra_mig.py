"""Benchmark: dynamic MIG in DRA mode (issue 26 item 8).

1. NodePrepare of a dynamic-MIG claim: `run-dra` in-process (the test harness's `dra_running`:
   the fake kube-apiserver, the DRA kubelet simulator over the real gRPC stack and unix sockets,
   the simulated NVML through the NVML adapter) on a simulated A100-SXM4-80GB node, every GPU
   dynamic. Each round, a claim allocated one 1g.10gb placement (the rounds walk the GPUs and
   starts) is prepared through the kubelet simulator: the claim read from the API, the GPU and
   compute instance made in a worker thread, the GPU's MIG devices read back, the CDI spec and
   the checkpoint written. Measured from the NodePrepareResources call to its answer, then the
   claim is unprepared (its instance destroyed; also measured) and deleted. Claims are
   allocated by hand, as the scheduler would write them.
2. Publish -> allocatable at the real allocator: `sharing-plugin run-dra` as a child process
   against `realdra136` (the Kubernetes 1.36 structured allocator and kubelet DRA manager,
   ../shared/tools) on an 8 x A100 node, every GPU dynamic (8 counter sets, 8 x 25 placements).
   56 claims of one 1g.10gb each (7 per GPU) wait with their pods before the plugin starts.
   Measured from the plugin's process start to the first successful allocation (the allocator
   asked again every 10 ms), and to all 56 allocated (8 GPUs x 7 placements), after which a
   57th is refused. Without the tools the figure says it was not measured.

Run from the repository root: `.venv/bin/python bench/bench_dra_mig.py` (`--quick` for a short
run, `--rounds N`, `--json PATH` for make bench).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))

import realdra  # noqa: E402
from dra_harness import DRIVER, NODE, DraRun, dra_running  # noqa: E402
from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from plugin_process import PluginProcess  # noqa: E402

from sharing_plugin.dra.claims import ClaimRef  # noqa: E402
from sharing_plugin.nvml.discover import discover  # noqa: E402
from sharing_plugin.sim.nvml.simulated import SimulatedNvml  # noqa: E402
from sharing_plugin.views.dra_mig import placement_name  # noqa: E402

PRESET = "dgx-a100-80gb"  # 8 x A100-SXM4-80GB, MIG off: the plugin turns it on
CONFIG = "version: v1\npartitioning:\n  mig:\n    - devices: all\n      dynamic: true\n"
PLACEMENTS = 25  # every start of every A100 profile
ONE_G = "mig-1g.10gb.gpu.sharing-plugin.io"


def claim(run: DraRun, name: str, device: str) -> ClaimRef:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    stored = run.api.put_dra_object(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }
    )
    return ClaimRef("default", name, stored["metadata"]["uid"])


async def bench_prepare(rounds: int, log: FigureLog) -> None:
    gpus = [g.uuid for g in discover(SimulatedNvml.from_preset(PRESET)).gpus]
    prepare_s: list[float] = []
    unprepare_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bm", dir="/tmp") as tmp:
        async with dra_running(Path(tmp), CONFIG, gpus=f"simulated:{PRESET}") as run:
            await run.published(len(gpus) * PLACEMENTS)
            for i in range(rounds):
                gpu, start = gpus[i % len(gpus)], (i // len(gpus)) % 7
                ref = claim(run, f"c{i}", placement_name(gpu, "1g.10gb", start))
                began = time.perf_counter()
                answer = await run.prepare(ref)
                prepare_s.append(time.perf_counter() - began)
                if answer.error:
                    raise SystemExit(f"prepare {ref}: {answer.error}")
                began = time.perf_counter()
                error = await run.unprepare(ref)
                unprepare_s.append(time.perf_counter() - began)
                if error:
                    raise SystemExit(f"unprepare {ref}: {error}")
                # The pod is gone: its claim too (the fake API's store does not grow).
                run.api.delete_dra_object("resourceclaims", ref.name, "default")
    for what, samples in (("NodePrepare", prepare_s), ("NodeUnprepare", unprepare_s)):
        p50, p99 = p50_p99(samples)
        figure = (
            f"{what} of a dynamic-MIG claim (1g.10gb, instance "
            f"{'made' if what == 'NodePrepare' else 'destroyed'}), simulated NVML, 8 x A100"
        )
        value = f"p50 {ms(p50)}, p99 {ms(p99)} (n={len(samples)})"
        print(f"{figure}: {value}")
        log.add(figure, "-", value)


async def bench_allocatable(log: FigureLog) -> None:
    figure = (
        "run-dra start -> allocatable at the real 1.36 allocator, 8 x A100 dynamic "
        "(200 placements): first 1g.10gb claim / 8 GPUs x 7 placements"
    )
    if not realdra.available("realdra136"):
        log.add(figure, "-", f"not measured: {realdra.skip_reason('realdra136')}")
        print(f"{figure}: not measured")
        return
    with tempfile.TemporaryDirectory(prefix="bm", dir="/tmp") as tmp:
        root = Path(tmp)
        async with realdra.running("realdra136", root, node=NODE) as real:
            await real.create(_one_g_class())
            names = [f"p{i}" for i in range(8 * 7 + 1)]
            for name in names:
                for document in _claim_pod(name):
                    await real.create(document)
            config = root / "config.yaml"
            config.write_text(CONFIG)
            args = ["--config", str(config), "--gpus", f"simulated:{PRESET}"]
            args += ["--kubelet-dir", str(root), "--node-name", NODE]
            args += ["--cdi-dir", str(root / "cdi"), "--metrics-address", "off"]
            began = time.perf_counter()
            async with PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra") as p:
                while True:  # realdra has no watch: asked again, as tests/realdra.py does
                    if (await _allocate(real, names[0]))["ok"]:
                        break
                    await asyncio.sleep(0.01)
                first = time.perf_counter() - began
                for name in names[1:-1]:
                    answer = await _allocate(real, name)
                    if not answer["ok"]:
                        raise SystemExit(f"allocating {name}: {answer}")
                every = time.perf_counter() - began
                refused = await _allocate(real, names[-1])
                if refused["ok"]:
                    raise SystemExit("a 57th 1g.10gb claim was allocated: the counters are wrong")
                await p.stop()
    value = f"first {ms(first)}, all 56 {ms(every)}; the 57th refused"
    print(f"{figure}: {value}")
    log.add(figure, "-", value)


async def _allocate(real: realdra.RealDra, name: str) -> dict[str, Any]:
    return await real.cmd({"cmd": "allocate", "pod": {"namespace": "default", "name": name}})


def _one_g_class() -> dict[str, Any]:
    expression = (
        f'device.driver == "{DRIVER}" && '
        f'device.attributes["{DRIVER}"].resource == "nvidia.com/mig-1g.10gb"'
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": ONE_G},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _claim_pod(name: str) -> list[dict[str, Any]]:
    request = {"name": "mig", "exactly": {"deviceClassName": ONE_G}}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [request]}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "resourceClaims": [{"name": "m", "resourceClaimName": name}],
                "containers": [
                    {"name": "c", "image": "x", "resources": {"claims": [{"name": "m"}]}}
                ],
            },
        },
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500, help="NodePrepare rounds (500)")
    parser.add_argument("--quick", action="store_true", help="50 rounds")
    add_json_option(parser)
    options = parser.parse_args()
    log = FigureLog(options.json)
    await bench_prepare(50 if options.quick else options.rounds, log)
    await bench_allocatable(log)


if __name__ == "__main__":
    asyncio.run(main())
