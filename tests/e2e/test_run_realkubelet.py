"""`sharing-plugin run` against the real kubelet device manager (Kubernetes 1.32: the `realkubelet`
harness of ../shared/tools, see its README). Skipped where the tools are absent (a user's clone);
CI has them.

What only the real code can prove: kubelet accepts our registration and reads our options, our
ListAndWatch lists are the device sets it keeps (IDs, health, NUMA), its admission (preferred
allocation, then Allocate) gets the answers a container runtime needs, a config edit and a
kubelet restart (its own restart, and kill -9 with a new process on the same directory) come out
as the plugin says, and a replica a pod holds stays counted until the pod goes. One realkubelet
process serves the whole module; each test runs its own plugin process and removes its pods.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from plugin_process import PluginProcess

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.model import Config
from sharing_plugin.kubelet import registration
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.kubelet.server import AllocateContext, ResourceServer
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan import ResourcePlan, plan

ROOT = Path(__file__).resolve().parents[2]
REALKUBELET = ROOT.parent / "shared" / "tools" / "realkubelet.gz"
GPU = "nvidia.com/gpu"
PRESET = "simulated:dgx-a100-80gb"

pytestmark = [
    pytest.mark.skipif(
        not REALKUBELET.is_file(),
        reason="../shared/tools/realkubelet.gz is absent (only CI has it)",
    ),
    pytest.mark.realtools,
]


class RealKubelet:
    """The realkubelet process on `kubelet_dir` and its JSON-lines control loop."""

    def __init__(self, binary: Path, kubelet_dir: Path) -> None:
        self.binary = binary
        self.kubelet_dir = kubelet_dir
        self.log = kubelet_dir / "realkubelet.log"
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        (self.kubelet_dir / "device-plugins").mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            process = subprocess.Popen(
                [str(self.binary), "-dir", str(self.kubelet_dir / "device-plugins")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        ready = self._read(process, 15.0)
        assert ready.get("ok") and ready.get("ready"), ready
        return process

    @staticmethod
    def _read(process: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        assert ready, f"realkubelet did not answer within {timeout:g} s"
        answer: dict[str, Any] = json.loads(process.stdout.readline())
        return answer

    def cmd(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        answer = self._read(self.process, 15.0)
        assert answer.get("ok") is True, f"{request}: {answer}"
        return answer

    def kill_and_start_again(self) -> None:
        """kill -9, then a new process on the same directory (it reads the checkpoint)."""
        self.process.send_signal(signal.SIGKILL)
        self._reap()
        self.process = self._spawn()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.cmd({"cmd": "quit"})
            except (AssertionError, OSError):
                self.process.kill()
        self._reap()

    def _reap(self) -> None:
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    # -- what kubelet holds ---------------------------------------------------------------------

    def capacity(self, resource: str) -> tuple[int, int]:
        answer = self.cmd({"cmd": "capacity"})
        return answer["capacity"].get(resource, 0), answer["allocatable"].get(resource, 0)

    def devices(self, resource: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cmd({"cmd": "devices"})["resources"].get(resource, {})
        return found

    def held_list(self, resource: str) -> list[dict[str, Any]] | None:
        """The devices kubelet counts for `resource`, by ID, while its plugin is connected; None
        otherwise. The health is kubelet's: a stream that ended moves every device to its
        unhealthy set and leaves the last list's health strings as they were."""
        found = self.devices(resource)
        if found.get("endpoint") != "connected":
            return None
        healthy = set(found["healthy"])
        return sorted(
            (
                {
                    "id": d["id"],
                    "health": "Healthy" if d["id"] in healthy else "Unhealthy",
                    "numa": d["numa"],
                }
                for d in found["devices"]
            ),
            key=lambda d: d["id"],
        )

    def admit(self, name: str, requests: dict[str, int]) -> dict[str, Any]:
        pod = {"name": name, "containers": [{"name": "c", "requests": requests}]}
        return self.cmd({"cmd": "admit", "pod": {**pod, "initContainers": []}})

    def remove(self, name: str) -> None:
        self.cmd({"cmd": "remove", "name": name})

    async def wait_for(self, condition: Callable[[], bool], within: float = 10.0) -> float:
        """Seconds until `condition` held. The harness's loop has no watch, so it is asked again
        every 20 ms, within a bound."""
        started = time.perf_counter()
        async with asyncio.timeout(within):
            while not condition():  # noqa: ASYNC110 -- nothing to wait on but the answers
                await asyncio.sleep(0.02)
        return time.perf_counter() - started


