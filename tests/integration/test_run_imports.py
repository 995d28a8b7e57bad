"""A plain `run` loads only what it runs: no Kubernetes client, DRA, MPS, usage reading, labels;
and the objects its start made are frozen out of later garbage collections, the collector on.

`run` without `--node-name`/`--config-map`, on a node whose config has no MPS resource and that
nobody scrapes, must not pay at start (time, memory) for the parts it does not use. The child is
a fresh interpreter running the real command line; once the kubelet simulator here holds every
device, it is asked to write out `sys.modules`, so the list is that of a registered daemon.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_process import child_env

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

pytestmark = pytest.mark.subprocess  # the run under test is a fresh interpreter

GPU = "nvidia.com/gpu"
CONFIG = (
    "version: v1\n"
    "sharing:\n"
    "  timeSlicing:\n"
    "    resources:\n"
    "    - name: nvidia.com/gpu\n"
    "      replicas: 4\n"
)

# The child: the real entry point, and a thread that writes `sys.modules` (then the collector's
# state) once asked (a file appears), so both are taken after registration rather than at some
# guessed moment.
CHILD = """
import gc, sys, threading, time
from pathlib import Path
out, ask = Path(sys.argv[1]), Path(sys.argv[2])
def dump():
    while not ask.exists():
        time.sleep(0.01)
    out.write_text("\\n".join(sorted(sys.modules)))
    out.with_suffix(".gc").write_text(f"{gc.isenabled()} {gc.get_freeze_count()}")
    print("written", flush=True)
threading.Thread(target=dump, daemon=True).start()
from sharing_plugin.cli import main
sys.exit(main(sys.argv[3:]))
"""

# Module prefixes a plain `run` must not load: the Kubernetes client and the sources that use
# it, the other commands' rooms, the DRA adapter, the MPS adapter (no MPS resource),
# per-pod usage's values and reading side (loaded at the first scrape or held shared replica), the
# suggestions for a mistyped config key (difflib), and the GFD
# labels (computed only where they are published: `--labels-file`, `--node-labels`).
NOT_LOADED = (
    "lightkube",
    "httpx",
    "sharing_plugin.sources.kube",
    "sharing_plugin.sources.apiconfig",
    "sharing_plugin.sources.nodelabel",
    "sharing_plugin.sources.pods",
    "sharing_plugin.observability.nodestatus",
    "sharing_plugin.daemon.run_dra",
    "sharing_plugin.daemon.mps_control",
    "sharing_plugin.dra",
    "sharing_plugin.mps",
    "sharing_plugin.usage.model",
    "sharing_plugin.usage.report",
    "sharing_plugin.usage.overshare",
    "sharing_plugin.usage.cgroup",
    "sharing_plugin.sources.proc",
    "sharing_plugin.nvml.processes",
    "sharing_plugin.observability.usage",
    "sharing_plugin.views",
    "sharing_plugin.observability.labels_file",
    "difflib",
)


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".") or module.startswith(prefix + "_")


async def _loaded_once_registered(work: Path, kubelet: KubeletSimulator) -> set[str]:
    """The modules a registered `run` holds; its collector's state is left in modules.gc."""
    config = work / "config.yaml"
    config.write_text(CONFIG)
    modules, ask = work / "modules.txt", work / "dump"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(modules),
        str(ask),
        "run",
        "--config",
        str(config),
        "--gpus",
        "simulated:dgx-a100-80gb",
        "--kubelet-dir",
        str(work),
        "--metrics-address",
        "off",
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert child.stdout is not None
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 32, timeout=30)
        ask.touch()
        assert await asyncio.wait_for(child.stdout.readline(), 10) == b"written\n"
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(child.wait(), 10)
    assert code == 0
    return set(modules.read_text().split())


async def test_plain_run_loads_no_api_dra_mps_or_usage_reading(
    short_dir: Path, kubelet_sim: KubeletSimulator
) -> None:
    loaded = await _loaded_once_registered(short_dir, kubelet_sim)
    # The list is that of a serving daemon: its own parts and grpc are there.
    assert {"sharing_plugin.daemon.run.app", "sharing_plugin.kubelet.server", "grpc"} <= loaded
    unexpected = sorted(m for m in loaded if any(_matches(m, p) for p in NOT_LOADED))
    assert unexpected == []


async def test_run_freezes_what_its_start_made(
    short_dir: Path, kubelet_sim: KubeletSimulator
) -> None:
    await _loaded_once_registered(short_dir, kubelet_sim)
    enabled, frozen = (short_dir / "modules.gc").read_text().split()
    # The collector ran nowhere during the imports and is back on once the service was built;
    # what start-up made (tens of thousands of objects: modules, classes, the config schema)
    # is in the permanent generation, which no later collection walks.
    assert enabled == "True"
    assert int(frozen) > 20_000


def test_real_nvml_backend_loads_no_simulator() -> None:
    """`--gpus nvml` (every real node) gets pynvml without the simulator's node models, whose
    pydantic schemas cost a start ~25 ms; the presets' names are read only where a spec names
    the simulator or is wrong."""
    code = (
        "import sys\n"
        "from sharing_plugin.backends import backend_from_spec\n"
        "assert backend_from_spec('nvml').__name__ == 'pynvml'\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('sharing_plugin.sim'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == []
