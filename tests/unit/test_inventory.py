from sharing_plugin.gpus.inventory import (
    Gpu,
    GpuLink,
    GpuUuid,
    Inventory,
    MigPlacement,
    Topology,
)


def _gpu(index: int) -> Gpu:
    return Gpu(
        index=index,
        uuid=GpuUuid(f"GPU-{index:08d}"),
        product="Tesla T4",
        memory_mib=15360,
        minor=index,
        pci_bus_id=f"00000000:{index:02x}:00.0",
        numa_node=0,
        compute_capability=(7, 5),
    )


def test_link_lookup_is_symmetric() -> None:
    inv = Inventory(gpus=(_gpu(0), _gpu(1)), links=(GpuLink(0, 1, 2, Topology.SINGLE),))
    assert inv.link(1, 0) == inv.link(0, 1)
    assert inv.link(0, 1) is not None and inv.link(0, 1).nvlinks == 2  # type: ignore[union-attr]
    assert inv.link(0, 0) is None
    assert inv.gpu("GPU-00000001") == _gpu(1)


def test_placements_overlap_only_when_they_share_a_slice() -> None:
    assert MigPlacement(0, 4).overlaps(MigPlacement(2, 2))
    assert not MigPlacement(0, 4).overlaps(MigPlacement(4, 4))