@pytest.fixture(scope="module")
def kubelet() -> Iterator[RealKubelet]:
    work = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))  # socket paths stay short
    binary = work / "realkubelet"
    with gzip.open(REALKUBELET) as packed, binary.open("wb") as out:
        shutil.copyfileobj(packed, out)
    binary.chmod(0o755)
    real = RealKubelet(binary, work / "k")
    try:
        yield real
    finally:
        real.close()
        shutil.rmtree(work, ignore_errors=True)


def time_slicing(replicas: int, *, rename: bool = False, **flags: Any) -> dict[str, Any]:
    return {
        "version": "v1",
        "flags": flags,
        "sharing": {
            "timeSlicing": {
                "renameByDefault": rename,
                "resources": [{"name": GPU, "replicas": replicas}],
            }
        },
    }


def expected(config: dict[str, Any], gpus: str = PRESET) -> dict[str, ResourcePlan]:
    """What the plan says each resource advertises on that node."""
    the_plan = plan(Config.model_validate(config), discover(backend_from_spec(gpus)))
    return {r.name: r for r in the_plan.resources}


def as_kubelet_sees(resource: ResourcePlan) -> list[dict[str, Any]]:
    """ID, health and NUMA nodes of each device, by ID (kubelet keeps a set, not a list)."""
    return sorted(
        (
            {"id": d.id, "health": d.health.value, "numa": [] if d.numa is None else [d.numa]}
            for d in resource.devices
        ),
        key=lambda d: d["id"],
    )


def plugin(kubelet: RealKubelet, config: dict[str, Any], gpus: str = PRESET) -> PluginProcess:
    path = kubelet.kubelet_dir / "config.yaml"
    write(path, config)
    args = ["--config", str(path), "--gpus", gpus, "--kubelet-dir", str(kubelet.kubelet_dir)]
    return PluginProcess([*args, "--metrics-address", "off"])


