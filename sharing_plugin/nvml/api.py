"""The NVML surface the plugin uses, as a type: the real `pynvml` and the simulator both fit it.

For now an alias; the typed `Protocol` listing each call replaces it.
"""

from __future__ import annotations

from typing import Any, TypeAlias

NvmlApi: TypeAlias = Any
