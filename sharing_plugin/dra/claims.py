"""ResourceClaims as the plugin reads them: who asked, and which devices the scheduler gave.

The kubelet names a claim by namespace, name and UID only; the plugin reads the claim from the
API and keeps, of its allocation, the results of its own driver. Both API versions carry the
allocation in the same shape (`status.allocation.devices.results[]` with `request`, `driver`,
`pool`, `device`; with consumable capacity, v1 adds `shareID` and `consumedCapacity`), so one
parser serves v1 and v1beta1. What a result's request asked of a device's capacities
(`capacity.requests` of the request, or of its `firstAvailable` subrequest where the result
names `<request>/<subrequest>`) is kept beside what it consumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sharing_plugin.dra.resources import api_error, resource_class

if TYPE_CHECKING:
    from lightkube import AsyncClient


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources/NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One result of a claim's allocation: a device of a driver's pool, for one request.

    `share_id` and `consumed` (capacity name -> quantity) are set for a share of a device
    that allows several allocations (consumable capacity); `asked` is what the request asked
    of the device's capacities (empty: nothing, each capacity's default).
    """

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    consumed: Mapping[str, str] = field(default_factory=dict)
    asked: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim read from the API; `devices` is None while it is not allocated."""

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...] | None


def claim_from_document(document: Mapping[str, Any]) -> Claim:
    """The claim an API object (either version) describes."""
    meta = document.get("metadata") or {}
    ref = ClaimRef(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
    )
    allocation = (document.get("status") or {}).get("allocation")
    if not allocation:
        return Claim(ref, None)
    results = (allocation.get("devices") or {}).get("results") or ()
    asked = _asked(document)
    return Claim(
        ref,
        tuple(
            AllocatedDevice(
                request=str(r.get("request", "")),
                driver=str(r.get("driver", "")),
                pool=str(r.get("pool", "")),
                device=str(r.get("device", "")),
                share_id=str(r["shareID"]) if r.get("shareID") else None,
                consumed={str(k): str(v) for k, v in (r.get("consumedCapacity") or {}).items()},
                asked=asked.get(str(r.get("request", "")), {}),
            )
            for r in results
        ),
    )


def _asked(document: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """What each request (`<request>/<subrequest>` for a subrequest) asks of capacities."""
    found: dict[str, dict[str, str]] = {}

    def capacity(request: Mapping[str, Any]) -> dict[str, str]:
        requests = (request.get("capacity") or {}).get("requests") or {}
        return {str(k): str(v) for k, v in requests.items()}

    for request in ((document.get("spec") or {}).get("devices") or {}).get("requests") or ():
        name = str(request.get("name", ""))
        found[name] = capacity(request.get("exactly") or request)  # v1beta1 does not nest
        for sub in request.get("firstAvailable") or ():
            found[f"{name}/{sub.get('name', '')}"] = capacity(sub)
    return found


class ClaimReader(Protocol):
    """Where prepared claims are looked up (the API; a test may hand in its own)."""

    async def read(self, ref: ClaimRef) -> Claim: ...


class ApiClaimReader:
    """Reads claims through the Kubernetes API in the resource.k8s.io version it was given."""

    def __init__(self, client: AsyncClient, api_version: str) -> None:
        self._client = client
        self._kind = resource_class(api_version, "ResourceClaim")

    async def read(self, ref: ClaimRef) -> Claim:
        """The claim; raises KubeApiError when it cannot be read (404 included)."""
        try:
            obj = await self._client.get(self._kind, ref.name, namespace=ref.namespace)
        except Exception as exc:
            doing = f"reading ResourceClaim {ref}"
            raise await api_error(exc, doing, "get", "resourceclaims") from exc
        return claim_from_document(obj.to_dict())