def write(path: Path, config: dict[str, Any]) -> None:
    """Replace the config file the way an editor saving it would (JSON is YAML)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(config))
    os.replace(tmp, path)


def holds(kubelet: RealKubelet, resource: ResourcePlan) -> Callable[[], bool]:
    def check() -> bool:
        return kubelet.held_list(resource.name) == as_kubelet_sees(resource)

    return check


async def test_kubelet_holds_the_replicas_we_advertise(kubelet: RealKubelet) -> None:
    config = time_slicing(4)
    (resource,) = expected(config).values()
    async with plugin(kubelet, config) as running:
        await kubelet.wait_for(holds(kubelet, resource))
        assert kubelet.capacity(GPU) == (32, 32)
        state = kubelet.devices(GPU)
        assert all("::" in d["id"] for d in state["devices"])
        assert state["options"]["getPreferredAllocationAvailable"] is True
        assert not state["options"].get("preStartRequired")
        assert await running.stop() == 0
    # The final empty list: capacity drops at once, not after kubelet's 5-minute grace.
    await kubelet.wait_for(lambda: kubelet.capacity(GPU) == (0, 0))


async def test_kubelet_holds_every_mig_resource_of_a_mixed_node(kubelet: RealKubelet) -> None:
    config = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    wanted = expected(config, "simulated:a100-mig-mixed")
    assert any(n.startswith("nvidia.com/mig-") for n in wanted)
    async with plugin(kubelet, config, "simulated:a100-mig-mixed") as running:
        for resource in wanted.values():
            await kubelet.wait_for(holds(kubelet, resource))
        mig = [r for n, r in wanted.items() if n.startswith("nvidia.com/mig-")]
        assert all(d.id.startswith("MIG-") for r in mig for d in r.devices)
        assert await running.stop() == 0


@pytest.mark.parametrize(
    ("flags", "answer"),
    [
        ({}, "envs"),
        ({"plugin": {"deviceListStrategy": "cdi-cri"}}, "cdiDevices"),
        ({"plugin": {"deviceListStrategy": "cdi-annotations"}}, "annotations"),
    ],
)
async def test_admission_gets_our_allocate_answer(
    kubelet: RealKubelet, flags: dict[str, Any], answer: str
) -> None:
    config = time_slicing(2, **flags)
    (resource,) = expected(config).values()
    async with plugin(kubelet, config) as running:
        await kubelet.wait_for(holds(kubelet, resource))
        admitted = kubelet.admit("p", {GPU: 2})
        try:
            assert admitted["admitted"] is True, admitted
            (container,) = admitted["containers"]
            ids = container["deviceIds"][GPU]
            assert len(ids) == 2 and set(ids) <= set(resource.ids)
            physical = list(dict.fromkeys(str(resource.device(i).gpu_uuid) for i in ids))  # type: ignore[union-attr]
            # In the order of kubelet's request, which the harness does not show: compared as
            # sets, each physical GPU once.
            if answer == "envs":
                visible = container["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
            elif answer == "cdiDevices":
                visible = [n.removeprefix("nvidia.com/gpu=") for n in container["cdiDevices"]]
            else:
                (names,) = container["annotations"].values()
                visible = [n.removeprefix("nvidia.com/gpu=") for n in names.split(",")]
            assert sorted(visible) == sorted(physical)
            pods = kubelet.cmd({"cmd": "pods"})["pods"]
            assert [p["containers"]["c"][GPU] for p in pods] == [ids]
        finally:
            kubelet.remove("p")
        assert await running.stop() == 0


async def test_a_config_edit_reaches_kubelet(kubelet: RealKubelet) -> None:
    config = time_slicing(4)
    async with plugin(kubelet, config) as running:
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == (32, 32))
        (fewer,) = expected(time_slicing(2)).values()
        write(kubelet.kubelet_dir / "config.yaml", time_slicing(2))
        took = await kubelet.wait_for(holds(kubelet, fewer))
        assert took < 2.0  # the reload goal is 150 ms; the harness is asked every 20 ms
        assert kubelet.capacity(GPU) == (16, 16)
        assert await running.stop() == 0


async def test_the_plugin_registers_again_after_kubelet_restarts(kubelet: RealKubelet) -> None:
    config = time_slicing(3)
    (resource,) = expected(config).values()
    async with plugin(kubelet, config) as running:
        await kubelet.wait_for(holds(kubelet, resource))
        # The manager restarts from its checkpoint and wipes device-plugins/, our socket too.
        kubelet.cmd({"cmd": "restart"})
        try:
            await kubelet.wait_for(lambda: kubelet.capacity(GPU) == (24, 24))
        except TimeoutError:
            raise AssertionError(f"{kubelet.cmd({'cmd': 'devices'})}\n{running.stderr()}") from None
        kubelet.kill_and_start_again()
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == (24, 24))
        await kubelet.wait_for(holds(kubelet, resource))
        assert await running.stop() == 0


async def test_a_held_replica_that_a_reload_drops_stays_counted_until_released(
    kubelet: RealKubelet,
) -> None:
    config = time_slicing(4)
    async with plugin(kubelet, config) as running:
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == (32, 32))
        # Fill the node, so that pods hold the replicas ::2 and ::3 that the edit drops.
        names = [f"p{n}" for n in range(8)]
        admitted = []
        try:
            for name in names:
                admitted.append(kubelet.admit(name, {GPU: 4}))
            assert all(a["admitted"] for a in admitted), admitted
            held = {i for a in admitted for i in a["containers"][0]["deviceIds"][GPU]}
            dropped = {i for i in held if i.endswith(("::2", "::3"))}
            assert len(held) == 32 and len(dropped) == 16
            write(kubelet.kubelet_dir / "config.yaml", time_slicing(2))

            def draining() -> bool:
                found = {d["id"]: d["health"] for d in kubelet.held_list(GPU) or []}
                return len(found) == 32 and all(found[i] == "Unhealthy" for i in dropped)

            await kubelet.wait_for(draining)
            # Every held replica is still counted; only the 16 kept ones are allocatable.
            assert kubelet.capacity(GPU) == (32, 16)
        finally:
            for a in admitted:
                kubelet.remove(a["uid"].removeprefix("uid-"))
        (fewer,) = expected(time_slicing(2)).values()
        # Released: the draining replicas leave the list once PodResources no longer shows them.
        await kubelet.wait_for(holds(kubelet, fewer), within=15.0)
        assert kubelet.capacity(GPU) == (16, 16)
        assert await running.stop() == 0


def admit_in_a_loop(kubelet: RealKubelet, until: threading.Event) -> list[dict[str, Any]]:
    """Admit a one-replica pod and remove it again, as fast as the harness answers, until
    `until` is set; every answer, in order. In a thread: the harness is asked synchronously."""
    answers: list[dict[str, Any]] = []
    while not until.is_set():
        name = f"loop{len(answers)}"
        answers.append(kubelet.admit(name, {GPU: 1}))
        if answers[-1]["admitted"]:
            kubelet.remove(name)
    return answers


async def test_a_rolling_update_hands_the_resource_over_without_a_gap(
    kubelet: RealKubelet,
) -> None:
    """A DaemonSet rolling update with `maxSurge: 1, maxUnavailable: 0`: the new `run`
    registers while the old one serves, then the old one stops. Pods are admitted in a loop
    the whole time, and none is refused; the new one serves on without registering again."""
    config = time_slicing(4)
    (resource,) = expected(config).values()
    async with plugin(kubelet, config) as old:
        await kubelet.wait_for(holds(kubelet, resource))
        async with plugin(kubelet, config) as new:
            await new.wait_for_line("registered")
            await kubelet.wait_for(holds(kubelet, resource))
            until = threading.Event()
            admitting = asyncio.ensure_future(asyncio.to_thread(admit_in_a_loop, kubelet, until))
            try:
                await asyncio.sleep(0.1)
                assert await old.stop() == 0
                await asyncio.sleep(0.3)  # what kubelet does after the old stream ended
            finally:
                until.set()
                answers = await admitting
            refused = [a for a in answers if not a["admitted"]]
            assert len(answers) > 20 and not refused, refused[:3]
            assert any("no empty list sent" in line for line in old.stderr_lines)
            assert kubelet.held_list(GPU) == as_kubelet_sees(resource)
            assert kubelet.capacity(GPU) == (32, 32)
            assert not any("kubelet dropped the registration" in line for line in new.stderr_lines)
            assert await new.stop() == 0
            # Alone now: its empty list takes the capacity to 0 at once, as without a handover.
            await kubelet.wait_for(lambda: kubelet.capacity(GPU) == (0, 0))


class SupersededPlugin(dp_grpc.DevicePluginServicer):
    """A minimal device plugin of one device ("old-0") on `<kubelet-dir>/device-plugins/old.sock`:
    the registration that a newer one supersedes. Its ListAndWatch stream sends the one list
    and stays open until `end()`."""

    ENDPOINT = "old.sock"  # not named like ours: no instance of ours takes it for another

    def __init__(self, kubelet_dir: Path) -> None:
        self.kubelet_dir = kubelet_dir
        self.ended = asyncio.Event()
        self._server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, self._server)
        socket = kubelet_dir / "device-plugins" / self.ENDPOINT
        self._server.add_insecure_port(f"unix://{socket}")

    async def __aenter__(self) -> SupersededPlugin:
        await self._server.start()
        await registration.register(
            self.kubelet_dir,
            endpoint=self.ENDPOINT,
            resource_name=GPU,
            options=dp.DevicePluginOptions(),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.end()
        await self._server.stop(None)

    def end(self) -> None:
        """End the stream: its handler returns, kubelet reads the end of the stream."""
        self.ended.set()

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Any
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    async def ListAndWatch(
        self, request: dp.Empty, context: Any
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        numa = dp.TopologyInfo(nodes=[dp.NUMANode(ID=0)])
        yield dp.ListAndWatchResponse(
            devices=[dp.Device(ID="old-0", health="Healthy", topology=numa)]
        )
        await self.ended.wait()


def ids_held(kubelet: RealKubelet) -> list[str]:
    return sorted(d["id"] for d in kubelet.devices(GPU).get("devices", []))


def gpu_server(
    kubelet: RealKubelet, config: dict[str, Any], lost: list[ResourceServer]
) -> tuple[ResourceServer, ResourcePlan]:
    """A ResourceServer of the config's one resource; what it reports lost goes to `lost`."""
    (resource,) = expected(config).values()
    inventory = discover(backend_from_spec(PRESET))
    context = AllocateContext(flags=Config.model_validate(config).flags, inventory=inventory)
    server = ResourceServer(
        kubelet_dir=kubelet.kubelet_dir, resource=resource, context=context, on_lost=lost.append
    )
    return server, resource


