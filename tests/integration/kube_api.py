"""A fake kube-apiserver for the API calls a GPU device plugin makes, served over real HTTP.

`FakeKubeApi` listens on 127.0.0.1 (plain HTTP/1.1, keep-alive, chunked watch streams) and keeps
Nodes, ConfigMaps, Pods (list and watch by `spec.nodeName`) and core/v1 Events the way
kube-apiserver does where a client can tell:

* one global resourceVersion counter, bumped by every write that changes something (a PATCH or
  a `put_*` that changes nothing leaves the object and its resourceVersion alone, as the real
  server does); every object has uid, resourceVersion and creationTimestamp;
* GET of one object, list (`<Kind>List`, items without kind/apiVersion, as the real server sends
  them), watch (`?watch=true`) with resourceVersion, timeoutSeconds, allowWatchBookmarks,
  fieldSelector and labelSelector;
* PATCH as merge patch (RFC 7386) or strategic merge patch (merged as a merge patch, which is
  what it does for the metadata maps), 415 for JSON patch and apply; POST of Events (201,
  generateName, the namespace rules of core/v1 Event validation);
* bearer-token authentication (401) and per-token RBAC-like permissions (403 with
  kube-apiserver's message), label and ConfigMap key validation (422).

resource.k8s.io (DRA: ResourceSlices, ResourceClaims, DeviceClasses in v1 and v1beta1, with API
discovery under /apis) is served too; its section near the end of this module says how.

Tests drive it from the side: change objects (`put_node`, `set_node_label`, `put_configmap`, ...),
end watches cleanly or drop their connections (`close_watches`), answer the next watch with 410
Gone (`expire_next_watch`), forget history (`compact`), send BOOKMARKs (`send_bookmarks`), stop
and restart listening (`down`/`up`), and read what the client asked (`requests`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime
import http
import itertools
import json
import random
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml_fast

DEFAULT_USER = "system:serviceaccount:kube-system:sharing-plugin"

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
RESOURCES = (
    "nodes",
    "configmaps",
    "events",
    "pods",
    # resource.k8s.io (DRA), below
    "resourceslices",
    "resourceclaims",
    "deviceclasses",
)


class Permissions(frozenset[tuple[str, str]]):
    """A frozenset of (verb, resource) pairs, plus the user name a 403 message names."""

    user: str

    def __new__(
        cls, pairs: Iterable[tuple[str, str]] = (), *, user: str = DEFAULT_USER
    ) -> Permissions:
        self = super().__new__(cls, pairs)
        self.user = user
        return self


def permissions(*pairs: tuple[str, str], user: str = DEFAULT_USER) -> Permissions:
    """permissions(("get", "nodes"), ("watch", "configmaps"), ...)"""
    for verb, resource in pairs:
        if verb not in VERBS or resource not in RESOURCES:
            raise ValueError(f"unknown permission {(verb, resource)!r}")
    return Permissions(pairs, user=user)


ALL_PERMISSIONS = Permissions(itertools.product(VERBS, RESOURCES))


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: Any = None  # the JSON body, parsed; None when there is none (or it is not JSON)


@dataclass(frozen=True)
class _Kind:
    resource: str
    kind: str
    namespaced: bool
    fields: tuple[str, ...]  # field selectors the real server accepts (a subset)


_META_FIELDS = ("metadata.name", "metadata.namespace")
_KINDS = {
    "nodes": _Kind("nodes", "Node", False, (*_META_FIELDS, "spec.unschedulable")),
    "configmaps": _Kind("configmaps", "ConfigMap", True, _META_FIELDS),
    "pods": _Kind("pods", "Pod", True, (*_META_FIELDS, "spec.nodeName", "status.phase")),
    "events": _Kind(
        "events",
        "Event",
        True,
        (
            *_META_FIELDS,
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

_TRUE = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool


@dataclass
class _Change:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: _Kind
    namespace: str
    obj: dict[str, Any]  # the object after the change (for DELETED: the last state, new rv)
    old: dict[str, Any] | None


_END = object()  # end the watch stream cleanly
_DROP = object()  # drop the connection mid-stream


@dataclass(eq=False)
class _Watch:
    kind: _Kind
    namespace: str | None  # None: every namespace (or a cluster-scoped kind)
    match: Callable[[dict[str, Any]], bool]
    bookmarks: bool
    pending: collections.deque[Any] = field(default_factory=collections.deque)
    waiter: asyncio.Future[None] | None = None

    def push(self, item: Any) -> None:
        self.pending.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def event_for(self, change: _Change) -> dict[str, Any] | None:
        """What this watch sees of a change, as kube-apiserver's watch filter does: an object
        that starts matching the selectors is ADDED, one that stops matching is DELETED."""
        if change.kind is not self.kind:
            return None
        if self.namespace is not None and change.namespace != self.namespace:
            return None
        was = change.old is not None and self.match(change.old)
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.obj} if was else None
        now = self.match(change.obj)
        if was and now:
            return {"type": "MODIFIED", "object": change.obj}
        if now:
            return {"type": "ADDED", "object": change.obj}
        if was:
            return {"type": "DELETED", "object": change.obj}
        return None


class _ApiError(Exception):
    def __init__(self, status: dict[str, Any]) -> None:
        super().__init__(status["message"])
        self.status = status


def _status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        status["details"] = details
    status["code"] = code
    return status


def _not_found(kind: _Kind, name: str) -> _ApiError:
    return _ApiError(
        _status(
            404,
            "NotFound",
            f'{kind.resource} "{name}" not found',
            {"name": name, "kind": kind.resource},
        )
    )


def _bad_request(message: str) -> _ApiError:
    return _ApiError(_status(400, "BadRequest", message))


def _invalid(kind: _Kind, name: str, errors: list[tuple[str, str]]) -> _ApiError:
    """422 as field.ErrorList.ToAggregate() words it; errors are (field, message)."""
    texts = [f"{path}: {text}" for path, text in errors]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    causes = [
        {"reason": "FieldValueInvalid", "message": text, "field": path} for path, text in errors
    ]
    return _ApiError(
        _status(
            422,
            "Invalid",
            f'{kind.kind} "{name}" is invalid: {joined}',
            {"name": name, "kind": kind.kind, "causes": causes},
        )
    )


# -- validation (the parts of apimachinery's that a label-writing client can trip over) ----------

_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?"
    "[A-Za-z0-9])?')"
)
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used "
    "for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


def _qualified_name_errors(key: str) -> list[str]:
    prefix, slash, name = key.rpartition("/")
    errors = []
    if slash and (len(prefix) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, prefix)):
        errors.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    elif not re.fullmatch(_NAME_PART, name):
        errors.append(_NAME_PART_MSG)
    return errors


def _label_value_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if value and not re.fullmatch(_NAME_PART, value):
        errors.append(_LABEL_VALUE_MSG)
    return errors


def _check_string_map(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _bad_request(
            f"{where}: expected a map of strings to strings, got {json.dumps(value)}"
        )


def _validate(kind: _Kind, obj: dict[str, Any]) -> None:
    """Shape errors -> 400 (the real server cannot even decode them), rule errors -> 422."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise _bad_request("metadata: expected an object")
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    _check_string_map(labels, "metadata.labels")
    _check_string_map(annotations, "metadata.annotations")
    errors: list[tuple[str, str]] = []
    for key, value in (labels or {}).items():
        for text in _qualified_name_errors(key):
            errors.append(("metadata.labels", f'Invalid value: "{key}": {text}'))
        for text in _label_value_errors(value):
            errors.append(("metadata.labels", f'Invalid value: "{value}": {text}'))
    for key in annotations or {}:
        for text in _qualified_name_errors(key.lower()):
            errors.append(("metadata.annotations", f'Invalid value: "{key}": {text}'))
    if kind.resource == "configmaps":
        _check_string_map(obj.get("data"), "data")
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
        raise _invalid(kind, str(meta.get("name", "")), errors)


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


