"""The catalog's facts are self-consistent and match what NVIDIA publishes for each model."""

from __future__ import annotations

import pynvml
import pytest

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog import MODELS, GpuModel, model_for, resolve_profile
from sharing_plugin.gpus.catalog import models as catalog_models

MIG_MODELS = [m for m in MODELS if m.mig is not None]


def _ids(models: list[GpuModel]) -> list[str]:
    return [m.display_name for m in models]


def test_products_are_unique_across_models() -> None:
    products = [p for m in MODELS for p in m.products]
    assert len(products) == len(set(products))


@pytest.mark.parametrize("model", MIG_MODELS, ids=_ids(MIG_MODELS))
def test_profiles_fit_their_gpu(model: GpuModel) -> None:
    assert model.mig is not None
    mig = model.mig
    names = [p.name for p in mig.profiles]
    assert len(names) == len(set(names))
    assert len({p.gi_profile_id for p in mig.profiles}) == len(mig.profiles)
    assert len({p.profile_info_id for p in mig.profiles}) == len(mig.profiles)
    for p in mig.profiles:
        assert p.starts == tuple(sorted(set(p.starts))), p.name
        for start in p.starts:
            assert start >= 0 and start + p.memory_slices <= mig.memory_slices, (p.name, start)
        assert 1 <= p.compute_slices <= mig.compute_slices
        assert 1 <= p.max_count <= len(p.starts)
        assert p.name.startswith(f"{p.compute_slices}g.")
        assert p.media_extensions == p.name.endswith("+me")
        assert 0 < p.memory_mib <= model.memory_mib
        assert 0 < p.sm_count <= model.sm_count


@pytest.mark.parametrize("model", MIG_MODELS, ids=_ids(MIG_MODELS))
def test_max_count_is_what_the_starts_allow_without_overlap(model: GpuModel) -> None:
    # Disjoint placements of one profile: greedy over sorted starts is optimal for intervals.
    assert model.mig is not None
    for p in model.mig.profiles:
        end, fitting = -1, 0
        for start in p.starts:
            if start >= end:
                fitting, end = fitting + 1, start + p.memory_slices
        expected = 1 if p.media_extensions else min(fitting, model.mig.max_instances)
        assert p.max_count == expected, p.name


def test_nvml_profile_indexes_match_pynvml() -> None:
    assert catalog_models.GI_1_SLICE == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    assert catalog_models.GI_2_SLICE == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
    assert catalog_models.GI_3_SLICE == pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    assert catalog_models.GI_4_SLICE == pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
    assert catalog_models.GI_7_SLICE == pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    assert catalog_models.GI_1_SLICE_REV1 == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    assert catalog_models.GI_2_SLICE_REV1 == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
    assert catalog_models.GI_1_SLICE_REV2 == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert catalog_models.CI_1_SLICE == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    assert catalog_models.CI_2_SLICE == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE
    assert catalog_models.CI_3_SLICE == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    assert catalog_models.CI_4_SLICE == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE
    assert catalog_models.CI_7_SLICE == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE


@pytest.mark.parametrize("model", MIG_MODELS, ids=_ids(MIG_MODELS))
def test_full_gi_compute_instance_matches_compute_slices(model: GpuModel) -> None:
    by_slices = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
    assert model.mig is not None
    for p in model.mig.profiles:
        assert p.ci_profile_id == by_slices[p.compute_slices], p.name