async def test_kubelet_drops_the_current_registration_when_a_superseded_stream_ends(
    kubelet: RealKubelet,
) -> None:
    """The kubelet behaviour the handover works around (1.32 devicemanager handler.go
    `runClient`): when a stream that a newer registration of the same resource superseded
    ends, kubelet ends the newer one's stream and counts the resource's devices Unhealthy.
    Here the newer registration is ours, its stream open (kubelet holds our list, which only
    that stream carries) when the superseded one ends; our server reports the loss (for the
    supervisor to register again). A fixed kubelet turns this test red."""
    config = time_slicing(2)
    lost: list[ResourceServer] = []
    server, resource = gpu_server(kubelet, config, lost)
    async with SupersededPlugin(kubelet.kubelet_dir) as old:
        await kubelet.wait_for(lambda: ids_held(kubelet) == ["old-0"])
        try:
            await server.register()
            await kubelet.wait_for(holds(kubelet, resource))
            assert kubelet.devices(GPU)["endpoint"] == "connected"
            old.end()
            await kubelet.wait_for(lambda: kubelet.devices(GPU)["endpoint"] == "stopped")
            assert kubelet.capacity(GPU) == (16, 0)
            # Kubelet cancelled our stream: what tells the supervisor to register again.
            await kubelet.wait_for(lambda: lost == [server])
            assert not server.registered
        finally:
            await server.stop()
    await kubelet.wait_for(lambda: kubelet.capacity(GPU)[1] == 0)