# -- patches and selectors ----------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces.
    Returns a new value; `target` is not changed."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


_LABEL_TERM = re.compile(
    r"(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?"
)


def _label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_terms(selector):
        m = _LABEL_TERM.fullmatch(term)
        if m is None or (m["neg"] and (m["op"] or m["set"])):
            raise _bad_request(f"unable to parse requirement: invalid label selector: {term!r}")
        key, op, value = m["key"], m["op"], m["value"]
        if m["neg"]:
            tests.append(lambda labels, k=key: k not in labels)
        elif op in ("=", "=="):
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif m["set"]:
            values = frozenset(v.strip() for v in m["values"].split(","))
            if m["set"] == "in":
                tests.append(lambda labels, k=key, vs=values: k in labels and labels[k] in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            tests.append(lambda labels, k=key: k in labels)
    return lambda labels: all(test(labels) for test in tests)


def _field_value(obj: dict[str, Any], path: str) -> str:
    if path == "source":
        path = "source.component"
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path == "spec.unschedulable":
        return "true" if value else "false"
    return "" if value is None else str(value)


def _field_terms(kind: _Kind, selector: str) -> list[tuple[str, bool, str]]:
    """(field, equal?, value) for each term of a field selector."""
    terms = []
    for term in _split_terms(selector):
        m = re.fullmatch(r"([A-Za-z.]+)\s*(==|=|!=)\s*(.*)", term)
        if m is None:
            raise _bad_request(f"invalid field selector: {term!r}")
        name, op, value = m.groups()
        if name not in kind.fields:
            raise _bad_request(f"field label not supported: {name}")
        terms.append((name, op != "!=", value.strip()))
    return terms


def _selector_name(terms: list[tuple[str, bool, str]]) -> str | None:
    """The name a list/watch asks for (kube-apiserver puts it into the authorization check)."""
    for name, equal, value in terms:
        if name == "metadata.name" and equal:
            return value
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _normalized(kind: _Kind, obj: dict[str, Any]) -> dict[str, Any]:
    """Empty maps are omitted on the wire (Go's omitempty), as after the last label is removed."""
    meta = obj["metadata"]
    for key in ("labels", "annotations"):
        if key in meta and not meta[key]:
            del meta[key]
    if kind.resource == "configmaps" and "data" in obj and not obj["data"]:
        del obj["data"]
    return obj


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}


# -- the server ---------------------------------------------------------------------------------