def test_a100_40gb_published_table() -> None:
    model = model_for("NVIDIA A100-SXM4-40GB")
    assert model is not None and model.mig is not None
    rows = {
        p.name: (p.profile_info_id, p.memory_slices, p.max_count, p.starts)
        for p in model.mig.profiles
    }
    assert rows == {
        "1g.5gb": (19, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        "1g.5gb+me": (20, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.10gb": (15, 2, 4, (0, 2, 4, 6)),
        "2g.10gb": (14, 2, 3, (0, 2, 4)),
        "3g.20gb": (9, 4, 2, (0, 4)),
        "4g.20gb": (5, 4, 1, (0,)),
        "7g.40gb": (0, 8, 1, (0,)),
    }
    assert model.memory_mib == 40960 and model.compute_capability == (8, 0)


def test_a30_published_table() -> None:
    model = model_for("NVIDIA A30")
    assert model is not None and model.mig is not None
    assert model.mig.memory_slices == 4 and model.mig.compute_slices == 4
    rows = {p.name: (p.profile_info_id, p.max_count, p.starts) for p in model.mig.profiles}
    assert rows == {
        "1g.6gb": (14, 4, (0, 1, 2, 3)),
        "1g.6gb+me": (21, 1, (0, 1, 2, 3)),
        "2g.12gb": (5, 2, (0, 2)),
        "2g.12gb+me": (6, 1, (0, 2)),
        "4g.24gb": (0, 1, (0,)),
    }


@pytest.mark.parametrize(
    ("product", "profiles"),
    [
        ("NVIDIA A100 80GB PCIe", "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
        ("NVIDIA H100 80GB HBM3", "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
        ("NVIDIA H200", "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb"),
    ],
)
def test_profile_names_per_model(product: str, profiles: str) -> None:
    model = model_for(product)
    assert model is not None and model.mig is not None
    assert model.mig.profile_names == tuple(profiles.split())


@pytest.mark.parametrize(
    ("product", "memory_mib", "cc", "mig"),
    [
        ("NVIDIA A100-SXM4-40GB", 40960, (8, 0), True),
        ("NVIDIA A100-PCIE-40GB", 40960, (8, 0), True),
        ("NVIDIA A100-SXM4-80GB", 81920, (8, 0), True),
        ("NVIDIA A30", 24576, (8, 0), True),
        ("NVIDIA H100 80GB HBM3", 81559, (9, 0), True),
        ("NVIDIA H100 PCIe", 81559, (9, 0), True),
        ("NVIDIA H200", 143771, (9, 0), True),
        ("Tesla T4", 15360, (7, 5), False),
        ("NVIDIA L4", 23034, (8, 9), False),
        ("Tesla V100-SXM2-16GB", 16384, (7, 0), False),
    ],
)
def test_model_for_known_products(
    product: str, memory_mib: int, cc: tuple[int, int], mig: bool
) -> None:
    model = model_for(product)
    assert model is not None
    assert (model.memory_mib, model.compute_capability, model.mig is not None) == (
        memory_mib,
        cc,
        mig,
    )


def test_model_for_old_driver_names_and_unknown() -> None:
    assert model_for("A100-SXM4-40GB") is model_for("NVIDIA A100-SXM4-40GB")
    assert model_for("NVIDIA GeForce RTX 4090") is None


def test_profile_lookup_by_nvml_ids() -> None:
    model = model_for("NVIDIA A100-SXM4-80GB")
    assert model is not None and model.mig is not None
    wide = model.mig.profile_by_id(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
    assert wide is not None and wide.name == "1g.20gb"
    by_info = model.mig.profile_by_info_id(9)
    assert by_info is not None and by_info.name == "3g.40gb"


def test_resolve_profile_is_per_model() -> None:
    a40 = model_for("NVIDIA A100-SXM4-40GB")
    a80 = model_for("NVIDIA A100-SXM4-80GB")
    assert a40 is not None and a80 is not None
    assert resolve_profile(a40, "1g.10gb").memory_slices == 2
    assert resolve_profile(a80, "1g.10gb").memory_slices == 1
    with pytest.raises(MigError, match=r"unknown MIG profile '1g.20gb' for A100-40GB: .*1g\.5gb"):
        resolve_profile(a40, "1g.20gb")
    t4 = model_for("Tesla T4")
    assert t4 is not None
    with pytest.raises(MigError, match="T4 does not support MIG"):
        resolve_profile(t4, "1g.5gb")
