"""resource.k8s.io (DRA): ResourceSlices, ResourceClaims and DeviceClasses in v1 and v1beta1,
with API discovery under /apis.

Served verbs: get, list (field and label selectors), create, update (PUT, resourceVersion
checked when given), merge PATCH, delete and deletecollection; no watch. Tests put objects in
from the side (`put_dra_object`) and read what the plugin wrote (`dra_objects`).
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Mapping
from typing import Any

from .dra_schema import DRA_KINDS, RESOURCE_GROUP, discovery, dra_api_version, from_v1, to_v1
from .dra_schema import validate as dra_validate
from .permissions import Permissions, authorize
from .selectors import field_terms, matcher, merge_patch
from .status import (
    StatusError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    method_not_allowed,
    not_found,
)
from .store import Kind, ObjectStore
from .wire import is_true, json_body, page_not_found, respond


class DraResources(ObjectStore):
    """The resource.k8s.io objects: the test's side, and the `/apis/...` requests."""

    # The versions of resource.k8s.io served, newest first: ("v1beta1",) plays Kubernetes 1.32.
    dra_versions: tuple[str, ...] = ("v1", "v1beta1")
    # Feature gates that are off: like kube-apiserver, the fields of a disabled feature are
    # dropped from a ResourceSlice on write, silently (checked on the real 1.36 server with
    # DRAConsumableCapacity=false: allowMultipleAllocations and requestPolicy vanish; with
    # DRADeviceTaints=false, as Kubernetes 1.34-1.35 default to, the devices' taints do).
    dra_features_off: frozenset[str] = frozenset()

    # -- objects, from the test's side

    def put_dra_object(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a DeviceClass, ResourceClaim or ResourceSlice of either version
        (`apiVersion` says which); returns it as stored (v1)."""
        version = str(document["apiVersion"]).rpartition("/")[2]
        kind = next(k for k in DRA_KINDS.values() if k.kind == document["kind"])
        obj = to_v1(kind, dict(document), version)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if kind.namespaced else ""
        current = self._objects.get((kind.resource, namespace, meta["name"]))
        base = (
            current["metadata"] if current else self._new(kind, namespace, meta["name"])["metadata"]
        )
        obj["metadata"] = {**base, **{k: v for k, v in meta.items() if k != "resourceVersion"}}
        try:
            dra_validate(kind, from_v1(kind, obj, version), version)
        except StatusError as e:
            raise ValueError(e.status["message"]) from None
        stored = self._commit(kind, namespace, meta["name"], obj)
        assert stored is not None
        return copy.deepcopy(stored)

    def dra_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every stored object of `resource` (resourceslices, ...), in the v1 shape, by name."""
        return [
            copy.deepcopy(obj)
            for (res, ns, _), obj in sorted(self._objects.items())
            if res == resource and namespace in (None, ns)
        ]

    def delete_dra_object(self, resource: str, name: str, namespace: str = "") -> None:
        if self._commit(DRA_KINDS[resource], namespace, name, None) is None:
            raise KeyError((resource, namespace, name))

    # -- requests

    async def _route_dra(
        self,
        method: str,
        segments: list[str],
        query: dict[str, str],
        raw: bytes,
        writer: asyncio.StreamWriter,
        perms: Permissions | None,
    ) -> bool:
        """/apis/...: discovery and the resource.k8s.io objects."""
        if method == "GET" and (found := discovery(segments, self.dra_versions)):
            await respond(writer, 200, found)
            return True
        if (
            len(segments) < 4
            or segments[1] != RESOURCE_GROUP
            or segments[2] not in self.dra_versions
        ):
            return await page_not_found(writer)
        version, rest = segments[2], segments[3:]
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        kind = DRA_KINDS.get(rest[0]) if rest else None
        subresource = rest[2] if len(rest) == 3 else None
        if (
            kind is None
            or len(rest) > 3
            or subresource not in (None, "status")
            or (namespace is not None) != kind.namespaced
        ):
            return await page_not_found(writer)
        name = rest[1] if len(rest) >= 2 else None
        ns = namespace or ""
        if method == "GET":
            verb = "get" if name else "watch" if is_true(query.get("watch")) else "list"
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
                method, ""
            )
            if verb == "delete" and name is None:
                verb = "deletecollection"
        if verb in ("", "watch") or (verb == "create") != (name is None and method == "POST"):
            raise method_not_allowed()
        terms = field_terms(kind.fields, query.get("fieldSelector", ""))
        authorize(perms, verb, kind.resource, group=RESOURCE_GROUP, namespace=namespace, name=name)
        match = matcher(query, terms)

        if verb == "list":
            items = [
                {
                    k: v
                    for k, v in from_v1(kind, o, version).items()
                    if k not in ("kind", "apiVersion")
                }
                for _, o in self._selected(kind, namespace, match)
            ]
            await respond(
                writer,
                200,
                {
                    "kind": f"{kind.kind}List",
                    "apiVersion": dra_api_version(version),
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                },
            )
            return True
        if verb == "deletecollection":
            gone = [
                self._commit(kind, ns, n, None) for n, _ in self._selected(kind, namespace, match)
            ]
            items = [from_v1(kind, o, version) for o in gone if o is not None]
            await respond(
                writer,
                200,
                {
                    "kind": f"{kind.kind}List",
                    "apiVersion": dra_api_version(version),
                    "items": items,
                },
            )
            return True
        current = self._objects.get((kind.resource, ns, name or ""))
        if verb == "get":
            if current is None:
                raise not_found(kind.resource, name or "")
            await respond(writer, 200, from_v1(kind, current, version))
            return True
        if verb == "delete":
            assert name is not None
            deleted = self._commit(kind, ns, name, None)
            if deleted is None:
                raise not_found(kind.resource, name)
            await respond(writer, 200, from_v1(kind, deleted, version))
            return True
        body = json_body(raw)
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        if verb == "patch":
            if current is None:
                raise not_found(kind.resource, name or "")
            body = merge_patch(from_v1(kind, current, version), body)
        return await self._write_dra(writer, kind, version, ns, name, current, body, query)

    async def _write_dra(
        self,
        writer: asyncio.StreamWriter,
        kind: Kind,
        version: str,
        namespace: str,
        name: str | None,
        current: dict[str, Any] | None,
        body: dict[str, Any],
        query: dict[str, str],
    ) -> bool:
        """create (name None), update or patch: checks, then store."""
        api_version = dra_api_version(version)
        if body.get("kind") not in (None, kind.kind) or body.get("apiVersion") not in (
            None,
            api_version,
        ):
            raise bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version ({api_version}) or kind ({body.get('kind')}) is not "
                f"{kind.kind}"
            )
        body = {**body, "kind": kind.kind, "apiVersion": api_version}
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            raise bad_request("metadata: expected an object")
        if kind.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the object does not match the request's")
        shown = f"{kind.resource}.{RESOURCE_GROUP}"
        if name is None:  # create
            name = meta.get("name") or ""
            if not name and meta.get("generateName"):
                name = meta["generateName"] + "".join(
                    random.choices("bcdfghjklmnpqrstvwxz2456789", k=5)
                )
            if not name:
                raise invalid(
                    kind.kind,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                )
            if (kind.resource, namespace, name) in self._objects:
                raise already_exists(kind.resource, name, shown=shown)
            base = self._new(kind, namespace, name)["metadata"]
            code = 201
        else:
            if current is None:
                raise not_found(kind.resource, name)
            wanted = meta.get("resourceVersion")
            if wanted not in (None, "", current["metadata"]["resourceVersion"]):
                raise conflict(kind.resource, name, shown=shown)
            if meta.get("name") not in (None, name):
                raise bad_request("the name of the object does not match the name on the URL")
            base = {k: v for k, v in current["metadata"].items() if k != "resourceVersion"}
            code = 200
        kept = ("name", "namespace", "uid", "creationTimestamp")
        body["metadata"] = {
            **{k: v for k, v in meta.items() if k not in (*kept, "resourceVersion")},
            **{k: v for k, v in base.items() if k in kept},
        }
        dra_validate(kind, body, version)
        obj = to_v1(kind, body, version)
        if kind.kind == "ResourceSlice":
            obj = _without_disabled_fields(obj, self.dra_features_off)
        if query.get("dryRun") != "All":
            stored = self._commit(kind, namespace, name, obj)
            assert stored is not None
            obj = stored
        await respond(writer, code, from_v1(kind, obj, version))
        return True


_FIELDS_OF = {
    "DRAConsumableCapacity": ("allowMultipleAllocations", "requestPolicy"),
    "DRAPartitionableDevices": ("consumesCounters", "sharedCounters"),
    "DRADeviceTaints": ("taints",),
}


def _without_disabled_fields(obj: dict[str, Any], off: frozenset[str]) -> dict[str, Any]:
    """A v1 ResourceSlice with the fields of the features in `off` removed."""
    fields = {f for feature in off for f in _FIELDS_OF.get(feature, ())}
    if not fields:
        return obj
    spec = {k: v for k, v in obj["spec"].items() if k not in fields}
    devices = []
    for device in spec.get("devices") or ():
        device = {k: v for k, v in device.items() if k not in fields}
        if "capacity" in device:
            device["capacity"] = {
                name: {k: v for k, v in c.items() if k not in fields}
                for name, c in device["capacity"].items()
            }
        devices.append(device)
    if "devices" in spec:
        spec["devices"] = devices
    return {**obj, "spec": spec}
