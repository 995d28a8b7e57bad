"""The core API group (`/api/v1`): Nodes, ConfigMaps, Pods (list and watch by `spec.nodeName`)
and Events.

Served: GET of one object, list (`<Kind>List`, items without kind/apiVersion, as the real server
sends them), watch, PATCH as merge patch (RFC 7386) or strategic merge patch (merged as a merge
patch, which is what it does for the metadata maps), 415 for JSON patch and apply, POST of
Events (201, generateName, the namespace rules of core/v1 Event validation); label, annotation
and ConfigMap key validation (422). Tests change objects from the side (`put_node`,
`set_node_label`, `put_configmap`, ...).
"""

from __future__ import annotations

import asyncio
import copy
import random
import re
from collections.abc import Mapping
from typing import Any

from .permissions import Permissions, authorize
from .selectors import Match, field_terms, matcher, merge_patch, selector_name
from .status import (
    StatusError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    method_not_allowed,
    not_found,
    status,
)
from .store import META_FIELDS, Kind
from .validation import check_string_map, metadata_errors
from .watch import WatchStreams
from .wire import is_true, json_body, page_not_found, respond

KINDS = {
    "nodes": Kind("nodes", "Node", False, (*META_FIELDS, "spec.unschedulable")),
    "configmaps": Kind("configmaps", "ConfigMap", True, META_FIELDS),
    "pods": Kind("pods", "Pod", True, (*META_FIELDS, "spec.nodeName", "status.phase")),
    "events": Kind(
        "events",
        "Event",
        True,
        (
            *META_FIELDS,
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ),
    ),
}


def _validate(kind: Kind, obj: dict[str, Any]) -> None:
    """Shape errors -> 400 (the real server cannot even decode them), rule errors -> 422."""
    errors = metadata_errors(obj)
    if kind.resource == "configmaps":
        check_string_map(obj.get("data"), "data")
        for key in obj.get("data") or {}:
            if len(key) > 253 or not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
                errors.append(
                    (
                        "data",
                        f'Invalid value: "{key}": a valid config key must consist of '
                        "alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
                        "'KEY_NAME',  or 'key-name', regex used for validation is "
                        "'[-._a-zA-Z0-9]+')",
                    )
                )
    if kind.resource == "events":
        errors.extend(_event_errors(obj))
    if errors:
        raise invalid(kind.kind, str(obj["metadata"].get("name", "")), errors)


def _event_errors(event: dict[str, Any]) -> list[tuple[str, str]]:
    """legacyValidateEvent of k8s.io/kubernetes/pkg/apis/core/validation/events.go (core/v1)."""
    namespace = event["metadata"].get("namespace", "")
    involved = event.get("involvedObject")
    involved_ns = involved.get("namespace", "") if isinstance(involved, dict) else ""
    mismatch = (
        "involvedObject.namespace",
        f'Invalid value: "{involved_ns}": does not match event.namespace',
    )
    errors = []
    if not event.get("eventTime"):
        if (not involved_ns and namespace not in ("", "default")) or (
            involved_ns and namespace != involved_ns
        ):
            errors.append(mismatch)
    else:
        if not involved_ns and namespace not in ("default", "kube-system"):
            errors.append(mismatch)
        for key, path in (
            ("reportingComponent", "source"),
            ("reportingInstance", "reportingInstance"),
            ("action", "action"),
        ):
            if not event.get(key):
                errors.append((path, "Required value"))
    return errors


