"""Benchmark: plan() at 7,168 devices (8 GPUs x 7 MIG x 128 replicas) and allocate() of 8 IDs.

Run from the repository root: `.venv/bin/python bench/bench_plan.py` (add `--quick` for a short
run, `--json PATH` to also write the figures for `make bench`). Prints the median and p99 of
each measurement; goals: plan < 50 ms, allocate < 100 us.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from figures import FigureLog, add_json_option

from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import (
    Gpu,
    GpuLink,
    GpuUuid,
    Inventory,
    MigDevice,
    MigPlacement,
    MigUuid,
    Topology,
)
from sharing_plugin.plan import allocate, plan, preferred


def dgx_1g(gpus: int = 8, migs: int = 7) -> Inventory:
    """A DGX A100 with every GPU split into seven 1g.10gb MIG devices."""
    out = []
    for i in range(gpus):
        uuid = GpuUuid(f"GPU-{i:08x}-0000-4000-8000-000000000000")
        devices = tuple(
            MigDevice(
                uuid=MigUuid(f"MIG-{i:04x}{j:04x}-0000-4000-8000-000000000000"),
                parent_uuid=uuid,
                parent_index=i,
                index=j,
                gi_id=j + 7,
                ci_id=0,
                profile="1g.10gb",
                gi_profile_id=19,
                placement=MigPlacement(j, 1),
                memory_mib=9_856,
            )
            for j in range(migs)
        )
        out.append(
            Gpu(
                index=i,
                uuid=uuid,
                product="NVIDIA A100-SXM4-80GB",
                memory_mib=81_920,
                minor=i,
                pci_bus_id=f"00000000:{i + 7:02x}:00.0",
                numa_node=i // 4,
                compute_capability=(8, 0),
                mig_capable=True,
                mig_enabled=True,
                mig_devices=devices,
            )
        )
    links = tuple(
        GpuLink(a, b, 12, Topology.NODE if a // 4 == b // 4 else Topology.SYSTEM)
        for a in range(gpus)
        for b in range(a + 1, gpus)
    )
    return Inventory(gpus=tuple(out), links=links)


def measure(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    add_json_option(parser)
    args = parser.parse_args()
    quick = args.quick
    log = FigureLog(args.json)
    inventory = dgx_1g()
    config = Config.model_validate(
        {
            "version": "v1",
            "flags": {"migStrategy": "mixed", "plugin": {"passDeviceSpecs": True}},
            "sharing": {"timeSlicing": {"resources": [{"name": "mig-1g.10gb", "replicas": 128}]}},
        }
    )
    result = plan(config, inventory)
    (resource,) = result.resources
    assert len(resource.devices) == 7_168, len(resource.devices)
    request = [d.id for d in resource.devices[:: len(resource.devices) // 8]][:8]

    rows: list[tuple[str, float, float, str, int | None]] = []
    p50, p99 = measure(lambda: plan(config, inventory), 5 if quick else 30)
    rows.append(("plan() 7,168 devices", p50 * 1e3, p99 * 1e3, "ms", 50))
    p50, p99 = measure(lambda: allocate(resource, request, config.flags), 200 if quick else 5000)
    rows.append(("allocate() 8 IDs, device specs", p50 * 1e6, p99 * 1e6, "us", 100))
    available = list(resource.ids)
    p50, p99 = measure(
        lambda: preferred(
            resource, available, [], 8, config.flags.plugin.shared_devices_allocation_policy
        ),
        20 if quick else 200,
    )
    rows.append(("preferred() 8 of 7,168 replicas", p50 * 1e3, p99 * 1e3, "ms", None))

    whole_inventory = Inventory(
        gpus=tuple(
            Gpu(
                index=g.index,
                uuid=g.uuid,
                product=g.product,
                memory_mib=g.memory_mib,
                minor=g.minor,
                pci_bus_id=g.pci_bus_id,
                numa_node=g.numa_node,
                compute_capability=g.compute_capability,
            )
            for g in dgx_1g(gpus=16).gpus
        ),
        links=dgx_1g(gpus=16).links,
    )
    whole = plan(Config.model_validate({"version": "v1"}), whole_inventory).resources[0]
    gpus16 = list(whole.ids)
    policy = config.flags.plugin.shared_devices_allocation_policy
    p50, p99 = measure(
        lambda: preferred(whole, gpus16, [], 8, policy, inventory=whole_inventory),
        20 if quick else 500,
    )
    rows.append(("preferred() 8 of 16 whole GPUs", p50 * 1e6, p99 * 1e6, "us", 1000))

    print(f"{'measurement':34} {'p50':>10} {'p99':>10}  goal")
    for name, a, b, unit, goal in rows:
        goal_text = f"< {goal} {unit}" if goal else "-"
        print(f"{name:34} {a:>7.2f} {unit} {b:>7.2f} {unit}  {goal_text}")
        log.add(
            name,
            f"p50 < {goal} {unit}" if goal else "",
            f"p50 {a:,.2f} {unit}, p99 {b:,.2f} {unit}",
        )


if __name__ == "__main__":
    main()
