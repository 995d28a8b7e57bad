"""The catalogued GPU models: NVIDIA's MIG profile tables and the non-MIG models we preset.

Sources, per fact:
- Profile names, max instance counts, which profiles carry media extensions: NVIDIA MIG user
  guide, "Supported MIG Profiles" (A30, A100, H100, H200 tables).
- Placement starts and sizes: ``nvidia-smi mig -lgipp`` as published for A100 and A30
  (1g ``{0..6}:1``, 1g.10gb ``{0,2,4,6}:2``, 2g ``{0,2,4}:2``, 3g ``{0,4}:4``, 4g ``{0}:4``,
  7g ``{0}:8``; A30 1g ``{0..3}:1``, 2g ``{0,2}:2``, 4g ``{0}:4``); Hopper shares the GA100
  geometry (7 compute slices over 8 memory slices).
- Profile ids (``nvidia-smi mig -lgip`` ID column), per-profile memory and SM counts: published
  ``nvidia-smi mig -lgip`` output of each model, GiB converted to MiB. H200 per-profile memory is
  an estimate scaled from the H100 table (no published lgip output of a real H200 was found);
  the H200 SM counts follow the H100 SXM ones (both GH100 with 132 SMs).
- GPU memory totals: what NVML's memory info reports (``nvidia-smi`` "MiB" column).

Why profile index and profile id differ: NVML numbers profile *kinds* (``NVML_GPU_INSTANCE_
PROFILE_1_SLICE`` = 0 ... ``_1_SLICE_REV2`` = 9) while each GPU gives each of its profiles a
separate *id* (19 for 1g.5gb on an A100); creation and placement calls take the id.
"""

from __future__ import annotations

from sharing_plugin.gpus.catalog.types import GpuModel, MigModel, MigProfileSpec

# NVML_GPU_INSTANCE_PROFILE_* (nvml.h), written out: the pure core may not import pynvml.
GI_1_SLICE = 0
GI_2_SLICE = 1
GI_3_SLICE = 2
GI_4_SLICE = 3
GI_7_SLICE = 4
GI_1_SLICE_REV1 = 7  # "+me": one slice with the media extensions
GI_2_SLICE_REV1 = 8  # "+me" on two slices (A30)
GI_1_SLICE_REV2 = 9  # one compute slice over two memory slices (e.g. 1g.10gb on A100-40GB)

# NVML_COMPUTE_INSTANCE_PROFILE_*: the compute instance that spans the whole GPU instance.
CI_1_SLICE = 0
CI_2_SLICE = 1
CI_3_SLICE = 2
CI_4_SLICE = 3
CI_7_SLICE = 4

_ALL_1G = (0, 1, 2, 3, 4, 5, 6)  # a 1-slice instance may not start at memory slice 7


def _ga100_family(
    *,
    names: tuple[str, str, str, str, str, str, str],
    memory_mib: tuple[int, int, int, int, int],
    sm: tuple[int, int, int, int, int, int],
) -> MigModel:
    """The 7-compute / 8-memory-slice geometry of GA100 and GH100 (A100, H100, H200).

    `names`: 1g, 1g+me, 1g-on-two-memory-slices, 2g, 3g, 4g, 7g.
    `memory_mib`: 1-slice, 2-slice, 4-slice, 8-slice profile memory (1g/1g+me share the first;
    1g-wide and 2g the second; 3g and 4g the third), plus 1g+me if it differs (else same as 1g).
    `sm`: 1g, 1g-wide, 2g, 3g, 4g, 7g.
    """
    one, two, four, eight, one_me = memory_mib
    p1, p1wide, p2, p3, p4, p7 = names[0], names[2], names[3], names[4], names[5], names[6]
    return MigModel(
        memory_slices=8,
        compute_slices=7,
        profiles=(
            MigProfileSpec(p1, GI_1_SLICE, CI_1_SLICE, 1, 1, 7, _ALL_1G, one, sm[0], 19),
            MigProfileSpec(
                names[1], GI_1_SLICE_REV1, CI_1_SLICE, 1, 1, 1, _ALL_1G, one_me, sm[0], 20, True
            ),
            MigProfileSpec(
                p1wide, GI_1_SLICE_REV2, CI_1_SLICE, 1, 2, 4, (0, 2, 4, 6), two, sm[1], 15
            ),
            MigProfileSpec(p2, GI_2_SLICE, CI_2_SLICE, 2, 2, 3, (0, 2, 4), two, sm[2], 14),
            MigProfileSpec(p3, GI_3_SLICE, CI_3_SLICE, 3, 4, 2, (0, 4), four, sm[3], 9),
            MigProfileSpec(p4, GI_4_SLICE, CI_4_SLICE, 4, 4, 1, (0,), four, sm[4], 5),
            MigProfileSpec(p7, GI_7_SLICE, CI_7_SLICE, 7, 8, 1, (0,), eight, sm[5], 0),
        ),
    )