def _normalized(kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
    """Empty maps are omitted on the wire (Go's omitempty), as after the last label is removed."""
    meta = obj["metadata"]
    for key in ("labels", "annotations"):
        if key in meta and not meta[key]:
            del meta[key]
    if kind.resource == "configmaps" and "data" in obj and not obj["data"]:
        del obj["data"]
    return obj


class CoreResources(WatchStreams):
    """Nodes, ConfigMaps and Events: the test's side, and the `/api/v1` requests."""

    # -- objects, from the test's side

    def put_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Create the Node or replace its labels and annotations."""
        kind = KINDS["nodes"]
        obj = copy.deepcopy(self._objects.get(("nodes", "", name))) or self._new(kind, "", name)
        obj["metadata"]["labels"] = dict(labels or {})
        obj["metadata"]["annotations"] = dict(annotations or {})
        obj.setdefault("spec", {})
        obj.setdefault("status", {})
        self._store_checked(kind, obj)

    def set_node_allocatable(self, name: str, allocatable: Mapping[str, str]) -> None:
        """What the kubelet posts in the Node's status: its allocatable resources."""
        kind = KINDS["nodes"]
        obj = copy.deepcopy(self._objects[("nodes", "", name)])
        obj.setdefault("status", {})["allocatable"] = dict(allocatable)
        self._store_checked(kind, obj)

    def node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._objects[("nodes", "", name)])

    def set_node_label(self, name: str, key: str, value: str | None) -> None:
        """As `kubectl label node` does: set, overwrite, or remove (None) one label."""
        kind = KINDS["nodes"]
        current = self._objects[("nodes", "", name)]
        obj = merge_patch(current, {"metadata": {"labels": {key: value}}})
        self._store_checked(kind, obj)

    def delete_node(self, name: str) -> None:
        self._commit(KINDS["nodes"], "", name, None)

    def put_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Create the ConfigMap or replace its data (ADDED / MODIFIED; no event if unchanged)."""
        kind = KINDS["configmaps"]
        current = self._objects.get(("configmaps", namespace, name))
        obj = copy.deepcopy(current) if current else self._new(kind, namespace, name)
        obj["data"] = dict(data)
        self._store_checked(kind, obj)

    def delete_configmap(self, namespace: str, name: str) -> None:
        if self._commit(KINDS["configmaps"], namespace, name, None) is None:
            raise KeyError((namespace, name))

    def configmap(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._objects[("configmaps", namespace, name)])

    def put_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        containers: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create the Pod bound to `node`, or replace its container statuses (container name ->
        runtime ID, e.g. ``containerd://<64 hex>``). Returns it as stored (its uid)."""
        kind = KINDS["pods"]
        current = self._objects.get(("pods", namespace, name))
        obj = copy.deepcopy(current) if current else self._new(kind, namespace, name)
        obj["metadata"]["annotations"] = dict(annotations or {})
        containers = dict(containers or {})
        obj["spec"] = {"nodeName": node, "containers": [{"name": c} for c in containers]}
        obj["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "containerID": cid, "ready": True, "restartCount": 0, "image": "x",
                 "imageID": "x"}
                for c, cid in containers.items()
            ],
        }  # fmt: skip
        self._store_checked(kind, obj)
        return copy.deepcopy(self._objects[("pods", namespace, name)])

    def delete_pod(self, namespace: str, name: str) -> None:
        if self._commit(KINDS["pods"], namespace, name, None) is None:
            raise KeyError((namespace, name))

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Event objects created (and patched) so far, in creation order."""
        found = [
            obj
            for (resource, ns, _), obj in self._objects.items()
            if resource == "events" and namespace in (None, ns)
        ]
        return copy.deepcopy(found)

    def _store_checked(self, kind: Kind, obj: dict[str, Any]) -> None:
        try:
            _validate(kind, obj)
        except StatusError as e:
            raise ValueError(e.status["message"]) from None
        meta = obj["metadata"]
        self._commit(kind, meta.get("namespace", ""), meta["name"], _normalized(kind, obj))

    # -- requests

    async def _route_core(
        self,
        method: str,
        rest: list[str],
        query: dict[str, str],
        headers: dict[str, str],
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        perms: Permissions | None,
    ) -> bool:
        """/api/v1/...: `rest` is the path after it."""
        namespace: str | None = None
        if len(rest) in (3, 4) and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        kind = KINDS.get(rest[0]) if rest and len(rest) <= 2 else None
        if kind is None or (namespace is not None and not kind.namespaced):
            return await page_not_found(writer)
        name = rest[1] if len(rest) == 2 else None
        if name is not None and kind.namespaced and namespace is None:
            return await page_not_found(writer)
        ns = namespace or ""

        if method == "GET" and name is None:
            verb = "watch" if is_true(query.get("watch")) else "list"
        else:
            verb = {
                ("GET", True): "get",
                ("POST", False): "create",
                ("PATCH", True): "patch",
                ("PUT", True): "update",
                ("DELETE", True): "delete",
            }.get((method, name is not None), "")
        if verb in ("", "update", "delete"):
            raise method_not_allowed()
        terms = field_terms(kind.fields, query.get("fieldSelector", ""))
        authz_name = name if name is not None else selector_name(terms)
        if verb == "create":
            authz_name = None
        authorize(perms, verb, kind.resource, group="", namespace=namespace, name=authz_name)

        if verb == "get":
            assert name is not None
            obj = self._objects.get((kind.resource, ns, name))
            if obj is None:
                raise not_found(kind.resource, name)
            await respond(writer, 200, obj)
            return True
        if verb in ("list", "watch"):
            match = matcher(query, terms)
            if verb == "list":
                await self._list(writer, kind, namespace, match)
                return True
            return await self._watch(reader, writer, kind, namespace, match, query)
        if verb == "create":
            return await self._create(writer, kind, ns, query, raw)
        assert name is not None
        return await self._patch(writer, kind, ns, name, query, headers, raw)

    async def _list(
        self, writer: asyncio.StreamWriter, kind: Kind, namespace: str | None, match: Match
    ) -> None:
        # kube-apiserver leaves kind and apiVersion out of list items
        items = [
            {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            for _, obj in self._selected(kind, namespace, match)
        ]
        body = {
            "kind": f"{kind.kind}List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }
        await respond(writer, 200, body)

    async def _create(
        self,
        writer: asyncio.StreamWriter,
        kind: Kind,
        namespace: str,
        query: dict[str, str],
        raw: bytes,
    ) -> bool:
        body = json_body(raw)
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        if body.get("kind") not in (None, kind.kind) or body.get("apiVersion") not in (None, "v1"):
            raise bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version (v1) or kind ({body.get('kind')}) is not {kind.kind}"
            )
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise bad_request("metadata: expected an object")
        if kind.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            name = f"{meta['generateName']}{suffix}"
        if not name:
            raise invalid(
                kind.kind,
                "",
                [("metadata.name", "Required value: name or generateName is required")],
            )
        if (kind.resource, namespace, name) in self._objects:
            raise already_exists(kind.resource, name)
        obj = self._new(kind, namespace, name)
        new_meta = {k: v for k, v in meta.items() if k not in ("resourceVersion", "uid")}
        new_meta.update(obj["metadata"])
        obj = {**body, "kind": kind.kind, "apiVersion": "v1", "metadata": new_meta}
        _validate(kind, obj)
        obj = _normalized(kind, obj)
        if query.get("dryRun") != "All":
            stored = self._commit(kind, namespace, name, obj)
            assert stored is not None
            obj = stored
        await respond(writer, 201, obj)
        return True

    async def _patch(
        self,
        writer: asyncio.StreamWriter,
        kind: Kind,
        namespace: str,
        name: str,
        query: dict[str, str],
        headers: dict[str, str],
        raw: bytes,
    ) -> bool:
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            raise StatusError(
                status(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format ({content_type}) - "
                    "accepted media types include: application/merge-patch+json, "
                    "application/strategic-merge-patch+json",
                )
            )
        current = self._objects.get((kind.resource, namespace, name))
        if current is None:
            raise not_found(kind.resource, name)
        patch = json_body(raw)
        if not isinstance(patch, dict):
            raise bad_request("the patch must be a JSON object")
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
            raise conflict(kind.resource, name)
        obj = merge_patch(current, patch)
        if not isinstance(obj.get("metadata"), dict):
            raise bad_request("metadata: expected an object")
        # What a patch cannot change.
        obj["kind"], obj["apiVersion"] = kind.kind, "v1"
        obj["metadata"] = {
            **obj["metadata"],
            **{
                k: v
                for k, v in current["metadata"].items()
                if k in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion")
            },
        }
        _validate(kind, obj)
        obj = _normalized(kind, obj)
        if query.get("dryRun") != "All":
            stored = self._commit(kind, namespace, name, obj)
            assert stored is not None
            obj = stored
        await respond(writer, 200, obj)
        return True
