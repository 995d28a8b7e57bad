"""Per-cgroup GPU memory limits through the NVML adapter, over the simulated pynvml: what an
R615 driver keeps, and NVML's errors where it cannot (older driver, MIG, cgroup v1, bad input)."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from sharing_plugin.errors import NvmlError
from sharing_plugin.nvml.calls import nvml_session
from sharing_plugin.nvml.memory_limits import bindings_problem, read_limit, set_limit
from sharing_plugin.sim.nvml.simulated import SimulatedNvml

POD = "/kubepods.slice/kubepods-pod0a1b.slice/cri-containerd-abc.scope"


def node(tmp_path: Path, body: str) -> SimulatedNvml:
    path = tmp_path / "node.yaml"
    path.write_text(body)
    return SimulatedNvml.from_file(path)


R615 = "gpus:\n  - product: NVIDIA A100-SXM4-80GB\n    count: 2\ndriverVersion: '615.25.01'\n"


def test_a_limit_set_reads_back_and_others_stay_unlimited(tmp_path: Path) -> None:
    nvml = node(tmp_path, R615)
    assert bindings_problem(nvml) is None
    with nvml_session(nvml):
        gpu0, gpu1 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        assert read_limit(nvml, gpu0, POD).hard_mib is None
        set_limit(nvml, gpu0, POD, 20_480)
        assert read_limit(nvml, gpu0, POD).hard_mib == 20_480
        assert read_limit(nvml, gpu1, POD).hard_mib is None  # per GPU
        assert read_limit(nvml, gpu0, POD + "x").hard_mib is None  # per cgroup


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("gpus:\n  - product: NVIDIA A100-SXM4-80GB\n", "NVML_ERROR_FUNCTION_NOT_FOUND"),
        (R615 + "cgroupVersion: 1\n", "NVML_ERROR_NOT_SUPPORTED"),
    ],
)
def test_a_node_that_cannot_keep_limits_answers_nvml_errors(
    tmp_path: Path, body: str, code: str
) -> None:
    nvml = node(tmp_path, body)
    with nvml_session(nvml), pytest.raises(NvmlError) as raised:
        set_limit(nvml, nvml.nvmlDeviceGetHandleByIndex(0), POD, 1024)
    assert raised.value.name == code


def test_mig_devices_and_bad_namespaces_are_refused(tmp_path: Path) -> None:
    nvml = node(
        tmp_path,
        "gpus:\n  - product: NVIDIA A100-SXM4-80GB\n    mig: {enabled: true, instances: "
        "['3g.40gb']}\ndriverVersion: '615.25.01'\n",
    )
    with nvml_session(nvml):
        gpu = nvml.nvmlDeviceGetHandleByIndex(0)
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        with pytest.raises(NvmlError) as on_mig:
            set_limit(nvml, mig, POD, 1024)
        assert on_mig.value.name == "NVML_ERROR_NOT_SUPPORTED"
        with pytest.raises(NvmlError) as relative:
            set_limit(nvml, gpu, "kubepods/x", 1024)
        assert relative.value.name == "NVML_ERROR_INVALID_ARGUMENT"
        limits = nvml.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace, limits.softLimit, limits.hardLimit = POD.encode(), 2, 1
        with pytest.raises(pynvml.NVMLError) as soft_above_hard:
            nvml.nvmlDeviceSetMemoryLimits_v1(gpu, limits)
        assert soft_above_hard.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_old_bindings_are_named() -> None:
    class OldBindings:
        pass

    assert "nvidia-ml-py 13.615" in (bindings_problem(OldBindings()) or "")  # type: ignore[arg-type]
