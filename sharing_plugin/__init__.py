"""gpu-sharing-plugin: a Kubernetes device plugin for NVIDIA GPUs driven by a validated config."""

from __future__ import annotations

from functools import cache

__all__ = ["__version__"]

DISTRIBUTION = "gpu-sharing-plugin"
UNKNOWN_VERSION = "0+unknown"
"""The version of a source tree that was never installed: PEP 440, and sorts before releases."""


@cache
def installed_version(distribution: str = DISTRIBUTION) -> str:
    """The version the package metadata records, or `UNKNOWN_VERSION` when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return UNKNOWN_VERSION


def __getattr__(name: str) -> str:
    # Read on first use: importing the package (every module does) costs no metadata lookup.
    if name == "__version__":
        return installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
