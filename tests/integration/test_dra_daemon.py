"""run-dra in-process: the config's plan published as the node's pool, claims allocated by the
test allocator and prepared through the DRA kubelet simulator, reloads and restarts (health:
test_dra_health.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dra_harness import DRIVER, NODE, dra_running, foreign_claim
from kube_api import FakeKubeApi
from support.observe import wait_published

from sharing_plugin.dra.api.constants import V1BETA1_SERVICE

SHARED = "nvidia.com/gpu.shared"


def shared(replicas: int, *, by: str = "replicas", **extra: str) -> str:
    """A time-slicing config of `replicas` per GPU, published one device per replica unless
    `by` says otherwise (the test allocator here knows no consumable capacity; the real one's
    tests are in tests/e2e)."""
    lines = [
        "version: v1",
        "dra:",
        f"  sharedDevices: {by}",
        "sharing:",
        "  timeSlicing:",
        "    renameByDefault: true",
        "    resources:",
        "      - name: gpu",
        f"        replicas: {replicas}",
    ]
    return "\n".join(lines) + "\n" + "".join(f"{k}\n" for k in extra.values())


async def test_the_plan_is_published_as_the_nodes_pool(short_dir: Path) -> None:
    async with dra_running(short_dir, shared(4)) as run:
        await run.published(32)
        slices = run.slices()
        assert len(slices) == 1
        (s,) = slices
        assert s["spec"]["nodeName"] == NODE
        assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        assert s["apiVersion"] == "resource.k8s.io/v1"
        device = s["spec"]["devices"][0]
        assert device["attributes"]["resource"] == {"string": SHARED}
        assert device["attributes"]["sharing"] == {"string": "time-slicing"}
        assert device["attributes"]["replica"] == {"int": 0}
        assert device["capacity"] == {"memory": {"value": "80Gi"}}
        status = run.daemon.status.to_json()
        assert status["resources"][SHARED]["devices"] == 32
        assert status["ready"] is True


async def test_a_shared_gpu_is_published_as_one_device_whose_memory_claims_consume(
    short_dir: Path,
) -> None:
    async with dra_running(short_dir, shared(4, by="capacity")) as run:
        await run.published(8)
        (s,) = run.slices()
        device = s["spec"]["devices"][0]
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"] == {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "20Gi",
                    "validRange": {"min": "20Gi", "max": "80Gi", "step": "20Gi"},
                },
            }
        }
        assert "replica" not in device["attributes"]
        assert run.daemon.status.to_json()["resources"][SHARED]["devices"] == 8


async def test_a_server_that_drops_the_capacity_fields_gets_one_device_per_replica(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeKubeApi() as api:
        # A 1.34-1.35 server with the consumable-capacity gate off: it stores the slices
        # without the fields, silently. The plugin reads them back and publishes replicas.
        api.dra_features_off = frozenset({"DRAConsumableCapacity"})
        async with dra_running(short_dir, shared(4, by="capacity"), api=api) as run:
            await run.published(32)
            assert all("allowMultipleAllocations" not in d for d in run.devices())
            dra = run.daemon.status.to_json()["dra"]
            assert dra["sharedDevices"] == "replicas"
            assert "DRAConsumableCapacity" in dra["reason"]
    said = [r.getMessage() for r in caplog.records if "one device per replica" in r.getMessage()]
    assert len(said) == 1  # said once, not at every publish


async def test_allocate_prepare_cdi_spec_and_unprepare(short_dir: Path) -> None:
    async with dra_running(short_dir, shared(4)) as run:
        await run.published(32)
        ref = run.claim("two-replicas", SHARED, count=2)
        answer = await run.prepare(ref)
        assert answer.error == ""
        names = [d["device"] for d in answer.devices]
        assert len(names) == 2 and set(names) <= set(run.device_names())
        assert [d["cdiIds"] for d in answer.devices] == [
            [f"{DRIVER}/claim={ref.uid}-{n}"] for n in names
        ]
        spec_file = short_dir / "cdi" / f"{DRIVER}-claim_{ref.uid}.json"
        spec = json.loads(spec_file.read_text())
        uuids = {
            d["name"]: d["attributes"]["uuid"]["string"]
            for s in run.slices()
            for d in s["spec"]["devices"]
        }
        visible = ",".join(dict.fromkeys(uuids[n] for n in names))
        assert [d["containerEdits"]["env"] for d in spec["devices"]] == [
            [f"NVIDIA_VISIBLE_DEVICES={visible}"]
        ] * 2
        assert await run.unprepare(ref) == ""
        assert not spec_file.exists()


async def test_a_claim_of_another_node_gets_an_error(short_dir: Path) -> None:
    async with dra_running(short_dir, shared(2)) as run:
        published = await run.published(16)
        ref = foreign_claim(run.api, "elsewhere", published[0].name, pool="node-b")
        answer = await run.prepare(ref)
        assert "pool node-b" in answer.error
        assert answer.devices == ()


async def test_replicas_down_keep_a_prepared_device_until_unprepared(short_dir: Path) -> None:
    async with dra_running(short_dir, shared(4)) as run:
        await run.published(32)
        last = 'device.attributes["gpu.sharing-plugin.io"].replica == 3'
        ref = run.claim("last-replica", SHARED, selectors=[last])
        answer = await run.prepare(ref)
        (held,) = [d["device"] for d in answer.devices]
        assert held.endswith("-r3")
        run.write(shared(2))
        # 16 replicas of the new config, plus the held one (draining).
        await run.published(17)
        assert held in run.device_names()
        assert run.daemon.status.to_json()["resources"][SHARED]["draining"] == [held]
        generation = run.slices()[0]["spec"]["pool"]["generation"]
        assert generation == 2
        # Preparing it again (a kubelet retry) still answers.
        assert (await run.prepare(ref)).devices == answer.devices
        assert await run.unprepare(ref) == ""
        await run.published(16)
        assert held not in run.device_names()
        assert run.slices()[0]["spec"]["pool"]["generation"] == 3
        # Replicas up again: the same names come back.
        run.write(shared(4))
        await run.published(32)
        assert held in run.device_names()


async def test_a_plugin_restart_keeps_prepared_claims_and_their_devices(short_dir: Path) -> None:
    async with FakeKubeApi() as api:
        async with dra_running(short_dir, shared(4), api=api) as run:
            await run.published(32)
            last = 'device.attributes["gpu.sharing-plugin.io"].replica == 3'
            ref = run.claim("kept", SHARED, selectors=[last])
            answer = await run.prepare(ref)
            (held,) = [d["device"] for d in answer.devices]
        # The kubelet wiped the slices when the plugin went away; a new config comes with it.
        assert api.dra_objects("resourceslices") == []
        async with dra_running(short_dir, shared(2), api=api) as run:
            devices = await run.published(17)
            assert held in [d.name for d in devices]
            assert (await run.prepare(ref)).devices == answer.devices
            assert await run.unprepare(ref) == ""
            await run.published(16)
            assert held not in run.device_names()


async def test_mig_mixed_devices_carry_their_profile(short_dir: Path) -> None:
    config = "version: v1\nflags:\n  migStrategy: mixed\n"
    async with dra_running(short_dir, config, gpus="simulated:a100-mig-mixed") as run:
        devices = await wait_published(run.keeper, lambda d: len(d) > 0)
        profiles = {
            str(d.attributes["resource"]["string"]): d.attributes.get("migProfile") for d in devices
        }
        mig = {r: p for r, p in profiles.items() if r.startswith("nvidia.com/mig-")}
        assert mig
        for resource, profile in mig.items():
            assert profile is not None
            assert resource == "nvidia.com/mig-" + str(profile["string"]).replace("+", ".")
        resource = sorted(mig)[0]
        ref = run.claim("one-mig", resource)
        answer = await run.prepare(ref)
        assert answer.error == ""
        (device,) = answer.devices
        assert device["device"].startswith("mig-")
        spec = json.loads((short_dir / "cdi" / f"{DRIVER}-claim_{ref.uid}.json").read_text())
        (env,) = [d["containerEdits"]["env"] for d in spec["devices"]]
        assert env[0].startswith("NVIDIA_VISIBLE_DEVICES=MIG-")


async def test_mps_claims_get_the_pipe_directory(short_dir: Path) -> None:
    config = (
        "version: v1\ndra:\n  sharedDevices: replicas\n"
        "sharing:\n  mps:\n    resources:\n      - name: gpu\n        replicas: 2\n"
    )
    async with dra_running(short_dir, config) as run:
        devices = await run.published(16)
        assert {d.attributes["sharing"]["string"] for d in devices} == {"mps"}
        ref = run.claim("mps", "nvidia.com/gpu")
        assert (await run.prepare(ref)).error == ""
        spec = json.loads((short_dir / "cdi" / f"{DRIVER}-claim_{ref.uid}.json").read_text())
        (device,) = spec["devices"]
        assert "CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe" in device["containerEdits"]["env"]


async def test_a_v1beta1_cluster_gets_v1beta1_slices_and_calls(short_dir: Path) -> None:
    async with dra_running(
        short_dir, shared(2), versions=("v1beta1",), kubelet_services=(V1BETA1_SERVICE,)
    ) as run:
        await run.published(16)
        assert run.kubelet.plugins[DRIVER].service == V1BETA1_SERVICE
        ref = run.claim("beta", SHARED)
        assert (await run.prepare(ref)).error == ""
        assert await run.unprepare(ref) == ""


async def test_a_kubelet_restart_gets_the_slices_back(short_dir: Path) -> None:
    async with dra_running(short_dir, shared(2)) as run:
        await run.published(16)
        # A new kubelet deleted the driver's slices; it registers the plugin again.
        for s in run.slices():
            run.api.delete_dra_object("resourceslices", s["metadata"]["name"])
        await run.kubelet.restart()
        await run.kubelet.wait_plugin(DRIVER)
        await wait_published(run.keeper, lambda d: len(run.device_names()) == 16)
        assert run.slices()[0]["spec"]["pool"]["generation"] == 2


async def test_clear_slices_on_exit(short_dir: Path) -> None:
    async with FakeKubeApi() as api:
        async with dra_running(
            short_dir, shared(2), api=api, kubelet_wipes=False, clear_slices_on_exit=True
        ) as run:
            await run.published(16)
        assert api.dra_objects("resourceslices") == []