class FakeKubeApi:
    """An in-process kube-apiserver for Nodes, ConfigMaps and Events (see the module docstring).

    `tokens` maps bearer tokens to what they may do; None turns authentication off.
    """

    def __init__(self, *, tokens: Mapping[str, Permissions] | None = None) -> None:
        self._tokens = dict(tokens) if tokens is not None else None
        self.requests: list[Request] = []
        self.request_seen = asyncio.Event()  # set at every request; clear it to wait again
        self._rv = 100
        self._compacted = self._rv  # a watch may resume from this resourceVersion or later
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._history: list[_Change] = []
        self._watches: set[_Watch] = set()
        self._watch_changed = asyncio.Event()
        self._expire_next = False
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._closing = False
        self._conns: set[asyncio.StreamWriter] = set()
        self._idle: set[asyncio.StreamWriter] = set()  # waiting for the next request
        self._handlers: set[asyncio.Task[Any]] = set()
        self.connections = 0  # TCP connections accepted so far (keep-alive reuses one)

    # -- lifecycle

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("FakeKubeApi is not started (use `async with`)")
        return f"http://127.0.0.1:{self._port}"

    async def __aenter__(self) -> FakeKubeApi:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        # End watches as a shutting-down server does (terminating chunk), then drop the rest.
        self._closing = True
        self.close_watches(clean=True)
        for writer in list(self._idle):
            writer.transport.abort()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)
        await self.down()

    async def down(self) -> None:
        """Stop listening and drop every connection: clients get connection refused."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._conns):
            writer.transport.abort()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers))

    async def up(self) -> None:
        """Listen again on the same port."""
        if self._server is None:
            assert self._port is not None, "up() before the server was ever started"
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)

    def kubeconfig(
        self, path: Path, *, token: str | None = None, namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig for this server (lightkube.KubeConfig.from_file loads it)."""
        user: dict[str, str] = {"token": token} if token is not None else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            # Plain HTTP: nothing to verify, and without this every client loads the system's
            # CA bundle first (~50 ms of CPU each, dozens of clients per test run).
            "clusters": [
                {"name": "fake", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}
            ],
            "users": [{"name": "fake", "user": user}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path = Path(path)
        path.write_text(yaml_fast.dump(config, sort_keys=False))
        return path

    # -- objects, from the test's side

    def put_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Create the Node or replace its labels and annotations."""
        kind = _KINDS["nodes"]
        obj = copy.deepcopy(self._objects.get(("nodes", "", name))) or self._new(kind, "", name)
        obj["metadata"]["labels"] = dict(labels or {})
        obj["metadata"]["annotations"] = dict(annotations or {})
        obj.setdefault("spec", {})
        obj.setdefault("status", {})
        self._store_checked(kind, obj)

    def node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._objects[("nodes", "", name)])

    def set_node_label(self, name: str, key: str, value: str | None) -> None:
        """As `kubectl label node` does: set, overwrite, or remove (None) one label."""
        kind = _KINDS["nodes"]
        current = self._objects[("nodes", "", name)]
        obj = merge_patch(current, {"metadata": {"labels": {key: value}}})
        self._store_checked(kind, obj)

    def delete_node(self, name: str) -> None:
        self._commit(_KINDS["nodes"], "", name, None)

    def put_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Create the ConfigMap or replace its data (ADDED / MODIFIED; no event if unchanged)."""
        kind = _KINDS["configmaps"]
        current = self._objects.get(("configmaps", namespace, name))
        obj = copy.deepcopy(current) if current else self._new(kind, namespace, name)
        obj["data"] = dict(data)
        self._store_checked(kind, obj)

    def delete_configmap(self, namespace: str, name: str) -> None:
        if self._commit(_KINDS["configmaps"], namespace, name, None) is None:
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
        kind = _KINDS["pods"]
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
        if self._commit(_KINDS["pods"], namespace, name, None) is None:
            raise KeyError((namespace, name))

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Event objects created (and patched) so far, in creation order."""
        found = [
            obj
            for (resource, ns, _), obj in self._objects.items()
            if resource == "events" and namespace in (None, ns)
        ]
        return copy.deepcopy(found)

    # -- watch control

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    async def wait_watches(self, count: int = 1, timeout: float = 5) -> None:  # noqa: ASYNC109
        """Wait until at least `count` watches are open (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            while len(self._watches) < count:
                self._watch_changed.clear()
                await self._watch_changed.wait()

    def close_watches(self, *, clean: bool = True) -> None:
        """clean: end every open watch stream as a server-side timeout does (terminating chunk);
        clean=False: drop each watch's TCP connection mid-stream."""
        for watch in self._watches:
            watch.push(_END if clean else _DROP)

    def expire_next_watch(self) -> None:
        """The next watch request gets a 410 Gone ERROR event inside a 200 stream, which ends."""
        self._expire_next = True

    def compact(self) -> None:
        """Forget history: a watch from an older resourceVersion now gets 410 Gone."""
        self._history.clear()
        self._compacted = self._rv

    def send_bookmarks(self) -> None:
        """A BOOKMARK at the current resourceVersion to every watch that allowed bookmarks."""
        for watch in self._watches:
            if watch.bookmarks:
                watch.push(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": watch.kind.kind,
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self._rv)},
                        },
                    }
                )

    # -- storage

    def _new(self, kind: _Kind, namespace: str, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if kind.namespaced:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        return {"kind": kind.kind, "apiVersion": "v1", "metadata": meta}

    def _store_checked(self, kind: _Kind, obj: dict[str, Any]) -> None:
        try:
            _validate(kind, obj)
        except _ApiError as e:
            raise ValueError(e.status["message"]) from None
        meta = obj["metadata"]
        self._commit(kind, meta.get("namespace", ""), meta["name"], _normalized(kind, obj))

    def _commit(
        self, kind: _Kind, namespace: str, name: str, obj: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """Store (or delete, obj None) one object; bump the resourceVersion and tell the watches
        when something changed. Returns what is stored now (for a delete: the final state)."""
        key = (kind.resource, namespace, name)
        old = self._objects.get(key)
        if obj is None:
            if old is None:
                return None
            del self._objects[key]
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._publish(_Change(self._rv, "DELETED", kind, namespace, gone, old))
            return gone
        if old is not None and _without_rv(old) == _without_rv(obj):
            return old
        obj = copy.deepcopy(obj)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self._publish(
            _Change(self._rv, "MODIFIED" if old is not None else "ADDED", kind, namespace, obj, old)
        )
        return obj

    def _publish(self, change: _Change) -> None:
        self._history.append(change)
        for watch in self._watches:
            event = watch.event_for(change)
            if event is not None:
                watch.push(event)

    # -- HTTP

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._conns.add(writer)
        self.connections += 1
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # Ending quietly: asyncio's server callback (3.11) calls exception() on this task
            # and would log a cancelled one as an error.
            pass
        finally:
            self._handlers.discard(task)
            self._conns.discard(writer)
            self._idle.discard(writer)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self._closing:
            self._idle.add(writer)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed its connection between requests
            finally:
                self._idle.discard(writer)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            raw = await _read_body(reader, headers)
            keep_alive = await self._handle(method, target, headers, raw, reader, writer)
            if not keep_alive or headers.get("connection", "").lower() == "close":
                return

    async def _handle(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        body: Any = None
        if raw:
            with contextlib.suppress(ValueError):
                body = json.loads(raw)
        self.requests.append(Request(method, path, query, headers, body))
        self.request_seen.set()
        try:
            return await self._route(method, path, query, headers, raw, reader, writer)
        except _ApiError as e:
            await _respond(writer, e.status["code"], e.status)
            return True

    def _authenticate(self, headers: Mapping[str, str]) -> Permissions | None:
        if self._tokens is None:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        perms = self._tokens.get(token) if scheme.lower() == "bearer" else None
        if perms is None:
            raise _ApiError(_status(401, "Unauthorized", "Unauthorized"))
        return perms

    @staticmethod
    def _authorize(
        perms: Permissions | None, verb: str, kind: _Kind, namespace: str | None, name: str | None
    ) -> None:
        if perms is None or (verb, kind.resource) in perms:
            return
        user = getattr(perms, "user", DEFAULT_USER)
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        reason = f'User "{user}" cannot {verb} resource "{kind.resource}" in API group "" {where}'
        subject = f'{kind.resource} "{name}"' if name else kind.resource
        details: dict[str, Any] = {"kind": kind.resource}
        if name:
            details = {"name": name, **details}
        raise _ApiError(_status(403, "Forbidden", f"{subject} is forbidden: {reason}", details))

    async def _route(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        perms = self._authenticate(headers)
        segments = path.strip("/").split("/")
        if segments[:1] == ["apis"]:
            return await self._route_dra(method, segments, query, headers, raw, writer, perms)
        if segments[:2] != ["api", "v1"]:
            return await _page_not_found(writer)
        rest = segments[2:]
        namespace: str | None = None
        if len(rest) in (3, 4) and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        kind = _KINDS.get(rest[0]) if rest and len(rest) <= 2 else None
        if kind is None or (namespace is not None and not kind.namespaced):
            return await _page_not_found(writer)
        name = rest[1] if len(rest) == 2 else None
        if name is not None and kind.namespaced and namespace is None:
            return await _page_not_found(writer)
        ns = namespace or ""

        if method == "GET" and name is None:
            verb = "watch" if query.get("watch") in _TRUE else "list"
        else:
            verb = {
                ("GET", True): "get",
                ("POST", False): "create",
                ("PATCH", True): "patch",
                ("PUT", True): "update",
                ("DELETE", True): "delete",
            }.get((method, name is not None), "")
        if verb in ("", "update", "delete"):
            raise _ApiError(
                _status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            )
        field_terms = _field_terms(kind, query.get("fieldSelector", ""))
        authz_name = name if name is not None else _selector_name(field_terms)
        if verb == "create":
            authz_name = None
        self._authorize(perms, verb, kind, namespace, authz_name)

        if verb == "get":
            assert name is not None
            obj = self._objects.get((kind.resource, ns, name))
            if obj is None:
                raise _not_found(kind, name)
            await _respond(writer, 200, obj)
            return True
        if verb in ("list", "watch"):
            labels = _label_selector(query.get("labelSelector", ""))

            def match(obj: dict[str, Any]) -> bool:
                return labels(obj["metadata"].get("labels") or {}) and all(
                    (_field_value(obj, f) == value) == equal for f, equal, value in field_terms
                )

            if verb == "list":
                await self._list(writer, kind, namespace, match)
                return True
            return await self._watch(reader, writer, kind, namespace, match, query)
        if verb == "create":
            return await self._create(writer, kind, ns, query, raw)
        assert name is not None
        return await self._patch(writer, kind, ns, name, query, headers, raw)

    async def _list(
        self,
        writer: asyncio.StreamWriter,
        kind: _Kind,
        namespace: str | None,
        match: Callable[[dict[str, Any]], bool],
    ) -> None:
        items = []
        for (resource, ns, _), obj in sorted(self._objects.items()):
            if resource == kind.resource and namespace in (None, ns) and match(obj):
                # kube-apiserver leaves kind and apiVersion out of list items
                items.append({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
        body = {
            "kind": f"{kind.kind}List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }
        await _respond(writer, 200, body)

    async def _watch(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        kind: _Kind,
        namespace: str | None,
        match: Callable[[dict[str, Any]], bool],
        query: dict[str, str],
    ) -> bool:
        rv_param = query.get("resourceVersion", "")
        if rv_param not in ("", "0") and not rv_param.isdigit():
            raise _bad_request(f"invalid resource version: {rv_param!r}")
        timeout_param = query.get("timeoutSeconds", "")
        try:
            timeout = int(timeout_param) if timeout_param else 0
        except ValueError:
            raise _bad_request(f"invalid timeoutSeconds: {timeout_param!r}") from None

        expired: str | None = None
        if self._expire_next:
            self._expire_next = False
            expired = f"too old resource version: {rv_param or 0} ({self._compacted})"
        elif rv_param not in ("", "0") and int(rv_param) < self._compacted:
            expired = f"too old resource version: {rv_param} ({self._compacted})"
        if expired is not None:
            # The watch cache answers an expired resourceVersion inside the stream, with 200 OK.
            await _start_stream(writer)
            await _chunk(writer, {"type": "ERROR", "object": _status(410, "Expired", expired)})
            await _end_stream(writer)
            return True

        watch = _Watch(kind, namespace, match, query.get("allowWatchBookmarks") in _TRUE)
        if rv_param in ("", "0"):
            # No resourceVersion (or "0"): synthetic ADDED events for the current state first.
            for (resource, ns, _), obj in sorted(self._objects.items()):
                if resource == kind.resource and namespace in (None, ns) and match(obj):
                    watch.push({"type": "ADDED", "object": obj})
        else:
            since = int(rv_param)
            for change in self._history:
                if change.rv > since and (event := watch.event_for(change)) is not None:
                    watch.push(event)
        self._watches.add(watch)
        self._watch_changed.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        # A watch answer says `Connection: close` (the real server keeps the connection): the
        # read below notices a client that goes away, and must not eat a next request's bytes.
        eof = asyncio.ensure_future(reader.read(1))
        try:
            await _start_stream(writer, close=True)
            while True:
                while watch.pending:
                    item = watch.pending.popleft()
                    if item is _DROP:
                        writer.transport.abort()
                        return False
                    if item is _END:
                        await _end_stream(writer)
                        return False
                    await _chunk(writer, item)
                watch.waiter = loop.create_future()
                remaining = None if deadline is None else max(0.0, deadline - loop.time())
                done, _ = await asyncio.wait(
                    {watch.waiter, eof}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                watch.waiter = None
                if eof in done:
                    return False  # the client closed the stream (or sent something unexpected)
                if not done:
                    await _end_stream(writer)  # timeoutSeconds: a clean end, as the server does
                    return False
        finally:
            self._watches.discard(watch)
            self._watch_changed.set()
            if not eof.done():
                eof.cancel()
                await asyncio.wait({eof})
            if not eof.cancelled():
                eof.exception()  # retrieved, so a reset connection is not logged

    async def _create(
        self,
        writer: asyncio.StreamWriter,
        kind: _Kind,
        namespace: str,
        query: dict[str, str],
        raw: bytes,
    ) -> bool:
        body = _json_body(raw)
        if not isinstance(body, dict):
            raise _bad_request("the body of the request must be a JSON object")
        if body.get("kind") not in (None, kind.kind) or body.get("apiVersion") not in (None, "v1"):
            raise _bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version (v1) or kind ({body.get('kind')}) is not {kind.kind}"
            )
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise _bad_request("metadata: expected an object")
        if kind.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            name = f"{meta['generateName']}{suffix}"
        if not name:
            raise _invalid(
                kind, "", [("metadata.name", "Required value: name or generateName is required")]
            )
        if (kind.resource, namespace, name) in self._objects:
            raise _ApiError(
                _status(
                    409,
                    "AlreadyExists",
                    f'{kind.resource} "{name}" already exists',
                    {"name": name, "kind": kind.resource},
                )
            )
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
        await _respond(writer, 201, obj)
        return True

    async def _patch(
        self,
        writer: asyncio.StreamWriter,
        kind: _Kind,
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
            raise _ApiError(
                _status(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format ({content_type}) - "
                    "accepted media types include: application/merge-patch+json, "
                    "application/strategic-merge-patch+json",
                )
            )
        current = self._objects.get((kind.resource, namespace, name))
        if current is None:
            raise _not_found(kind, name)
        patch = _json_body(raw)
        if not isinstance(patch, dict):
            raise _bad_request("the patch must be a JSON object")
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
            raise _ApiError(
                _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.resource} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                    {"name": name, "kind": kind.resource},
                )
            )
        obj = merge_patch(current, patch)
        if not isinstance(obj.get("metadata"), dict):
            raise _bad_request("metadata: expected an object")
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
        await _respond(writer, 200, obj)
        return True

    # -- resource.k8s.io (DRA), from the test's side ------------------------------------------

    # The versions of resource.k8s.io served, newest first: ("v1beta1",) plays Kubernetes 1.32.
    dra_versions: tuple[str, ...] = ("v1", "v1beta1")

    def put_dra_object(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a DeviceClass, ResourceClaim or ResourceSlice of either version
        (`apiVersion` says which); returns it as stored (v1)."""
        version = str(document["apiVersion"]).rpartition("/")[2]
        kind = next(k for k in _DRA_KINDS.values() if k.kind == document["kind"])
        obj = _dra_to_v1(kind, dict(document), version)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if kind.namespaced else ""
        current = self._objects.get((kind.resource, namespace, meta["name"]))
        base = (
            current["metadata"] if current else self._new(kind, namespace, meta["name"])["metadata"]
        )
        obj["metadata"] = {**base, **{k: v for k, v in meta.items() if k != "resourceVersion"}}
        try:
            _dra_validate(kind, _dra_from_v1(kind, obj, version), version)
        except _ApiError as e:
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
        if self._commit(_DRA_KINDS[resource], namespace, name, None) is None:
            raise KeyError((resource, namespace, name))

    async def _route_dra(
        self,
        method: str,
        segments: list[str],
        query: dict[str, str],
        headers: dict[str, str],
        raw: bytes,
        writer: asyncio.StreamWriter,
        perms: Permissions | None,
    ) -> bool:
        """/apis/...: discovery and the resource.k8s.io objects."""
        if method == "GET" and (found := _dra_discovery(segments, self.dra_versions)):
            await _respond(writer, 200, found)
            return True
        if (
            len(segments) < 4
            or segments[1] != RESOURCE_GROUP
            or segments[2] not in self.dra_versions
        ):
            return await _page_not_found(writer)
        version, rest = segments[2], segments[3:]
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        kind = _DRA_KINDS.get(rest[0]) if rest else None
        subresource = rest[2] if len(rest) == 3 else None
        if (
            kind is None
            or len(rest) > 3
            or subresource not in (None, "status")
            or (namespace is not None) != kind.namespaced
        ):
            return await _page_not_found(writer)
        name = rest[1] if len(rest) >= 2 else None
        ns = namespace or ""
        if method == "GET":
            verb = "get" if name else "watch" if query.get("watch") in _TRUE else "list"
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
                method, ""
            )
            if verb == "delete" and name is None:
                verb = "deletecollection"
        if verb in ("", "watch") or (verb == "create") != (name is None and method == "POST"):
            raise _ApiError(
                _status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            )
        field_terms = _field_terms(kind, query.get("fieldSelector", ""))
        self._authorize_dra(perms, verb, kind, namespace, name)
        labels = _label_selector(query.get("labelSelector", ""))

        def match(obj: dict[str, Any]) -> bool:
            return labels(obj["metadata"].get("labels") or {}) and all(
                (_field_value(obj, f) == value) == equal for f, equal, value in field_terms
            )

        def selected() -> list[tuple[str, dict[str, Any]]]:
            return [
                (key[2], obj)
                for key, obj in sorted(self._objects.items())
                if key[0] == kind.resource and namespace in (None, key[1]) and match(obj)
            ]

        if verb == "list":
            items = [
                {
                    k: v
                    for k, v in _dra_from_v1(kind, o, version).items()
                    if k not in ("kind", "apiVersion")
                }
                for _, o in selected()
            ]
            await _respond(
                writer,
                200,
                {
                    "kind": f"{kind.kind}List",
                    "apiVersion": _dra_api_version(version),
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                },
            )
            return True
        if verb == "deletecollection":
            gone = [self._commit(kind, ns, n, None) for n, _ in selected()]
            items = [_dra_from_v1(kind, o, version) for o in gone if o is not None]
            await _respond(
                writer,
                200,
                {
                    "kind": f"{kind.kind}List",
                    "apiVersion": _dra_api_version(version),
                    "items": items,
                },
            )
            return True
        current = self._objects.get((kind.resource, ns, name or ""))
        if verb == "get":
            if current is None:
                raise _not_found(kind, name or "")
            await _respond(writer, 200, _dra_from_v1(kind, current, version))
            return True
        if verb == "delete":
            assert name is not None
            gone = self._commit(kind, ns, name, None)
            if gone is None:
                raise _not_found(kind, name)
            await _respond(writer, 200, _dra_from_v1(kind, gone, version))
            return True
        body = _json_body(raw)
        if not isinstance(body, dict):
            raise _bad_request("the body of the request must be a JSON object")
        if verb == "patch":
            if current is None:
                raise _not_found(kind, name or "")
            body = merge_patch(_dra_from_v1(kind, current, version), body)
        return await self._write_dra(writer, kind, version, ns, name, current, body, query)

    async def _write_dra(
        self,
        writer: asyncio.StreamWriter,
        kind: _Kind,
        version: str,
        namespace: str,
        name: str | None,
        current: dict[str, Any] | None,
        body: dict[str, Any],
        query: dict[str, str],
    ) -> bool:
        """create (name None), update or patch: checks, then store."""
        api_version = _dra_api_version(version)
        if body.get("kind") not in (None, kind.kind) or body.get("apiVersion") not in (
            None,
            api_version,
        ):
            raise _bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version ({api_version}) or kind ({body.get('kind')}) is not "
                f"{kind.kind}"
            )
        body = {**body, "kind": kind.kind, "apiVersion": api_version}
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            raise _bad_request("metadata: expected an object")
        if kind.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise _bad_request("the namespace of the object does not match the request's")
        if name is None:  # create
            name = meta.get("name") or ""
            if not name and meta.get("generateName"):
                name = meta["generateName"] + "".join(
                    random.choices("bcdfghjklmnpqrstvwxz2456789", k=5)
                )
            if not name:
                raise _invalid(
                    kind,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                )
            if (kind.resource, namespace, name) in self._objects:
                raise _ApiError(
                    _status(
                        409,
                        "AlreadyExists",
                        f'{kind.resource}.{RESOURCE_GROUP} "{name}" already exists',
                        {"name": name, "kind": kind.resource},
                    )
                )
            base = self._new(kind, namespace, name)["metadata"]
            code = 201
        else:
            if current is None:
                raise _not_found(kind, name)
            wanted = meta.get("resourceVersion")
            if wanted not in (None, "", current["metadata"]["resourceVersion"]):
                raise _ApiError(
                    _status(
                        409,
                        "Conflict",
                        f"Operation cannot be fulfilled on {kind.resource}.{RESOURCE_GROUP} "
                        f'"{name}": the object has been modified; please apply your changes to '
                        "the latest version and try again",
                        {"name": name, "kind": kind.resource},
                    )
                )
            if meta.get("name") not in (None, name):
                raise _bad_request("the name of the object does not match the name on the URL")
            base = {k: v for k, v in current["metadata"].items() if k != "resourceVersion"}
            code = 200
        kept = ("name", "namespace", "uid", "creationTimestamp")
        body["metadata"] = {
            **{k: v for k, v in meta.items() if k not in (*kept, "resourceVersion")},
            **{k: v for k, v in base.items() if k in kept},
        }
        _dra_validate(kind, body, version)
        obj = _dra_to_v1(kind, body, version)
        if query.get("dryRun") != "All":
            stored = self._commit(kind, namespace, name, obj)
            assert stored is not None
            obj = stored
        await _respond(writer, code, _dra_from_v1(kind, obj, version))
        return True

    @staticmethod
    def _authorize_dra(
        perms: Permissions | None, verb: str, kind: _Kind, namespace: str | None, name: str | None
    ) -> None:
        if perms is None or (verb, kind.resource) in perms:
            return
        user = getattr(perms, "user", DEFAULT_USER)
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        reason = (
            f'User "{user}" cannot {verb} resource "{kind.resource}" in API group '
            f'"{RESOURCE_GROUP}" {where}'
        )
        subject = (
            f'{kind.resource}.{RESOURCE_GROUP} "{name}"'
            if name
            else f"{kind.resource}.{RESOURCE_GROUP}"
        )
        details: dict[str, Any] = {"group": RESOURCE_GROUP, "kind": kind.resource}
        if name:
            details = {"name": name, **details}
        raise _ApiError(_status(403, "Forbidden", f"{subject} is forbidden: {reason}", details))


# -- resource.k8s.io (DRA): ResourceSlices, ResourceClaims, DeviceClasses, discovery --------------
#
# Stored in the v1 shape and converted on the way in and out for v1beta1, as kube-apiserver
# converts between the versions it serves: a v1beta1 device wraps its attributes and capacity in
# `basic`, a v1beta1 request names its class and selectors directly instead of under `exactly`.
# Served verbs: get, list (field and label selectors), create, update (PUT, resourceVersion
# checked when given), merge PATCH, delete and deletecollection; no watch. ResourceSlices are
# validated with the API's own limits (422), since a plugin must keep them.

RESOURCE_GROUP = "resource.k8s.io"
DRA_RESOURCES = ("resourceslices", "resourceclaims", "deviceclasses")
_DRA_KINDS = {
    "resourceslices": _Kind(
        "resourceslices", "ResourceSlice", False, ("metadata.name", "spec.nodeName", "spec.driver")
    ),
    "resourceclaims": _Kind("resourceclaims", "ResourceClaim", True, _META_FIELDS),
    "deviceclasses": _Kind("deviceclasses", "DeviceClass", False, ("metadata.name",)),
}
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_C_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"


def _dra_api_version(version: str) -> str:
    return f"{RESOURCE_GROUP}/{version}"


def _dra_to_v1(kind: _Kind, obj: dict[str, Any], version: str) -> dict[str, Any]:
    """An object as a client of `version` sent it, in the stored (v1) shape."""
    obj = copy.deepcopy(obj)
    obj["apiVersion"] = _dra_api_version("v1")
    spec = obj.get("spec")
    if version == "v1beta1" and isinstance(spec, dict):
        if kind.resource == "resourceslices":
            spec["devices"] = [
                {"name": d.get("name"), **(d.get("basic") or {})} if isinstance(d, dict) else d
                for d in spec.get("devices") or []
            ]
        if kind.resource == "resourceclaims":
            devices = spec.get("devices") or {}
            requests = []
            for request in devices.get("requests") or []:
                if isinstance(request, dict) and "deviceClassName" in request:
                    exactly = {k: v for k, v in request.items() if k != "name"}
                    request = {"name": request.get("name"), "exactly": exactly}
                requests.append(request)
            if devices:
                devices["requests"] = requests
    return obj


def _dra_from_v1(kind: _Kind, obj: dict[str, Any], version: str) -> dict[str, Any]:
    """A stored object as a client of `version` reads it."""
    obj = copy.deepcopy(obj)
    obj["apiVersion"] = _dra_api_version(version)
    spec = obj.get("spec")
    if version == "v1beta1" and isinstance(spec, dict):
        if kind.resource == "resourceslices":
            spec["devices"] = [
                {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                for d in spec.get("devices") or []
            ]
        if kind.resource == "resourceclaims":
            for request in (spec.get("devices") or {}).get("requests") or []:
                exactly = request.pop("exactly", None)
                if exactly is not None:
                    request.update(exactly)
    return obj


def _slice_errors(obj: dict[str, Any], version: str) -> list[tuple[str, str]]:
    """The rules of ResourceSlice validation a plugin can break (a subset, same limits)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    errors: list[tuple[str, str]] = []
    driver = spec.get("driver") or ""
    if not driver or len(driver) > 63 or not re.fullmatch(_DNS_SUBDOMAIN, driver):
        errors.append(("spec.driver", f'Invalid value: "{driver}": must be a DNS subdomain'))
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errors.append(("spec.pool.name", "Required value"))
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        errors.append(("spec.pool.generation", "Invalid value: must be >= 0"))
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        errors.append(("spec.pool.resourceSliceCount", "Invalid value: must be > 0"))
    placements = [k for k in ("nodeName", "nodeSelector", "allNodes") if spec.get(k)]
    if len(placements) != 1:
        errors.append(("spec", "Invalid value: exactly one of nodeName, nodeSelector, allNodes"))
    devices = spec.get("devices") or []
    if len(devices) > 128:
        errors.append(("spec.devices", f"Too many: {len(devices)}: must have at most 128 items"))
    names: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        name = device.get("name") or ""
        if len(name) > 63 or not re.fullmatch(_DNS_LABEL, name):
            errors.append((f"{where}.name", f'Invalid value: "{name}": must be a DNS label'))
        if name in names:
            errors.append((f"{where}.name", f'Duplicate value: "{name}"'))
        names.add(name)
        body = device.get("basic") if version == "v1beta1" else device
        if version == "v1beta1" and not isinstance(body, dict):
            errors.append((f"{where}.basic", "Required value"))
            continue
        if version == "v1" and "basic" in device:
            errors.append((f"{where}.basic", "Forbidden: not a field of resource.k8s.io/v1"))
        attributes = body.get("attributes") or {}
        capacity = body.get("capacity") or {}
        if len(attributes) + len(capacity) > 32:
            errors.append((where, "Too many: attributes and capacities: at most 32"))
        for key, value in attributes.items():
            base = key.rpartition("/")[2]
            if len(base) > 32 or not re.fullmatch(_C_IDENTIFIER, base):
                errors.append(
                    (f"{where}.attributes", f'Invalid value: "{key}": not a C identifier')
                )
            kinds = [k for k in ("string", "int", "bool", "version") if k in (value or {})]
            if len(kinds) != 1:
                errors.append((f"{where}.attributes[{key}]", "Invalid value: exactly one value"))
            elif kinds == ["string"] and len(str(value["string"])) > 64:
                errors.append((f"{where}.attributes[{key}].string", "Too long: at most 64"))
        for key, value in capacity.items():
            if not isinstance(value, dict) or "value" not in value:
                errors.append((f"{where}.capacity[{key}]", "Required value: value"))
    return errors


def _dra_validate(kind: _Kind, obj: dict[str, Any], version: str) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise _bad_request("metadata: expected an object")
    _check_string_map(meta.get("labels"), "metadata.labels")
    name = str(meta.get("name", ""))
    errors: list[tuple[str, str]] = []
    if kind.resource == "resourceslices":
        errors = _slice_errors(obj, version)
    elif kind.resource == "deviceclasses":
        for i, selector in enumerate((obj.get("spec") or {}).get("selectors") or []):
            if not ((selector or {}).get("cel") or {}).get("expression"):
                errors.append((f"spec.selectors[{i}].cel.expression", "Required value"))
    if errors:
        raise _invalid(kind, name, errors)


def _dra_discovery(path: list[str], versions: Iterable[str]) -> dict[str, Any] | None:
    """The discovery documents of the group: /apis, /apis/<group>, /apis/<group>/<version>."""
    served = [{"groupVersion": _dra_api_version(v), "version": v} for v in versions]
    group = {
        "name": RESOURCE_GROUP,
        "versions": served,
        "preferredVersion": served[0] if served else {},
    }
    if path == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group] if served else []}
    if path == ["apis", RESOURCE_GROUP] and served:
        return {"kind": "APIGroup", "apiVersion": "v1", **group}
    if len(path) == 3 and path[:2] == ["apis", RESOURCE_GROUP] and path[2] in versions:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": _dra_api_version(path[2]),
            "resources": [
                {"name": k.resource, "namespaced": k.namespaced, "kind": k.kind, "verbs": verbs}
                for k in _DRA_KINDS.values()
            ],
        }
    return None


# -- wire helpers --------------------------------------------------------------------------------


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise _bad_request(f"the request body is not valid JSON: {e}") from None


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        data = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return bytes(data)
            data += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(headers.get("content-length") or 0)
    return await reader.readexactly(length) if length else b""


async def _respond(writer: asyncio.StreamWriter, code: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    writer.write(
        f"HTTP/1.1 {code} {http.HTTPStatus(code).phrase}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()


async def _page_not_found(writer: asyncio.StreamWriter) -> bool:
    data = b"404 page not found\n"
    writer.write(
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    return True


async def _start_stream(writer: asyncio.StreamWriter, *, close: bool = False) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Cache-Control: no-cache, private\r\nTransfer-Encoding: chunked\r\n"
        + (b"Connection: close\r\n" if close else b"")
        + b"\r\n"
    )
    await writer.drain()


async def _chunk(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    data = json.dumps(event).encode() + b"\n"
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _end_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(b"0\r\n\r\n")
    await writer.drain()
