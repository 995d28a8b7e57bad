"""What the API server keeps of a ResourceSlice: asked once, at start, with a dry run.

A kube-apiserver drops the fields of a disabled feature when an object is written, silently
(device taints are beta, on by default, from Kubernetes 1.36; alpha and off in 1.33-1.35). A pool
that relied on taints there would publish an Unhealthy GPU as an ordinary device. So before the
first publish a slice with a tainted device is created with `dryRun=All` (validated, defaulted
and stripped as a real write would be, never stored) and the answer says whether its taint is
still there. The probe device is in a pool of its own and has no attributes (no class selects
it); a server that ignored the dry run (its answer has a resourceVersion: it was stored) has it
deleted right after. Only resource.k8s.io/v1 is
asked: the servers spoken to in v1beta1 (Kubernetes 1.32-1.33) have no taints on by default, and
there an Unhealthy device leaves the pool.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sharing_plugin.dra.resources import api_error, generic, resource_class, status_of
from sharing_plugin.views.dra_api import V1, dns_label

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

_PROBE_DEVICE = "taint-probe"


def _probe_slice(*, driver: str, node_name: str) -> dict[str, Any]:
    taint = {"key": f"{driver}/{_PROBE_DEVICE}", "value": "probe", "effect": "NoSchedule"}
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": dns_label(f"{node_name}-{driver}-{_PROBE_DEVICE}")},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {
                "name": f"{node_name}-{_PROBE_DEVICE}",
                "generation": 0,
                "resourceSliceCount": 1,
            },
            "devices": [{"name": _PROBE_DEVICE, "taints": [taint]}],
        },
    }


async def keeps_device_taints(client: AsyncClient, *, driver: str, node_name: str) -> bool:
    """Whether the server keeps device taints on resource.k8s.io/v1 ResourceSlices.

    Raises KubeApiError when the server refuses the dry run for another reason than the field
    (a 403 names the permission: the same `create` the pool needs)."""
    document = _probe_slice(driver=driver, node_name=node_name)
    name = document["metadata"]["name"]
    try:
        answer = await client.create(generic(V1, document), dry_run=True)
    except Exception as exc:
        status = await status_of(exc)
        if status is not None and status[0] in (400, 422):
            # A server that does not know the field at all refuses it in strict decoding.
            log.info("the API server refuses device taints (%s): %s", status[0], status[1])
            return False
        raise await api_error(
            exc, "probing ResourceSlice fields", "create", "resourceslices"
        ) from exc
    stored = answer.to_dict()
    if (stored.get("metadata") or {}).get("resourceVersion"):
        await _delete_probe(client, name)
    devices = (stored.get("spec") or {}).get("devices") or [{}]
    return bool(devices[0].get("taints"))


async def _delete_probe(client: AsyncClient, name: str) -> None:
    try:
        await client.delete(resource_class(V1, "ResourceSlice"), name)
    except Exception as exc:
        log.warning("removing the taint probe ResourceSlice %s: %s", name, exc)
