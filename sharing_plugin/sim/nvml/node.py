"""The simulated node description: which GPUs a pretend node has, and the faults injected into it.

A node description is a small YAML file (or one of the built-in presets) that the simulated NVML
impersonates. It is parsed strictly, like the config: unknown keys are errors, so a typo does not
silently produce a different node. The `faults` and `processes` lists and `driverLoaded` are
re-read while a process runs; only those parts may change under a running simulator, which is
why each is also parsed on its own.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from sharing_plugin.errors import ConfigError, Problem
from sharing_plugin.sim.nvml.workload import (
    Process,
    UtilizationCall,
    read_entries,
    read_node_file,
)

PRESET_PACKAGE = "sharing_plugin.sim.nvml.presets"
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4}){1,2}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
DEFAULT_DRIVER_VERSION = "550.54.15"  # an R550 driver: no per-cgroup memory limits


class _Strict(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class MigDescription(_Strict):
    """The MIG state a GPU is already in: mode, and the instances that exist."""

    enabled: bool = True
    instances: tuple[str, ...] = ()  # "3g.40gb" or "1g.10gb@6" (explicit start, memory slices)


class GpuGroup(_Strict):
    """`count` identical GPUs.

    `pciBusIds` (one per GPU, in NVML's `00000000:07:00.0` or the short `0000:07:00.0` form)
    place them on the PCI bus, in increasing order as NVML enumerates them; without them each
    GPU gets a bus of its own. `pcieRoot` names the root complex above them as sysfs does
    (`pci0000:00`); without it the node does not tell (as a container without sysfs).
    """

    product: str = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=64)
    numa_node: int | None = Field(default=None, ge=0)
    mig: MigDescription | None = None
    pci_bus_ids: tuple[str, ...] = ()
    pcie_root: str | None = Field(default=None, pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")

    @model_validator(mode="after")
    def _one_bus_per_gpu(self) -> GpuGroup:
        if self.pci_bus_ids and len(self.pci_bus_ids) != self.count:
            raise ValueError(
                f"'pciBusIds' lists {len(self.pci_bus_ids)} bus IDs for {self.count} GPU(s): "
                "give one per GPU"
            )
        for bus in self.pci_bus_ids:
            if not _BUS_ID.fullmatch(bus):
                raise ValueError(
                    f"'pciBusIds': '{bus}' is not a PCI bus ID (e.g. 00000000:07:00.0)"
                )
        return self


class Fault(_Strict):
    """One injected event: an Xid or ECC error on a GPU (or MIG device), or the GPU falling off
    the bus.

    `gpu` is a GPU index, a GPU UUID, or a MIG UUID (an Xid is then attributed to that MIG
    device's GPU/compute instance, as NVML does; an ECC error names the GPU, since NVML
    attributes only Xids). `ecc: double` delivers one double-bit (uncorrectable) ECC error event,
    `ecc: single` one single-bit (corrected) one. `lost: true` makes every NVML call on the GPU
    fail with NVML_ERROR_GPU_IS_LOST (and delivers Xid 79); `lost: false` brings it back.
    """

    gpu: int | str
    xid: int | None = Field(default=None, ge=0)
    ecc: Literal["double", "single"] | None = None
    lost: bool | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Fault:
        if [self.xid, self.ecc, self.lost].count(None) != 2:
            raise ValueError(
                "a fault needs exactly one of 'xid' (an Xid number), 'ecc' (double or single) "
                "or 'lost'"
            )
        return self


class NodeDescription(_Strict):
    """A whole simulated node."""

    name: str | None = None  # seeds the deterministic UUIDs; defaults to the file or preset name
    gpus: tuple[GpuGroup, ...] = Field(min_length=1)
    nvlink: Literal["all", "none"] = "none"
    faults: tuple[Fault, ...] = ()
    processes: tuple[Process, ...] = ()  # re-read while running, like faults
    driver_lacks: tuple[UtilizationCall, ...] = ()
    # False: the NVIDIA driver is not loaded (yet): nvmlInit fails, as on a node still
    # installing it at boot. Re-read while a process runs, like `faults`.
    driver_loaded: bool = True
    # What nvmlSystemGetDriverVersion returns (R615 and later cap a cgroup's GPU memory).
    driver_version: str = Field(default=DEFAULT_DRIVER_VERSION, pattern=r"^\d+\.\d+(\.\d+)?$")
    cgroup_version: Literal[1, 2] = 2  # the node's cgroup hierarchy


@dataclass(frozen=True, slots=True)
class LoadedNode:
    """A parsed description with where it came from (`path` is None for presets)."""

    description: NodeDescription
    identity: str  # what the UUIDs are derived from
    path: Path | None


def parse_instance(text: str) -> tuple[str, int | None]:
    """Split ``"1g.10gb@6"`` into ``("1g.10gb", 6)``; no ``@`` gives a None start."""
    name, sep, start = text.partition("@")
    if not sep:
        return name.strip(), None
    try:
        return name.strip(), int(start)
    except ValueError:
        raise ValueError(
            f"'{text}': the start after '@' must be a number of memory slices"
        ) from None


def preset_names() -> list[str]:
    """The built-in node presets, sorted."""
    return list(_preset_names())


@functools.cache
def _preset_names() -> tuple[str, ...]:
    root = resources.files(PRESET_PACKAGE)
    return tuple(
        sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))
    )


@functools.cache
def load_preset(name: str) -> LoadedNode:
    """A built-in node; an unknown name is an error that lists the presets. Presets are package
    data and a description is frozen, so each is parsed once per process."""
    if name not in preset_names():
        raise ConfigError(
            [
                Problem(
                    path="",
                    message=(
                        f"unknown simulated node preset '{name}': "
                        f"use one of {', '.join(preset_names())} or a node description file"
                    ),
                )
            ]
        )
    text = resources.files(PRESET_PACKAGE).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    description = _parse(text, source=f"preset {name}")
    return LoadedNode(description=description, identity=description.name or name, path=None)


def load_node_file(path: Path) -> LoadedNode:
    """A node description file; errors name the file and the offending key."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [Problem(path="", message=f"cannot read node description: {exc}", file=str(path))]
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [
                Problem(
                    path="",
                    message=f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset "
                    f"{exc.start}); save the node description as UTF-8",
                    file=str(path),
                )
            ]
        ) from None
    description = _parse(text, source=str(path))
    return LoadedNode(description=description, identity=description.name or path.stem, path=path)


