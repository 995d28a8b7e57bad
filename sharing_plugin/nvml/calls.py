"""Calling NVML: sessions and the translation of pynvml errors into the plugin's own.

Every adapter function receives the pynvml module as a value (the real one or the simulated
stand-in, both an `NvmlApi`) and goes through these helpers, so the NVML error name always
reaches the admin and a lost GPU is always a `GpuLostError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pynvml

from sharing_plugin.errors import GpuLostError, NvmlError
from sharing_plugin.nvml.api import NvmlApi

# What to do about the errors an admin can act on; the rest speak for themselves.
_ADVICE = {
    "NVML_ERROR_GPU_IS_LOST": "the GPU fell off the bus (Xid 79): check dmesg, then reset or "
    "drain the node",
    "NVML_ERROR_NO_PERMISSION": "the plugin needs access to /dev/nvidia* (run it privileged)",
    "NVML_ERROR_DRIVER_NOT_LOADED": "is the NVIDIA driver loaded on this node?",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so is not visible to the plugin: is the "
    "NVIDIA container runtime configured for this pod?",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the NVIDIA kernel module and libnvidia-ml.so "
    "differ: reboot the node after a driver upgrade",
}


def error_name(nvml: NvmlApi, code: int) -> str:
    """``NVML_ERROR_*`` name of an NVML return code.

    Looked up in the module in use, then in pynvml's (a stand-in lists only the codes it reads).
    """
    for module in (nvml, pynvml):
        for name in dir(module):
            if name.startswith("NVML_ERROR_") and getattr(module, name) == code:
                return name
    return f"NVML error {code}"


def to_nvml_error(nvml: NvmlApi, exc: BaseException, what: str) -> NvmlError:
    """Our error for a pynvml exception raised while doing `what`."""
    code = getattr(exc, "value", None)
    name = error_name(nvml, code) if isinstance(code, int) else type(exc).__name__
    advice = _ADVICE.get(name)
    message = f"{what}: {name}" + (f" ({advice})" if advice else "")
    cls = GpuLostError if name == "NVML_ERROR_GPU_IS_LOST" else NvmlError
    return cls(message, code=code if isinstance(code, int) else None, name=name)


def is_code(exc: BaseException, *codes: int) -> bool:
    """Whether a pynvml exception carries one of the ``NVML_ERROR_*`` `codes`."""
    code = getattr(exc, "value", None)
    return isinstance(code, int) and code in codes


@contextmanager
def nvml_errors(nvml: NvmlApi, what: str) -> Iterator[None]:
    """Turn a pynvml error raised inside into an `NvmlError` about `what`."""
    try:
        yield
    except nvml.NVMLError as exc:
        raise to_nvml_error(nvml, exc, what) from exc


@contextmanager
def nvml_session(nvml: NvmlApi) -> Iterator[NvmlApi]:
    """nvmlInit ... nvmlShutdown around a block.

    NVML counts initialisations, so nested sessions (discovery inside a running event watch)
    are safe: the library stays up until the last one ends.
    """
    with nvml_errors(nvml, "initialising NVML"):
        nvml.nvmlInit()
    try:
        yield nvml
    finally:
        with nvml_errors(nvml, "shutting NVML down"):
            nvml.nvmlShutdown()


def text(value: str | bytes) -> str:
    """pynvml returns some strings as bytes (ctypes char arrays); the rest of us want str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value