@pytest.mark.parametrize("socket", ["kept", "deleted"])
async def test_a_restart_while_kubelet_lives_keeps_the_resource_without_a_gap(
    kubelet: RealKubelet, socket: str
) -> None:
    """`ResourceServer.restart()` (our socket vanished while kubelet lives, or a relisten):
    the new registration takes over while kubelet still holds the old stream, and the old
    stream's end must not make kubelet drop it. Pods are admitted in a loop the whole time."""
    config = time_slicing(2)
    lost: list[ResourceServer] = []
    server, resource = gpu_server(kubelet, config, lost)
    try:
        await server.register()
        await kubelet.wait_for(holds(kubelet, resource))
        old = server.socket_path
        assert old is not None
        if socket == "deleted":
            old.unlink()  # what makes the supervisor restart: kubelet then cannot dial it
        until = threading.Event()
        admitting = asyncio.ensure_future(asyncio.to_thread(admit_in_a_loop, kubelet, until))
        try:
            await asyncio.sleep(0.1)
            await server.restart()
            await asyncio.sleep(0.3)  # what kubelet does after the old stream ended
        finally:
            until.set()
            answers = await admitting
        refused = [a for a in answers if not a["admitted"]]
        assert len(answers) > 10 and not refused, refused[:3]
        assert server.socket_path not in (None, old)
        assert kubelet.devices(GPU)["endpoint"] == "connected"
        assert kubelet.held_list(GPU) == as_kubelet_sees(resource)
        assert kubelet.capacity(GPU) == (16, 16)
        assert server.registered and not lost
    finally:
        await server.stop()
    await kubelet.wait_for(lambda: kubelet.capacity(GPU) == (0, 0))