def read_faults(path: Path) -> tuple[Fault, ...] | None:
    """The current `faults` list of a node file (see `read_entries`)."""
    return read_entries(path, "faults", Fault)


def read_driver_loaded(path: Path) -> bool | None:
    """The current `driverLoaded` of a node file, or None when it cannot be read or parsed now
    (half-written: the caller keeps what it had)."""
    data = read_node_file(path)
    if data is None:
        return None
    loaded = data.get("driverLoaded", True)
    return loaded if isinstance(loaded, bool) else None


def _parse(text: str, *, source: str) -> NodeDescription:
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(exc, source)]) from None
    except (ValueError, OverflowError):  # PyYAML's chr() on a "\\U" escape past U+10FFFF
        raise ConfigError(
            [
                Problem(
                    path="",
                    message="invalid YAML: an escape names no Unicode character",
                    file=source,
                )
            ]
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [Problem(path="", message="a node description is a mapping with 'gpus'", file=source)]
        )
    try:
        return NodeDescription.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            [
                Problem(
                    path=_dotted(err["loc"]),
                    message=err["msg"].removeprefix("Value error, "),
                    file=source,
                )
                for err in exc.errors()
            ]
        ) from exc


def _yaml_problem(exc: yaml.YAMLError, source: str) -> Problem:
    """PyYAML's several-line report as one line at its position (1-based, like the config's)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError):
        words = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
    else:
        words = " ".join(str(exc).split())
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
    return Problem(
        path="", message=f"not valid YAML: {words}", file=source, line=line, column=column
    )


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``("gpus", 0, "mig")`` -> ``gpus[0].mig``, the way config paths are written."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