A100_40GB = GpuModel(
    name="A100-40GB",
    products=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
    memory_mib=40960,
    compute_capability=(8, 0),
    sm_count=108,
    mig=_ga100_family(
        names=("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        # lgip: 4.75, 9.62, 19.50, 39.25 GiB
        memory_mib=(4864, 9856, 19968, 40192, 4864),
        sm=(14, 14, 28, 42, 56, 98),
    ),
)

A100_80GB = GpuModel(
    name="A100-80GB",
    products=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"),
    memory_mib=81920,
    compute_capability=(8, 0),
    sm_count=108,
    mig=_ga100_family(
        names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        # lgip: 9.50, 19.50, 39.25, 79.00 GiB
        memory_mib=(9728, 19968, 40192, 80896, 9728),
        sm=(14, 14, 28, 42, 56, 98),
    ),
)

H100_80GB_SXM = GpuModel(
    name="H100-80GB-HBM3",
    products=("NVIDIA H100 80GB HBM3",),
    memory_mib=81559,
    compute_capability=(9, 0),
    sm_count=132,
    mig=_ga100_family(
        names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        # lgip: 9.75, 19.62, 39.50, 79.25 GiB
        memory_mib=(9984, 20096, 40448, 81152, 9984),
        sm=(16, 26, 32, 60, 64, 132),
    ),
)

H100_80GB_PCIE = GpuModel(
    name="H100-PCIe",
    products=("NVIDIA H100 PCIe",),
    memory_mib=81559,
    compute_capability=(9, 0),
    sm_count=114,
    mig=_ga100_family(
        names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        memory_mib=(9984, 20096, 40448, 81152, 9984),
        sm=(14, 14, 30, 46, 62, 114),
    ),
)

H200 = GpuModel(
    name="H200",
    products=("NVIDIA H200", "NVIDIA H200 NVL"),
    memory_mib=143771,
    compute_capability=(9, 0),
    sm_count=132,
    mig=_ga100_family(
        names=("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        # estimated (see module docstring): 17.25, 34.50, 69.50, 140.00 GiB
        memory_mib=(17664, 35328, 71168, 143360, 17664),
        sm=(16, 26, 32, 60, 64, 132),
    ),
)

A30 = GpuModel(
    name="A30",
    products=("NVIDIA A30",),
    memory_mib=24576,
    compute_capability=(8, 0),
    sm_count=56,
    mig=MigModel(
        memory_slices=4,
        compute_slices=4,
        max_instances=4,
        profiles=(
            # lgip: 1g.6gb 5.81 GiB (ID 14), 1g.6gb+me (ID 21), 2g.12gb 11.69 GiB (ID 5),
            # 2g.12gb+me (ID 6, R525+), 4g.24gb 23.50 GiB (ID 0); lgipp {0,1,2,3}:1 {0,2}:2 {0}:4
            MigProfileSpec("1g.6gb", GI_1_SLICE, CI_1_SLICE, 1, 1, 4, (0, 1, 2, 3), 5952, 14, 14),
            MigProfileSpec(
                "1g.6gb+me", GI_1_SLICE_REV1, CI_1_SLICE, 1, 1, 1, (0, 1, 2, 3), 5952, 14, 21, True
            ),
            MigProfileSpec("2g.12gb", GI_2_SLICE, CI_2_SLICE, 2, 2, 2, (0, 2), 11968, 28, 5),
            MigProfileSpec(
                "2g.12gb+me", GI_2_SLICE_REV1, CI_2_SLICE, 2, 2, 1, (0, 2), 11968, 28, 6, True
            ),
            MigProfileSpec("4g.24gb", GI_4_SLICE, CI_4_SLICE, 4, 4, 1, (0,), 24064, 56, 0),
        ),
    ),
)

# Models without MIG: what the simulator needs to impersonate them, and the MPS client limit.
TESLA_T4 = GpuModel(
    name="T4", products=("Tesla T4",), memory_mib=15360, compute_capability=(7, 5), sm_count=40
)
L4 = GpuModel(
    name="L4", products=("NVIDIA L4",), memory_mib=23034, compute_capability=(8, 9), sm_count=58
)
V100_16GB = GpuModel(
    name="V100-SXM2-16GB",
    products=("Tesla V100-SXM2-16GB",),
    memory_mib=16384,
    compute_capability=(7, 0),
    sm_count=80,
)
V100_32GB = GpuModel(
    name="V100-SXM2-32GB",
    products=("Tesla V100-SXM2-32GB",),
    memory_mib=32768,
    compute_capability=(7, 0),
    sm_count=80,
)
A10 = GpuModel(
    name="A10", products=("NVIDIA A10",), memory_mib=23028, compute_capability=(8, 6), sm_count=72
)
L40S = GpuModel(
    name="L40S",
    products=("NVIDIA L40S",),
    memory_mib=46068,
    compute_capability=(8, 9),
    sm_count=142,
)

MODELS: tuple[GpuModel, ...] = (
    A100_40GB,
    A100_80GB,
    A30,
    H100_80GB_SXM,
    H100_80GB_PCIE,
    H200,
    TESLA_T4,
    L4,
    V100_16GB,
    V100_32GB,
    A10,
    L40S,
)
