"""The typed NVML boundary: the real pynvml has every member the `NvmlApi` Protocol lists.

mypy sees pynvml as untyped, so this is where a name the adapters call but pynvml lacks (a typo,
or a function of a newer release than the one pinned) is caught; the simulator's members are
checked by mypy itself.
"""

from __future__ import annotations

import ctypes
import inspect
import re
from pathlib import Path

import pynvml

import sharing_plugin
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.sim.nvml.simulated import SimulatedNvml


def members() -> set[str]:
    functions = {n for n, v in vars(NvmlApi).items() if inspect.isfunction(v)}
    return {n for n in NvmlApi.__annotations__} | {n for n in functions if not n.startswith("_")}


def test_the_protocol_lists_exactly_what_the_adapters_call() -> None:
    package = Path(sharing_plugin.__file__).parent
    sources = [*package.glob("nvml/*.py"), *package.glob("daemon/*.py")]
    used = {m for p in sources for m in re.findall(r"(?<![\w.])nvml\.(\w+)", p.read_text())}
    assert members() == used


def test_pynvml_has_every_member() -> None:
    assert sorted(n for n in members() if not hasattr(pynvml, n)) == []


def test_pynvml_members_are_of_the_declared_kinds() -> None:
    assert issubclass(pynvml.NVMLError, Exception)
    assert issubclass(pynvml.c_nvmlGpuInstancePlacement_t, ctypes.Structure)
    constants = [n for n in NvmlApi.__annotations__ if n not in ("NVMLError",)]
    constants.remove("c_nvmlGpuInstancePlacement_t")
    assert {n: type(getattr(pynvml, n)) for n in constants} == {n: int for n in constants}
    functions = members() - set(NvmlApi.__annotations__)
    assert [n for n in sorted(functions) if not callable(getattr(pynvml, n))] == []


def test_the_simulator_has_the_same_constants_as_pynvml() -> None:
    for name in NvmlApi.__annotations__:
        assert getattr(SimulatedNvml, name) == getattr(pynvml, name), name
