"""The contracts of docs/contract.md, checked on the real command line: what other tools and
admins rely on (output line formats, exit codes, the `plan` JSON shape, the simulated node
description format, `run`'s env vars, socket names, `/status`, advertised IDs and Allocate
answers).

Each check runs the command line's `main` with this process's stdin, stdout and stderr swapped
for buffers, so argument parsing, exit codes and the split between stdout and stderr are the ones
a user sees; `child()` runs the real `python -m sharing_plugin` where the process itself is the
point (exit codes through `sys.exit`, the real stdin), and `run` always runs as a child.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from cli_capture import cli
from plugin_process import PluginProcess, child_env, free_port, http_get

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

# Verbatim from the contract's "Simulated node description" (docs/contract.md).
DESIGN_NODE = """\
gpus:
  - product: NVIDIA A100-SXM4-80GB   # the exact name NVML reports; catalogued models get real MIG rules
    count: 4                          # default 1
    numaNode: 0                       # default null
    mig:                              # optional
      enabled: true
      instances: ["3g.40gb", "2g.20gb", "1g.10gb@6"]  # existing MIG devices (optional @start)
  - product: Tesla T4
    count: 2
nvlink: all        # all | none: NVLink between every pair of same-product GPUs
faults: []         # append {gpu: <index|uuid>, xid: <int>} while running: delivered once as an Xid event
"""  # noqa: E501

SHARED = """\
version: v1
flags:
  migStrategy: mixed
  plugin:
    deviceIDStrategy: {id_strategy}
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
      - name: nvidia.com/mig-1g.10gb
        replicas: 3
"""
CLI_TIMEOUT_S = 30
SOCKET_NAME = re.compile(r"sharing-[a-z0-9.-]+-[0-9a-f]{8}\.sock")


def child(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command line as a child process: `python -m sharing_plugin ARGS`."""
    return subprocess.run(
        [sys.executable, "-m", "sharing_plugin", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
        env=child_env(),
    )


def plan_json(config: Path, node: Path, *extra: str) -> dict[str, Any]:
    done = cli("plan", "--config", str(config), "--gpus", f"simulated:{node}", "--format", "json",
               *extra)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


@pytest.fixture
def node(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(DESIGN_NODE, encoding="utf-8")
    return path


# -- validate ---------------------------------------------------------------------------------


def test_validate_configmap_lines_point_into_the_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: plugin-configs\n"
        "data:\n"
        "  default: |\n"
        "    version: v1\n"
        "  shared: |-\n"
        "    version: v1\n"
        "    sharing:\n"
        "      timeSlicing:\n"
        "        renameByDefalt: true\n"
        "        resources:\n"
        "          - name: nvidia.com/gpu\n"
        "            replicas: 0\n"
        "  other: |\n"
        "    flags:\n"
        "      renameByDefault: true\n"
    )
    done = cli("validate", str(manifest))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"{manifest}:12:9: data.shared: sharing.timeSlicing.renameByDefalt: "
        "unknown field 'renameByDefalt' (did you mean 'renameByDefault'?)",
        f"{manifest}:15:23: data.shared: sharing.timeSlicing.resources[0].replicas: "
        "must be >= 1 (got 0)",
        f"{manifest}:18:7: data.other: flags.renameByDefault: unknown field 'renameByDefault' "
        "here: it belongs under sharing.mps or sharing.timeSlicing",
    ]


def test_validate_warnings_go_to_stderr_and_usage_errors_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nflags:\n  gdsEnabled: true\n")
    done = cli("validate", str(config))
    assert done.returncode == 0
    assert not [line for line in done.stdout.splitlines() if line.startswith("warning")]
    warnings = done.stderr.splitlines()
    assert warnings and all(line.startswith("warning: ") for line in warnings)
    assert "flags.gdsEnabled" in done.stderr

    assert cli("validate").returncode == 2
    missing = cli("validate", str(config), str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert "nope.yaml" in missing.stderr


def test_replicas_over_the_listandwatch_limit_are_rejected(tmp_path: Path, node: Path) -> None:
    config = tmp_path / "big.yaml"
    config.write_text(SHARED.format(id_strategy="uuid", replicas=60_001))
    done = cli("validate", str(config))
    assert done.returncode == 1
    assert done.stdout.startswith(f"{config}:10:19: sharing.timeSlicing.resources[0].replicas: ")

    # 2 whole GPUs x 30,001 replicas: each entry is fine alone, the resource is not.
    config.write_text(SHARED.format(id_strategy="uuid", replicas=30_001))
    assert cli("validate", str(config)).returncode == 0
    done = cli("plan", "--config", str(config), "--gpus", f"simulated:{node}")
    assert done.returncode == 1
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"{config}:9:9: sharing.timeSlicing.resources[0]: ")
    assert "60,002 devices" in line and "60,000" in line


