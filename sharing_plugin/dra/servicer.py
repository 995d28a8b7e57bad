"""The DRA gRPC services, v1beta1 (Kubernetes 1.32-1.33) and v1 (1.34+), over one preparer.

Both versions carry the same messages under two protobuf packages; each servicer only
translates between its version's messages and the preparer's values, so the two can never
answer differently; v1 also carries the share ID of a share of a device (consumable capacity),
which v1beta1 has no field for. The kubelet expects an entry for every claim it sent: a claim
that fails has its error in its entry, and the call itself never fails for one claim.
"""

from __future__ import annotations

from sharing_plugin.dra.api.dra.v1 import api_pb2 as v1
from sharing_plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from sharing_plugin.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from sharing_plugin.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from sharing_plugin.dra.claims import ClaimRef
from sharing_plugin.dra.prepare import ClaimPreparer
from sharing_plugin.kit.unix_grpc import Context


def _refs(claims: object) -> list[ClaimRef]:
    # `claims` is a repeated Claim field of either version: the same three fields.
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]  # type: ignore[attr-defined]


class DraServicerV1Beta1(v1beta1_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: Context
    ) -> v1beta1.NodePrepareResourcesResponse:
        results = await self._preparer.prepare(_refs(request.claims))
        response = v1beta1.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            entry.error = result.error
            for d in result.devices:
                entry.devices.append(
                    v1beta1.Device(
                        request_names=d.requests,
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=d.cdi_ids,
                    )
                )
        return response

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        results = await self._preparer.unprepare(_refs(request.claims))
        response = v1beta1.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            response.claims[uid].error = error
        return response


class DraServicerV1(v1_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: Context
    ) -> v1.NodePrepareResourcesResponse:
        results = await self._preparer.prepare(_refs(request.claims))
        response = v1.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            entry.error = result.error
            for d in result.devices:
                entry.devices.append(
                    v1.Device(
                        request_names=d.requests,
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=d.cdi_ids,
                        share_id=d.share_id,
                    )
                )
        return response

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1.NodeUnprepareResourcesResponse:
        results = await self._preparer.unprepare(_refs(request.claims))
        response = v1.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            response.claims[uid].error = error
        return response
