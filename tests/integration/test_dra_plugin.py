"""The DRA kubelet plugin over real unix sockets, driven by the tests' DRA kubelet simulator:
registration, prepare -> CDI spec -> unprepare, idempotence across restarts, per-claim errors."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.dra.kubelet import DraKubeletSimulator

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.config.model import Config
from sharing_plugin.dra.api.constants import V1_SERVICE, V1BETA1_SERVICE
from sharing_plugin.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from sharing_plugin.dra.claims import Claim, ClaimRef, claim_from_document
from sharing_plugin.dra.prepare import ClaimPreparer, PoolState
from sharing_plugin.dra.server import DraPluginServer, plugin_dir
from sharing_plugin.errors import KubeApiError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.cdi import CdiSpecDir
from sharing_plugin.plan import Plan
from sharing_plugin.views.dra import dra_devices

DRIVER = "gpu.sharing-plugin.io"
NODE = "node-a"


class ClaimBook:
    """The claims the API would hold, as a working ClaimReader (counts its reads)."""

    def __init__(self) -> None:
        self.documents: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(
        self,
        name: str,
        devices: list[str],
        *,
        pool: str = NODE,
        driver: str = DRIVER,
        namespace: str = "default",
        allocated: bool = True,
    ) -> ClaimRef:
        uid = str(uuid.uuid4())
        doc: dict[str, Any] = {"metadata": {"namespace": namespace, "name": name, "uid": uid}}
        if allocated:
            results = [
                {"request": f"r{i}", "driver": driver, "pool": pool, "device": d}
                for i, d in enumerate(devices)
            ]
            doc["status"] = {"allocation": {"devices": {"results": results}}}
        self.documents[(namespace, name)] = doc
        return ClaimRef(namespace, name, uid)

    async def read(self, ref: ClaimRef) -> Claim:
        self.reads += 1
        doc = self.documents.get((ref.namespace, ref.name))
        if doc is None:
            raise KubeApiError(f'resourceclaims "{ref.name}" not found', code=404)
        return claim_from_document(doc)


class Node:
    """One plugin instance on a kubelet dir: preparer, server, and what it serves."""

    def __init__(self, root: Path, book: ClaimBook, state: PoolState) -> None:
        self.root = root
        self.book = book
        self.state = state
        self.changes = 0
        self.cdi = root / "cdi"
        self.preparer = ClaimPreparer(
            driver=DRIVER,
            pool=NODE,
            claims=book,
            specs=CdiSpecDir(self.cdi),
            checkpoint=Checkpoint(plugin_dir(root, DRIVER) / CHECKPOINT_FILE),
            state=lambda: self.state,
            on_change=self._changed,
        )
        self.server = DraPluginServer(kubelet_dir=root, driver=DRIVER, preparer=self.preparer)

    def _changed(self) -> None:
        self.changes += 1


def pool_state(
    make_plan: Callable[..., tuple[Plan, Config, Inventory]], cfg: dict[str, Any]
) -> PoolState:
    plan, config, inventory = make_plan(cfg, "dgx-a100-80gb")
    devices = {d.name: d for d in dra_devices(plan, inventory, shared=SharedDevices.REPLICAS)}
    return PoolState(devices=devices, plan=plan, flags=config.flags)


SHARED = {
    "sharing": {
        "timeSlicing": {"renameByDefault": True, "resources": [{"name": "gpu", "replicas": 4}]}
    }
}


@pytest.fixture
def state(make_plan: Callable[..., tuple[Plan, Config, Inventory]]) -> PoolState:
    return pool_state(make_plan, SHARED)


@pytest.fixture
async def node(short_dir: Path, state: PoolState) -> AsyncIterator[Node]:
    n = Node(short_dir, ClaimBook(), state)
    await n.server.start()
    try:
        yield n
    finally:
        await n.server.stop()


def replicas(state: PoolState, count: int) -> list[str]:
    return [name for name in state.devices if name.endswith(("-r0", "-r1"))][:count]


async def test_registers_through_plugins_registry_with_both_services(node: Node) -> None:
    async with DraKubeletSimulator(node.root) as kubelet:
        plugin = await kubelet.wait_plugin(DRIVER)
        assert plugin.service == V1_SERVICE
        instance = node.server.instance
        assert plugin.endpoint == str(node.root / "plugins" / DRIVER / f"dra-{instance}.sock")
        (event,) = [e for e in kubelet.events if e["call"] == "register"]
        assert event["versions"] == [V1_SERVICE, V1BETA1_SERVICE]
        assert event["error"] is None
        await node.server.registration.registered.wait()
    assert (node.root / "plugins_registry" / f"{DRIVER}-{instance}-reg.sock").exists()


async def test_an_older_kubelet_speaks_v1beta1(node: Node) -> None:
    ref = node.book.add("c", replicas(node.state, 1))
    async with DraKubeletSimulator(node.root, services=(V1BETA1_SERVICE,)) as kubelet:
        plugin = await kubelet.wait_plugin(DRIVER)
        assert plugin.service == V1BETA1_SERVICE
        answer = await kubelet.prepare(DRIVER, [ref])
        assert answer[ref.uid].error == ""
        assert len(answer[ref.uid].devices) == 1


async def test_prepare_writes_the_cdi_spec_and_answers_its_ids(node: Node) -> None:
    names = replicas(node.state, 2)
    ref = node.book.add("pair", names)
    async with DraKubeletSimulator(node.root) as kubelet:
        await kubelet.wait_plugin(DRIVER)
        answer = (await kubelet.prepare(DRIVER, [ref]))[ref.uid]
    assert answer.error == ""
    assert [d["device"] for d in answer.devices] == names
    assert [d["requests"] for d in answer.devices] == [["r0"], ["r1"]]
    assert {d["pool"] for d in answer.devices} == {NODE}
    assert [d["cdiIds"] for d in answer.devices] == [
        [f"{DRIVER}/claim={ref.uid}-{n}"] for n in names
    ]
    spec_path = node.cdi / f"{DRIVER}-claim_{ref.uid}.json"
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == f"{DRIVER}/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{ref.uid}-{n}" for n in names]
    physical = list(dict.fromkeys(node.state.devices[n].device.physical for n in names))
    for device in spec["devices"]:
        assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={','.join(physical)}"]
    assert oct(spec_path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in node.cdi.iterdir()] == [spec_path.name]  # no temporary left
    assert node.changes == 1


async def test_prepare_again_answers_from_the_checkpoint_even_after_a_restart(
    node: Node,
) -> None:
    ref = node.book.add("c", replicas(node.state, 1))
    async with DraKubeletSimulator(node.root) as kubelet:
        await kubelet.wait_plugin(DRIVER)
        first = await kubelet.prepare(DRIVER, [ref])
        assert await kubelet.prepare(DRIVER, [ref]) == first
        assert node.book.reads == 1
        # The plugin restarts: a new process reads its checkpoint.
        await node.server.stop()
        await kubelet.wait_gone(DRIVER)
        again = Node(node.root, node.book, node.state)
        await again.server.start()
        try:
            await kubelet.wait_plugin(DRIVER)
            assert await kubelet.prepare(DRIVER, [ref]) == first
            assert node.book.reads == 1
            assert set(again.preparer.held()) == {first[ref.uid].devices[0]["device"]}
            assert await kubelet.unprepare(DRIVER, [ref]) == {ref.uid: ""}
        finally:
            await again.server.stop()
    assert list(node.cdi.iterdir()) == []
    checkpoint = json.loads((plugin_dir(node.root, DRIVER) / CHECKPOINT_FILE).read_text())
    assert checkpoint["claims"] == []


async def test_unprepare_removes_the_spec_and_is_idempotent(node: Node) -> None:
    ref = node.book.add("c", replicas(node.state, 1))
    never = ClaimRef("default", "never-prepared", str(uuid.uuid4()))
    async with DraKubeletSimulator(node.root) as kubelet:
        await kubelet.wait_plugin(DRIVER)
        await kubelet.prepare(DRIVER, [ref])
        assert node.preparer.held()
        assert await kubelet.unprepare(DRIVER, [ref, never]) == {ref.uid: "", never.uid: ""}
        assert await kubelet.unprepare(DRIVER, [ref]) == {ref.uid: ""}
    assert list(node.cdi.iterdir()) == []
    assert node.preparer.held() == {}
    assert node.changes == 2


async def test_each_claim_gets_its_own_error_and_the_others_are_prepared(node: Node) -> None:
    good = node.book.add("good", replicas(node.state, 1))
    other_node = node.book.add("other-node", replicas(node.state, 1), pool="node-b")
    other_driver = node.book.add("other-driver", ["gpu-0"], driver="gpu.nvidia.com")
    pending = node.book.add("pending", [], allocated=False)
    unknown = node.book.add("unknown", ["gpu-not-here"])
    missing = ClaimRef("default", "missing", str(uuid.uuid4()))
    recreated = node.book.add("recreated", replicas(node.state, 1))
    stale = ClaimRef("default", "recreated", str(uuid.uuid4()))
    refs = [good, other_node, other_driver, pending, unknown, missing, stale]
    async with DraKubeletSimulator(node.root) as kubelet:
        await kubelet.wait_plugin(DRIVER)
        answers = await kubelet.prepare(DRIVER, refs)
    assert set(answers) == {r.uid for r in refs}
    assert answers[good.uid].error == "" and answers[good.uid].devices
    errors = {r.name: answers[r.uid].error for r in refs if r is not good}
    assert "pool node-b" in errors["other-node"] and "another node" in errors["other-node"]
    assert "no device of driver gpu.sharing-plugin.io" in errors["other-driver"]
    assert "gpu.nvidia.com" in errors["other-driver"]
    assert errors["pending"] == "ResourceClaim default/pending is not allocated"
    assert "device gpu-not-here is not in this node's pool" in errors["unknown"]
    assert "not found" in errors["missing"]
    assert f"has UID {recreated.uid}, not {stale.uid}" in errors["recreated"]
    assert all(answers[r.uid].devices == () for r in refs if r is not good)
    assert [p.name for p in node.cdi.iterdir()] == [f"{DRIVER}-claim_{good.uid}.json"]


async def test_a_device_of_an_unhealthy_gpu_is_refused(
    node: Node, make_plan: Callable[..., tuple[Plan, Config, Inventory]]
) -> None:
    name = replicas(node.state, 1)[0]
    gpu = node.state.devices[name].device.gpu_uuid
    sick = node.state.plan.with_health({gpu: False})
    _, _, inventory = make_plan(SHARED, "dgx-a100-80gb")
    node.state = PoolState(
        devices={d.name: d for d in dra_devices(sick, inventory, shared=SharedDevices.REPLICAS)},
        plan=sick,
        flags=node.state.flags,
    )
    ref = node.book.add("c", [name])
    async with DraKubeletSimulator(node.root) as kubelet:
        await kubelet.wait_plugin(DRIVER)
        answer = (await kubelet.prepare(DRIVER, [ref]))[ref.uid]
    assert "is unhealthy" in answer.error


async def test_mps_claims_get_the_pipe_directory(
    short_dir: Path, make_plan: Callable[..., tuple[Plan, Config, Inventory]]
) -> None:
    state = pool_state(
        make_plan, {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}}
    )
    n = Node(short_dir, ClaimBook(), state)
    ref = n.book.add("mps", replicas(state, 1))
    await n.server.start()
    try:
        async with DraKubeletSimulator(n.root) as kubelet:
            await kubelet.wait_plugin(DRIVER)
            assert (await kubelet.prepare(DRIVER, [ref]))[ref.uid].error == ""
    finally:
        await n.server.stop()
    (spec_file,) = n.cdi.iterdir()
    (device,) = json.loads(spec_file.read_text())["devices"]
    edits = device["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe" in edits["env"]
    assert {m["containerPath"] for m in edits["mounts"]} == {"/mps/nvidia.com/gpu/pipe", "/dev/shm"}


async def test_stopping_withdraws_the_registration_first(node: Node) -> None:
    async with DraKubeletSimulator(node.root) as kubelet:
        await kubelet.wait_plugin(DRIVER)
        await node.server.stop()
        await kubelet.wait_gone(DRIVER)
        assert [e["call"] for e in kubelet.events][-1] == "deregister"
    assert not node.server.endpoint.exists()
    assert not node.server.registration_path.exists()


async def test_a_kubelet_restart_registers_the_plugin_again(node: Node) -> None:
    ref = node.book.add("c", replicas(node.state, 1))
    async with DraKubeletSimulator(node.root) as kubelet:
        await kubelet.wait_plugin(DRIVER)
        await kubelet.restart()
        await kubelet.wait_plugin(DRIVER)
        assert (await kubelet.prepare(DRIVER, [ref]))[ref.uid].error == ""
    assert node.server.registration.calls == 2


async def test_stale_sockets_are_removed_and_another_instance_s_stay(
    short_dir: Path, state: PoolState
) -> None:
    # A killed run leaves its sockets behind, nobody listening; so may an earlier release,
    # under the fixed names.
    killed = Node(short_dir, ClaimBook(), state)
    stale = [
        killed.server.endpoint,
        killed.server.registration_path,
        short_dir / "plugins" / DRIVER / "dra.sock",
        short_dir / "plugins_registry" / f"{DRIVER}-reg.sock",
    ]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    first = Node(short_dir, ClaimBook(), state)
    second = Node(short_dir, ClaimBook(), state)
    await first.server.start()
    try:
        await second.server.start()  # a rolling update's new instance: both serve
        try:
            assert not any(p.exists() for p in stale)
            assert first.server.others_serving() == [second.server.registration_path]
            assert second.server.others_serving() == [first.server.registration_path]
        finally:
            await second.server.stop()
        assert first.server.endpoint.exists() and first.server.registration_path.exists()
        assert first.server.others_serving() == []
        async with DraKubeletSimulator(short_dir) as kubelet:
            await kubelet.wait_plugin(DRIVER)
    finally:
        await first.server.stop()


async def test_a_corrupt_checkpoint_is_kept_aside(short_dir: Path, state: PoolState) -> None:
    path = plugin_dir(short_dir, DRIVER) / CHECKPOINT_FILE
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "claims": [], "checksum": "nope"}')
    n = Node(short_dir, ClaimBook(), state)
    assert n.preparer.prepared == {}
    assert path.with_name(CHECKPOINT_FILE + ".corrupt").exists()
