"""The compute processes a simulated node runs: the `processes` list of its description.

Each entry is one process with a CUDA context on one GPU or MIG device, as NVML's process
queries list it: its pid, the GPU memory it uses and, optionally, the SM utilization NVML
sampled for it. Like `faults`, the list may be edited while a process uses the simulator: it is
read again whenever the file changed, so a test starts a "process" by appending an entry and
ends it by removing the entry. A file caught half-written keeps the previous list.

`driverLacks` names process-utilization calls the simulated driver does not have, as a
libnvidia-ml.so older than the call (R550 added nvmlDeviceGetProcessesUtilizationInfo) lacks
the symbol: pynvml then raises NVML_ERROR_FUNCTION_NOT_FOUND.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from sharing_plugin.config.quantity import quantity_bytes

Entry = TypeVar("Entry", bound=BaseModel)

# Linux's largest pid_max (PID_MAX_LIMIT on 64-bit kernels).
PID_MAX = 1 << 22

UtilizationCall = Literal[
    "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"
]


def parse_bytes(value: Any) -> int:
    """A size in bytes: a whole number, or a Kubernetes quantity such as ``1Gi`` or ``512M``."""
    if isinstance(value, bool):
        raise ValueError(f"memory must be bytes or a quantity such as 1Gi (got {value!r})")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory must not be negative (got {value})")
        return value
    found = quantity_bytes(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"memory must be bytes or a quantity such as 1Gi (got {value!r})")
    return found


Bytes = Annotated[int, BeforeValidator(parse_bytes)]


class Process(BaseModel):
    """One compute process.

    `gpu` is a GPU index, a GPU UUID or a MIG UUID; `mig` (``"1g.10gb@6"``: profile and start,
    the start optional when the GPU has one instance of that profile) picks the MIG device on
    that GPU instead of a UUID. A process whose device does not exist now (an instance since
    destroyed, a GPU whose MIG mode does not match) is not listed, as a process cannot run
    there. `mps: true` lists it as an MPS client (nvmlDeviceGetMPSComputeRunningProcesses)
    rather than a plain compute process.
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    gpu: int | str
    mig: str | None = Field(default=None, pattern=r"^[^@\s]+(@[0-9]+)?$")
    pid: int = Field(ge=1, lt=PID_MAX)
    memory: Bytes = 0
    sm: int | None = Field(default=None, ge=0, le=100)
    mps: bool = False


def read_entries(path: Path, key: str, model: type[Entry]) -> tuple[Entry, ...] | None:
    """The current `key` list of a node file (`faults`, `processes`), each entry a `model`, or
    None when it cannot be read or parsed now.

    Called while the file is being edited, so a half-written file is not an error: the caller
    keeps what it had and looks again at the next change.
    """
    data = read_node_file(path)
    if data is None:
        return None
    try:
        return tuple(model.model_validate(e) for e in (data.get(key) or ()))
    except ValidationError:
        return None


def read_node_file(path: Path) -> dict[str, Any] | None:
    """A node file's top-level mapping now; None when it cannot be read or parsed (an edit
    caught half-way)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, ValueError, OverflowError):
        return None
    return data if isinstance(data, dict) else None


def read_processes(path: Path) -> tuple[Process, ...] | None:
    """The current `processes` list of a node file (see `read_entries`)."""
    return read_entries(path, "processes", Process)


def file_stamp(path: Path | None) -> tuple[int, int] | None:
    """A node file's (mtime, size), to see that it changed; None when there is none to read."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)
