"""The simulated NVML's GPU-instance creation rules, checked against a table of layouts per family.

Each layout is created step by step, in order, each ``"3g.20gb@4"`` through the adapter with
its explicit placement, as the plugin creates every GPU instance. A layout either fits
completely or fails at a given step with the NVML error the hardware returns.
"""

from __future__ import annotations

import pytest

from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.catalog import model_for
from sharing_plugin.nvml.mig_ops import create_gpu_instance
from sharing_plugin.sim.nvml.node import GpuGroup, LoadedNode, MigDescription, NodeDescription
from sharing_plugin.sim.nvml.simulated import SimulatedNvml

NO_ROOM = "NVML_ERROR_INSUFFICIENT_RESOURCES"
BAD_PLACEMENT = "NVML_ERROR_INVALID_ARGUMENT"
Case = tuple[list[str], tuple[int, str] | None]  # steps, (failing step, error) or None: fits


def ga100_cases(p1: str, me: str, wide: str, p2: str, p3: str, p4: str, p7: str) -> list[Case]:
    """Layouts for the 7-compute / 8-memory-slice families, by profile role."""
    return [
        ([f"{p7}@0"], None),
        ([f"{p4}@0", f"{p3}@4"], None),  # 4g + 3g fits
        ([f"{p3}@0", f"{p3}@4"], None),
        ([f"{p2}@0", f"{p2}@2", f"{p2}@4", f"{p1}@6"], None),
        ([f"{p1}@{s}" for s in range(7)], None),
        ([f"{p4}@0", f"{p2}@4", f"{p1}@6"], None),
        ([f"{me}@0"] + [f"{p1}@{s}" for s in range(1, 7)], None),
        ([f"{wide}@0", f"{wide}@2", f"{wide}@4", f"{wide}@6"], None),
        ([f"{p3}@4", f"{p2}@0", f"{p1}@2", f"{p1}@3"], None),
        ([f"{p4}@0", f"{p1}@4"], None),  # the big one first leaves room
        ([f"{p1}@6", f"{p3}@0"], None),
        ([f"{p4}@0", f"{p2}@4", f"{p2}@2"], (2, NO_ROOM)),  # 4g + 2 x 2g does not fit
        ([f"{p4}@0", f"{p2}@4", f"{p2}@6"], (2, BAD_PLACEMENT)),  # 2g never starts at 6
        ([f"{me}@0", f"{me}@1"], (1, NO_ROOM)),  # one +me at most
        ([f"{p7}@0", f"{p1}@0"], (1, NO_ROOM)),  # overlap
        ([f"{p1}@7"], (0, BAD_PLACEMENT)),  # slice 7 has no compute slice of its own
        ([f"{p3}@2"], (0, BAD_PLACEMENT)),
        ([f"{p1}@0", f"{p4}@0"], (1, NO_ROOM)),  # 4g only starts at slice 0
        ([f"{p2}@0", f"{p2}@2", f"{p2}@4", f"{p2}@4"], (3, NO_ROOM)),
        ([f"{wide}@{s}" for s in (0, 2, 4, 6, 0)], (4, NO_ROOM)),
        ([f"{p3}@0", f"{p3}@4", f"{p1}@6"], (2, NO_ROOM)),
        ([*(f"{p1}@{s}" for s in range(7)), f"{p1}@3"], (7, NO_ROOM)),
    ]


def a30_cases() -> list[Case]:
    p1, me1, p2, me2, p4 = "1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"
    return [
        ([f"{p4}@0"], None),
        ([f"{p2}@0", f"{p2}@2"], None),
        ([f"{p1}@{s}" for s in range(4)], None),
        ([f"{p2}@0", f"{p1}@2", f"{p1}@3"], None),
        ([f"{me2}@0", f"{p2}@2"], None),
        ([f"{me1}@0", f"{p1}@1", f"{p1}@2", f"{p1}@3"], None),
        ([f"{p1}@0", f"{p2}@2"], None),
        ([f"{p2}@2", f"{p1}@0", f"{p1}@1"], None),
        ([f"{p1}@0", f"{p4}@0"], (1, NO_ROOM)),  # 4g only starts at slice 0
        ([f"{p2}@1"], (0, BAD_PLACEMENT)),
        ([f"{p1}@4"], (0, BAD_PLACEMENT)),
        ([f"{p4}@0", f"{p1}@3"], (1, NO_ROOM)),
        ([f"{p2}@0", f"{p2}@2", f"{p2}@0"], (2, NO_ROOM)),
        ([*(f"{p1}@{s}" for s in range(4)), f"{p1}@2"], (4, NO_ROOM)),
        ([f"{me2}@0", f"{me1}@2"], (1, NO_ROOM)),  # one media-extension set per GPU
        ([f"{me2}@0", f"{me2}@2"], (1, NO_ROOM)),
        ([f"{p1}@0", f"{p1}@1", f"{p2}@2", f"{p2}@0"], (3, NO_ROOM)),
    ]


FAMILIES: dict[str, list[Case]] = {
    "NVIDIA A100-SXM4-40GB": ga100_cases(
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"
    ),
    "NVIDIA A100-SXM4-80GB": ga100_cases(
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
    ),
    "NVIDIA H100 80GB HBM3": ga100_cases(
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
    ),
    "NVIDIA H200": ga100_cases(
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"
    ),
    "NVIDIA A30": a30_cases(),
}
CASES = [
    pytest.param(product, steps, outcome, id=f"{product.split()[-1]}:{'+'.join(steps)}")
    for product, cases in FAMILIES.items()
    for steps, outcome in cases
]


def empty_mig_gpu(product: str) -> SimulatedNvml:
    group = GpuGroup(product=product, mig=MigDescription(enabled=True))
    return SimulatedNvml(LoadedNode(NodeDescription(gpus=(group,)), identity="rules", path=None))


def run_steps(product: str, steps: list[str]) -> tuple[int, str] | None:
    sim = empty_mig_gpu(product)
    model = model_for(product)
    assert model is not None and model.mig is not None
    uuid = sim.gpus[0].uuid
    for step, text in enumerate(steps):
        name, _, start = text.partition("@")
        spec = model.mig.profile(name)
        assert spec is not None, f"{name} is not a {product} profile"
        try:
            create_gpu_instance(sim, uuid, profile_index=spec.gi_profile_id, start=int(start))
        except NvmlError as exc:
            return step, str(exc.name)
    return None


def test_every_family_has_at_least_15_layouts() -> None:
    assert all(len(cases) >= 15 for cases in FAMILIES.values())


@pytest.mark.parametrize(("product", "steps", "outcome"), CASES)
def test_layout(product: str, steps: list[str], outcome: tuple[int, str] | None) -> None:
    assert run_steps(product, steps) == outcome
