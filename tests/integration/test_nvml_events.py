"""Xid and ECC health events: from the simulated NVML (method call or node file edit) to the
adapter."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml_fast
from support.observe import inject_ecc, inject_xid, set_lost, wait_until_shut_down

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.health_tracker import EventKind
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.events import NvmlEvent, NvmlEventWatch
from sharing_plugin.sim.nvml.simulated import SimulatedNvml


async def test_an_injected_xid_reaches_the_iterator() -> None:
    sim = SimulatedNvml.from_preset("dgx-a100-80gb")
    inventory = discover(sim)
    async with NvmlEventWatch(sim, inventory, wait_ms=100) as events:
        inject_xid(sim, 3, 48)
        event = await asyncio.wait_for(anext(events), timeout=1.0)
    assert event == NvmlEvent(inventory.gpus[3].uuid, 48)


async def test_an_xid_on_a_mig_device_names_that_mig_device() -> None:
    sim = SimulatedNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    target = inventory.gpus[4].mig_devices[1]
    async with NvmlEventWatch(sim, inventory, wait_ms=100) as events:
        inject_xid(sim, target.uuid, 94)
        inject_xid(sim, 4, 48)  # not attributed to an instance: the whole GPU
        first = await asyncio.wait_for(anext(events), timeout=1.0)
        second = await asyncio.wait_for(anext(events), timeout=1.0)
    assert first == NvmlEvent(target.uuid, 94)
    assert second == NvmlEvent(inventory.gpus[4].uuid, 48)


def _node_file(path: Path) -> Path:
    path.write_text(
        yaml_fast.dump(
            {
                "gpus": [{"product": "Tesla T4", "count": 2}],
                "faults": [{"gpu": 0, "xid": 31}],  # present at start: history, not delivered
            }
        )
    )
    return path


def _append_fault(path: Path, fault: dict[str, object]) -> None:
    data = yaml_fast.load(path.read_text())
    data["faults"].append(fault)
    path.write_text(yaml_fast.dump(data))


async def test_appending_to_the_faults_list_delivers_one_event(tmp_path: Path) -> None:
    node = _node_file(tmp_path / "node.yaml")
    sim = backend_from_spec(f"simulated:{node}")
    inventory = discover(sim)
    async with NvmlEventWatch(sim, inventory, wait_ms=200) as events:
        loop = asyncio.get_running_loop()
        started = loop.time()
        _append_fault(node, {"gpu": 1, "xid": 79})
        event = await asyncio.wait_for(anext(events), timeout=1.0)
        assert loop.time() - started < 1.0
        assert event == NvmlEvent(inventory.gpus[1].uuid, 79)
        # The same entry is not delivered twice when the file changes again.
        _append_fault(node, {"gpu": inventory.gpus[0].uuid, "xid": 13})
        event = await asyncio.wait_for(anext(events), timeout=1.0)
        assert event == NvmlEvent(inventory.gpus[0].uuid, 13)


async def test_a_lost_entry_makes_the_gpu_lost_and_reports_xid_79(tmp_path: Path) -> None:
    node = _node_file(tmp_path / "node.yaml")
    sim = backend_from_spec(f"simulated:{node}")
    inventory = discover(sim)
    async with NvmlEventWatch(sim, inventory, wait_ms=200) as events:
        _append_fault(node, {"gpu": 0, "lost": True})
        event = await asyncio.wait_for(anext(events), timeout=1.0)
    assert event == NvmlEvent(inventory.gpus[0].uuid, 79)
    assert not discover(sim).gpus[0].healthy_at_discovery


async def test_ecc_errors_reach_the_iterator_naming_the_gpu() -> None:
    sim = SimulatedNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    mig = inventory.gpus[4].mig_devices[1]
    async with NvmlEventWatch(sim, inventory, wait_ms=100) as events:
        inject_ecc(sim, 2, "double")
        inject_ecc(sim, mig.uuid, "single")  # NVML attributes only Xids: the whole GPU
        first = await asyncio.wait_for(anext(events), timeout=1.0)
        second = await asyncio.wait_for(anext(events), timeout=1.0)
    assert first == NvmlEvent(inventory.gpus[2].uuid, 0, EventKind.DOUBLE_BIT_ECC)
    assert second == NvmlEvent(inventory.gpus[4].uuid, 0, EventKind.SINGLE_BIT_ECC)


async def test_an_ecc_entry_in_the_node_file_delivers_one_event(tmp_path: Path) -> None:
    node = _node_file(tmp_path / "node.yaml")
    sim = backend_from_spec(f"simulated:{node}")
    inventory = discover(sim)
    async with NvmlEventWatch(sim, inventory, wait_ms=200) as events:
        _append_fault(node, {"gpu": 1, "ecc": "double"})
        event = await asyncio.wait_for(anext(events), timeout=1.0)
        assert event == NvmlEvent(inventory.gpus[1].uuid, 0, EventKind.DOUBLE_BIT_ECC)
        _append_fault(node, {"gpu": 0, "xid": 13})
        event = await asyncio.wait_for(anext(events), timeout=1.0)
        assert event == NvmlEvent(inventory.gpus[0].uuid, 13)  # the ECC entry came only once


async def test_only_the_chosen_event_kinds_are_registered() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    async with NvmlEventWatch(
        sim, inventory, wait_ms=50, kinds=frozenset({EventKind.XID})
    ) as events:
        inject_ecc(sim, 0, "double")  # not registered: NVML does not queue it
        inject_xid(sim, 1, 48)
        event = await asyncio.wait_for(anext(events), timeout=1.0)
    assert event == NvmlEvent(inventory.gpus[1].uuid, 48)
    ecc_only = frozenset({EventKind.DOUBLE_BIT_ECC})
    async with NvmlEventWatch(sim, inventory, wait_ms=50, kinds=ecc_only) as events:
        inject_xid(sim, 1, 79)
        inject_ecc(sim, 3, "single")
        inject_ecc(sim, 2, "double")
        event = await asyncio.wait_for(anext(events), timeout=1.0)
    assert event == NvmlEvent(inventory.gpus[2].uuid, 0, EventKind.DOUBLE_BIT_ECC)


class EccOffOnGpu1(SimulatedNvml):
    """GPU 1 has ECC turned off: NVML reports no ECC event types for it."""

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        import pynvml

        supported = super().nvmlDeviceGetSupportedEventTypes(handle)
        if self._gpu(handle).index == 1:
            return supported & int(pynvml.nvmlEventTypeXidCriticalError)
        return supported


async def test_event_types_a_gpu_lacks_are_skipped_on_that_gpu_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = EccOffOnGpu1.from_preset("t4x4")
    inventory = discover(sim)
    caplog.set_level(logging.INFO, logger="sharing_plugin.nvml.events")
    async with NvmlEventWatch(sim, inventory, wait_ms=50) as events:
        assert watch_state(events) == (
            [],
            {inventory.gpus[1].uuid: {"double-bit-ecc", "single-bit-ecc"}},
        )
        inject_ecc(sim, 1, "double")  # not registered on GPU 1
        inject_xid(sim, 1, 79)  # still watched there
        inject_ecc(sim, 2, "double")
        first = await asyncio.wait_for(anext(events), timeout=1.0)
        second = await asyncio.wait_for(anext(events), timeout=1.0)
    assert first == NvmlEvent(inventory.gpus[1].uuid, 79)
    assert second == NvmlEvent(inventory.gpus[2].uuid, 0, EventKind.DOUBLE_BIT_ECC)
    lines = [r.getMessage() for r in caplog.records if "does not report" in r.getMessage()]
    assert lines == [
        f"GPU 1 ({inventory.gpus[1].uuid}) does not report double-bit ECC, single-bit ECC events "
        "(its ECC is off, or it has none); they are not watched on it"
    ]
    # A GPU that supports none of the chosen kinds is not watched at all.
    async with NvmlEventWatch(
        sim, inventory, wait_ms=50, kinds=frozenset({EventKind.DOUBLE_BIT_ECC})
    ) as w:
        assert w.unwatched == [inventory.gpus[1].uuid]


def watch_state(watch: NvmlEventWatch) -> tuple[list[str], dict[str, set[str]]]:
    return watch.unwatched, {u: {str(k) for k in ks} for u, ks in watch.unsupported.items()}


async def test_cancelling_a_waiting_consumer_ends_the_watch() -> None:
    sim = SimulatedNvml.from_preset("workstation")
    inventory = discover(sim)
    watching = asyncio.Event()

    async def consume() -> None:  # as the health monitor's task holds the watch
        async with NvmlEventWatch(sim, inventory, wait_ms=50) as watch:
            watching.set()
            async for _ in watch:
                pass

    task = asyncio.create_task(consume())
    await watching.wait()  # the consumer now waits for its next event
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(wait_until_shut_down, sim, 2.0)


async def test_closing_the_watch_does_not_wait_out_the_nvml_wait() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    loop = asyncio.get_running_loop()
    async with NvmlEventWatch(sim, inventory, wait_ms=5000) as watch:
        inject_xid(sim, 1, 48)
        assert await asyncio.wait_for(anext(watch), 1.0) == NvmlEvent(inventory.gpus[1].uuid, 48)
        # The thread is back in nvmlEventSetWait for up to 5 s now.
        closing = loop.time()
    assert loop.time() - closing < 1.0
    assert not watch.released.is_set()  # it still waits, holding its event set and session
    # An event ends that wait: the thread delivers nothing more, frees its event set and ends
    # its NVML session, long before the 5 s are up.
    inject_xid(sim, 2, 48)
    assert await asyncio.to_thread(watch.released.wait, 2.0)
    assert wait_until_shut_down(sim, 0)


async def test_a_restarted_watch_gets_events_while_the_closed_one_still_waits() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    async with NvmlEventWatch(sim, inventory, wait_ms=5000) as first:
        pass
    async with NvmlEventWatch(sim, inventory, wait_ms=5000) as second:
        inject_xid(sim, 3, 48)
        assert await asyncio.wait_for(anext(second), 1.0) == NvmlEvent(inventory.gpus[3].uuid, 48)
    assert await asyncio.to_thread(first.released.wait, 2.0)  # the same Xid ended its wait
    inject_xid(sim, 0, 48)
    assert await asyncio.to_thread(second.released.wait, 2.0)
    assert wait_until_shut_down(sim, 0)


async def test_a_gpu_lost_before_the_watch_starts_is_listed_as_unwatched() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    set_lost(sim, 1)
    async with NvmlEventWatch(sim, inventory, wait_ms=50) as watch:
        assert watch.unwatched == [inventory.gpus[1].uuid]


async def test_an_nvml_that_cannot_start_fails_the_watch() -> None:
    class NoDriver(SimulatedNvml):
        def nvmlInit(self) -> None:
            import pynvml

            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    sim = NoDriver.from_preset("workstation")
    with pytest.raises(NvmlError, match="NVML_ERROR_DRIVER_NOT_LOADED"):
        async with NvmlEventWatch(sim, discover(SimulatedNvml.from_preset("workstation"))):
            pass