@pytest.mark.subprocess
def test_validate_dash_reads_a_stream_on_stdin(tmp_path: Path) -> None:
    # Second batch: `validate -` reads stdin; every ConfigMap of a stream is validated, other
    # kinds are skipped, lines count in the whole stream. A child process: the real stdin, and
    # the exit code as `sys.exit` reports it.
    manifest = (
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sharing-plugin}\n"
        "---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plugin}\n"
        "data:\n"
        "  default: |\n"
        "    flags: {migStrategy: mixd}\n"
    )
    done = child("validate", "-", stdin=manifest)
    assert done.returncode == 1
    assert done.stdout == (
        "<stdin>:10:26: data.default: flags.migStrategy: unknown value 'mixd'; expected "
        "'none', 'single' or 'mixed' (did you mean 'mixed'?)\n"
    )


# -- plan and the simulated node --------------------------------------------------------------


def test_plan_json_stdout_is_json_or_nothing(tmp_path: Path, node: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    done = cli("plan", "--config", str(config), "--gpus", f"simulated:{node}", "--format", "json")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(f"{config}:3:16: flags.migStrategy: ")
    config.write_text("version: v1\nflags:\n  gdsEnabled: true\n")
    document = plan_json(config, node)
    assert (
        f"{config}:3:3: flags.gdsEnabled: accepted for compatibility; has no effect here"
        in (document["warnings"])
    )


def test_plan_json_shape_on_the_design_node(tmp_path: Path, node: Path) -> None:
    config = tmp_path / "shared.yaml"
    config.write_text(SHARED.format(id_strategy="uuid", replicas=2))
    document = plan_json(config, node)
    assert {"config", "resources", "mig", "warnings"} <= document.keys()
    assert document["config"]["name"] is None
    assert isinstance(document["mig"], list)
    assert all(isinstance(w, str) for w in document["warnings"])
    counts = {r["name"]: len(r["devices"]) for r in document["resources"]}
    # Mixed strategy: the 2 T4s stay whole GPUs; each A100 has 3g.40gb, 2g.20gb, 1g.10gb@6.
    assert counts == {
        "nvidia.com/gpu": 2 * 2,
        "nvidia.com/mig-1g.10gb": 4 * 3,
        "nvidia.com/mig-2g.20gb": 4,
        "nvidia.com/mig-3g.40gb": 4,
    }
    for resource in document["resources"]:
        shared = resource["name"] in ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb")
        assert resource["sharing"] == ("time-slicing" if shared else "none")
        for device in resource["devices"]:
            assert {"id", "physical", "health", "numa"} <= device.keys()
            assert device["health"] in ("Healthy", "Unhealthy")
            assert device["numa"] is None or isinstance(device["numa"], int)
            physical = device["physical"]
            prefix = "GPU-" if resource["name"] == "nvidia.com/gpu" else "MIG-"
            assert physical.startswith(prefix)
            if shared:
                assert re.fullmatch(re.escape(physical) + r"::\d+", device["id"])
            else:
                assert device["id"] == physical
    mig = next(r for r in document["resources"] if r["name"] == "nvidia.com/mig-1g.10gb")
    assert {d["numa"] for d in mig["devices"]} == {0}  # numaNode: 0 of the A100 group
    gpus = next(r for r in document["resources"] if r["name"] == "nvidia.com/gpu")
    assert {d["numa"] for d in gpus["devices"]} == {None}  # the T4 group has no numaNode


def test_simulated_uuids_are_deterministic_and_ids_stable(tmp_path: Path, node: Path) -> None:
    config = tmp_path / "shared.yaml"
    config.write_text(SHARED.format(id_strategy="uuid", replicas=2))
    first = plan_json(config, node)
    assert plan_json(config, node) == first

    def ids(document: dict[str, Any]) -> dict[str, list[str]]:
        return {r["name"]: [d["id"] for d in r["devices"]] for r in document["resources"]}

    # deviceIDStrategy only changes what the container is told, never the advertised IDs.
    config.write_text(SHARED.format(id_strategy="index", replicas=2))
    assert ids(plan_json(config, node)) == ids(first)
    # More replicas keep every existing ID.
    config.write_text(SHARED.format(id_strategy="uuid", replicas=3))
    grown = ids(plan_json(config, node))
    assert set(ids(first)["nvidia.com/gpu"]) < set(grown["nvidia.com/gpu"])
    assert len(grown["nvidia.com/gpu"]) == 2 * 3


def test_unknown_product_is_allowed_without_mig_and_warned(tmp_path: Path) -> None:
    node = tmp_path / "odd.yaml"
    node.write_text("gpus:\n  - product: ACME Tensor 9000\n    count: 2\nfaults: []\n")
    config = tmp_path / "empty.yaml"
    config.write_text("")
    document = plan_json(config, node)
    (gpus,) = document["resources"]
    assert gpus["name"] == "nvidia.com/gpu" and len(gpus["devices"]) == 2
    assert any("ACME Tensor 9000" in w for w in document["warnings"]), document["warnings"]


def test_instances_that_cannot_fit_name_the_gpu(tmp_path: Path) -> None:
    node = tmp_path / "bad.yaml"
    node.write_text(
        "gpus:\n"
        "  - product: NVIDIA A100-SXM4-80GB\n"
        "    mig: {enabled: true, instances: ['4g.40gb', '4g.40gb']}\n"
    )
    config = tmp_path / "empty.yaml"
    config.write_text("")
    done = cli("plan", "--config", str(config), "--gpus", f"simulated:{node}")
    assert done.returncode == 1
    assert "GPU 0" in done.stderr and "4g.40gb" in done.stderr
    # No made-up position: the simulator does not know the line, so none is printed.
    assert f"{node}: " in done.stderr and f"{node}:0:0" not in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_once_exits_0() -> None:
    done = cli("demo", "--once")
    assert done.returncode == 0, done.stdout + done.stderr
    # A first impression without a warning: the demo's own config needs none.
    assert "WARNING" not in done.stdout + done.stderr
    assert "NVIDIA_VISIBLE_DEVICES=" in done.stdout
    assert "nvidia.com/gpu.shared: 16" in done.stdout and "nvidia.com/gpu:        4" in done.stdout


# -- run ----------------------------------------------------------------------------------------

RUN_CONFIG = """\
version: v1
flags:
  migStrategy: mixed
  plugin:
    deviceIDStrategy: index
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
      - name: nvidia.com/mig-1g.10gb
        replicas: 3
partitioning:
  mig:
    - devices: [0]
      profiles:
        1g.10gb: 7
"""
# GPU 0 cut into 7 x 1g.10gb, GPUs 1-3 keep their 1g.10gb@6: 10 MIG devices x 3 replicas.
EXPECTED = {
    "nvidia.com/gpu": 2 * 2,
    "nvidia.com/mig-1g.10gb": 10 * 3,
    "nvidia.com/mig-2g.20gb": 3,
    "nvidia.com/mig-3g.40gb": 3,
}
START_S = 10.0


async def _allocate(socket: Path, ids: list[str]) -> dict[str, str]:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        response = await dp_grpc.DevicePluginStub(channel).Allocate(request, timeout=5)
    return dict(response.container_responses[0].envs)


async def _run_once(
    kubelet: KubeletSimulator, short_dir: Path, node: Path, configs: Path
) -> tuple[dict[str, list[str]], list[str], dict[str, Any], PluginProcess]:
    """Start `run` from env vars only, check what it serves, stop it.

    Returns the advertised IDs per resource, our socket names, `/status`, and the process.
    """
    port = free_port()
    env = {
        "CONFIG_FILE": str(configs),
        "CONFIG_NAME": "shared",
        "GPUS": f"simulated:{node}",
        "KUBELET_DIR": str(short_dir),
        "NODE_NAME": "gpu-node-7",
        "METRICS_ADDRESS": f"127.0.0.1:{port}",
        "LOG_FORMAT": "json",
    }
    async with PluginProcess([], env) as plugin:
        await kubelet.wait_for(
            lambda: all(kubelet.allocatable(r) == n for r, n in EXPECTED.items()), timeout=START_S
        )
        assert (await http_get(port, "/healthz"))[0] == 200
        status, _, body = await http_get(port, "/readyz")
        assert status == 200, body
        _, _, body = await http_get(port, "/status")
        document = json.loads(body)
        sockets = sorted(p.name for p in kubelet.plugin_dir.glob("sharing-*.sock"))
        ids = {r: sorted(kubelet.devices(r)) for r in EXPECTED}

        endpoint = {r.resource: r.endpoint for r in kubelet.registrations}
        gpu_socket = kubelet.plugin_dir / endpoint["nvidia.com/gpu"]
        t4_first, t4_second = sorted({i.split("::")[0] for i in ids["nvidia.com/gpu"]})
        # Index strategy: the T4s are GPUs 4 and 5; unique physical devices in request order.
        envs = await _allocate(gpu_socket, [f"{t4_second}::1", f"{t4_first}::0", f"{t4_second}::0"])
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "5,4"
        mig_socket = kubelet.plugin_dir / endpoint["nvidia.com/mig-1g.10gb"]
        envs = await _allocate(mig_socket, [ids["nvidia.com/mig-1g.10gb"][0]])
        assert re.fullmatch(r"[0-3]:\d", envs["NVIDIA_VISIBLE_DEVICES"]), envs
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _allocate(gpu_socket, ["GPU-00000000-0000-0000-0000-000000000000::0"])
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # Still serving after a refusal.
        assert await _allocate(gpu_socket, [f"{t4_first}::1"]) == {"NVIDIA_VISIBLE_DEVICES": "4"}

        started = time.monotonic()
        assert await plugin.stop(signal.SIGTERM, timeout=2.0) == 0
        assert time.monotonic() - started < 2.0
    assert list(kubelet.plugin_dir.glob("sharing-*.sock")) == []
    return ids, sockets, document, plugin


@pytest.mark.subprocess
async def test_run_env_vars_status_sockets_ids_and_allocate(
    kubelet: KubeletSimulator, short_dir: Path
) -> None:
    node = short_dir / "node.yaml"
    node.write_text(DESIGN_NODE, encoding="utf-8")
    configs = short_dir / "configs"  # a mounted ConfigMap: one file per key
    configs.mkdir()
    (configs / "default").write_text("version: v1\n")
    (configs / "shared").write_text(RUN_CONFIG)

    ids, sockets, status, plugin = await _run_once(kubelet, short_dir, node, configs)

    assert len(sockets) == len(EXPECTED)
    assert all(SOCKET_NAME.fullmatch(name) for name in sockets), sockets
    config = status["config"]
    assert config["name"] == "shared"
    assert re.fullmatch(r"[0-9a-f]{64}", config["hash"]) and config["generation"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", config["loadedAt"])
    assert status["lastError"] is None
    assert status["resources"].keys() == EXPECTED.keys()
    for name, count in EXPECTED.items():
        entry = status["resources"][name]
        assert entry["devices"] == count and entry["healthy"] == count
        assert entry["draining"] == []
    ((gpu_uuid, mig),) = status["mig"].items()
    assert gpu_uuid.startswith("GPU-")
    assert mig == {"state": "applied", "reason": None}
    # NODE_NAME was read: without credentials the label watch says why it is off.
    assert any("gpu-node-7" in line or "label" in line for line in plugin.stderr_lines)

    # A second start: new socket names, the same advertised IDs (MIG ones included).
    again, sockets_again, _, _ = await _run_once(kubelet, short_dir, node, configs)
    assert again == ids
    assert not set(sockets) & set(sockets_again)
