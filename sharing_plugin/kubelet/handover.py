"""Leaving a resource to another instance of ours that registered it after us (a rolling update).

Kubelet (1.32 devicemanager/plugin/v1beta1/handler.go) keeps one client per resource name, the
latest registration's; when any stream of the resource ends (`runClient`), it disconnects the
client it then holds: the newer instance's, whose devices count Unhealthy until it registers
again. But a registration whose connect fails (`connectClient`: kubelet dials back and our
GetDevicePluginOptions is refused) removes the resource's client from that record and leaves
the serving one's endpoint and stream as they are. So the instance leaving registers once more,
refusing kubelet's dial-back, and only then ends its stream: kubelet finds no client to
disconnect, and the newer instance serves on with no gap.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sharing_plugin.errors import KubeletError
from sharing_plugin.kubelet import registration
from sharing_plugin.kubelet.servicer import OPTIONS, DevicePluginServicer

log = logging.getLogger(__name__)

# Within the 2 s from SIGTERM to exit: kubelet dials back and is refused within milliseconds.
STEP_ASIDE_TIMEOUT_S = 0.5


def superseded(others: list[Path], registered_at_ns: int) -> bool:
    """Whether another instance registered the resource after our registration at
    `registered_at_ns` (wall clock): one of its sockets `others` was created (it listens before
    it registers) after it. File times come from a clock coarser than ours, so an instance that
    started within a few milliseconds of our registration counts as older: then kubelet drops
    its registration when we leave and it registers again (a gap, never a wrong state)."""
    for path in others:
        try:
            if path.stat().st_ctime_ns > registered_at_ns:
                return True
        except OSError:
            continue
    return False


async def step_aside(
    kubelet_dir: Path, servicer: DevicePluginServicer, endpoint: str, resource_name: str
) -> None:
    """Make kubelet forget that `endpoint` (served by `servicer`) holds `resource_name`, so
    that its stream ending leaves the newer registration alone; the servicer refuses
    GetDevicePluginOptions from now on."""
    servicer.refuse_options = True
    try:
        await registration.register(
            kubelet_dir,
            endpoint=endpoint,
            resource_name=resource_name,
            options=OPTIONS,
            timeout=STEP_ASIDE_TIMEOUT_S,
        )
    except KubeletError as exc:
        log.debug("stepping aside for %s: kubelet answered %s", resource_name, exc)
    else:
        log.warning("stepping aside for %s: kubelet accepted a refused connect", resource_name)
