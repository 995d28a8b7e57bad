"""The `usage` section: how per-pod GPU usage is judged against the share each pod holds.

Its own module so the section stays one place to read: the rest of the config says what is
advertised; this says when a pod using a shared GPU counts as over its share.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt

from sharing_plugin.config.base import Strict

DEFAULT_OVER_SHARE_SECONDS = 60
MAX_OVER_SHARE_SECONDS = 86_400


class Usage(Strict):
    """Per-pod GPU usage on shared GPUs (time-slicing, MPS)."""

    over_share_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_OVER_SHARE_SECONDS)] = (
        DEFAULT_OVER_SHARE_SECONDS
    )
    """A pod whose processes use more of a shared GPU's memory than its replicas there entitle
    it to (the GPU's memory over its replicas, or the MPS client limit), for this many seconds
    without a break, gets a GpuShareExceeded Warning Event on the pod and on the Node (once,
    until it is back within its share). 0: at the first reading that sees it. Nothing is
    stopped."""
