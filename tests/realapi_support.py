"""What the tests against the real kube-apiserver share: objects made from the test's side, the
plugin's own identity (a ServiceAccount token, so the audit log tells its requests apart),
waiting on the server's state through a watch of the test's own, and RBAC as the server's
authorizer decided it (from the audit log).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import realapi
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding
from realapi import RealApi, unique

from sharing_plugin.sources.kube import client_from_kubeconfig

GPU = "nvidia.com/gpu"
STATE_LABEL = "nvidia.com/device-plugin.config.state"


@contextlib.asynccontextmanager
async def admin(api: RealApi) -> AsyncIterator[AsyncClient]:
    """A client with the admin's token (system:masters)."""
    client = client_from_kubeconfig(api.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@dataclass(frozen=True)
class Identity:
    """A ServiceAccount the plugin runs as: its kubeconfig and the user the audit log names."""

    kubeconfig: Path
    user: str


def identity(api: RealApi, tmp: Path, *, namespace: str, account: str) -> Identity:
    """A ServiceAccount's token (`kubectl create token`: the TokenRequest API) in a kubeconfig."""
    token = api.kubectl("create", "token", account, "-n", namespace).strip()
    path = api.token_kubeconfig(tmp / f"kubeconfig-{account}", token, namespace=namespace)
    return Identity(path, f"system:serviceaccount:{namespace}:{account}")


async def a_node_and_its_config(
    client: AsyncClient, *, data: Mapping[str, str], config_map: str = "plugin-config"
) -> tuple[str, str]:
    """A namespace with a ServiceAccount `plugin` and the ConfigMap, and a Node, all named for
    this test: (namespace, node)."""
    namespace, node = unique("ns"), unique("node")
    await client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    await client.create(ServiceAccount(metadata=ObjectMeta(name="plugin", namespace=namespace)))
    await client.create(
        ConfigMap(metadata=ObjectMeta(name=config_map, namespace=namespace), data=dict(data))
    )
    await client.create(Node(metadata=ObjectMeta(name=node)))
    return namespace, node


async def bind(client: AsyncClient, namespace: str, account: str, cluster_role: str) -> None:
    await client.create(
        ClusterRoleBinding(
            metadata=ObjectMeta(name=unique("plugin")),
            roleRef=RoleRef(
                apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role
            ),
            subjects=[Subject(kind="ServiceAccount", name=account, namespace=namespace)],
        )
    )


async def observed(
    client: AsyncClient,
    kind: Any,
    done: Callable[[dict[str, Any]], bool],
    *,
    namespace: str | None = None,
    fields: Mapping[str, str] | None = None,
    within: float = 5.0,
) -> dict[str, Any]:
    """The objects of `kind` the selectors pick (by name), once `done(them)` holds: a LIST,
    then a WATCH from its version, so the test waits on the server's own events."""
    async with asyncio.timeout(within):
        listing = client.list(kind, namespace=namespace, fields=dict(fields or {}))
        objects = {o.metadata.name: o async for o in listing}
        if done(objects):
            return objects
        watch = client.watch(
            kind,
            namespace=namespace,
            fields=dict(fields or {}),
            resource_version=listing.resourceVersion,
        )
        async for event, obj in watch:
            if event == "DELETED":
                objects.pop(obj.metadata.name, None)
            else:
                objects[obj.metadata.name] = obj
            if done(objects):
                return objects
    raise AssertionError("unreachable: the watch ended")


def open_watches(api: RealApi, user: str, resource: str, *, after: int) -> int:
    """How many of `user`'s watches on `resource` the server has open, of those begun after
    the first `after` audit events of that user (started and not complete)."""
    started: set[str] = set()
    complete: set[str] = set()
    for event in api.audit(user)[after:]:
        if event.get("verb") != "watch" or event["objectRef"]["resource"] != resource:
            continue
        code = event.get("responseStatus", {}).get("code")
        if event["stage"] == "ResponseStarted" and code == 200:
            started.add(event["auditID"])
        elif event["stage"] in ("ResponseComplete", "Panic"):
            complete.add(event["auditID"])
    return len(started - complete)


async def until(done: Callable[[], bool], *, within: float, what: str) -> None:
    """Wait until `done()` holds: a condition on an outside process's files (the audit log),
    which has no notification of its own, read again every 20 ms."""
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {within:g} s")
        await asyncio.sleep(0.02)


async def until_watching(
    api: RealApi, user: str, resources: tuple[str, ...], *, after: int, within: float
) -> None:
    """Wait until the server holds a watch of `user` open on each of `resources`, begun after
    `after` audit events."""
    await until(
        lambda: all(open_watches(api, user, r, after=after) for r in resources),
        within=within,
        what=f"{user} watching {', '.join(resources)}",
    )


# --- RBAC as the real authorizer decided it ---------------------------------------------------


def deploy_objects() -> contextlib.AbstractContextManager[None]:
    """deploy/ and deploy/dra/ share the ConfigMap kube-system/sharing-plugin-config: one test
    at a time may apply and edit it (the tests using it may run in two processes)."""
    return realapi.held("deploy")


def applied(api: RealApi, docs: list[dict[str, Any]], *, dry_run: bool = False) -> str:
    """`kubectl apply --server-side` of `docs`; what kubectl said."""
    args = ["apply", "--server-side", "--force-conflicts", "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    return api.kubectl(*args, stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))


@dataclass(frozen=True)
class Rule:
    """One verb on one resource, as a rendered Role or ClusterRole grants it to the account."""

    group: str
    verb: str
    resource: str
    namespace: str | None  # None: every namespace (a ClusterRole bound cluster-wide)
    names: frozenset[str] | None  # resourceNames; None: any name

    def allows(self, asked: Asked) -> bool:
        return (
            (self.group, self.verb, self.resource) == (asked.group, asked.verb, asked.resource)
            and self.namespace in (None, asked.namespace)
            and (self.names is None or asked.name in self.names)
        )


@dataclass(frozen=True)
class Asked:
    """What the authorizer was asked, from an audit event (a create names no object)."""

    group: str
    verb: str
    resource: str
    namespace: str | None
    name: str | None

    @classmethod
    def of(cls, event: dict[str, Any]) -> Asked:
        ref = event["objectRef"]
        name = None if event["verb"] == "create" else ref.get("name")
        return cls(
            ref.get("apiGroup", ""), event["verb"], ref["resource"], ref.get("namespace"), name
        )


def rules(docs: list[dict[str, Any]]) -> list[Rule]:
    """What the DaemonSet's ServiceAccount may do, from every binding that names it."""
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    subject = {
        "kind": "ServiceAccount",
        "name": daemonset["spec"]["template"]["spec"]["serviceAccountName"],
        "namespace": daemonset["metadata"]["namespace"],
    }
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d.get("rules", [])
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    found = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if subject not in binding.get("subjects", []):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        for rule in roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]:
            names = frozenset(rule["resourceNames"]) if "resourceNames" in rule else None
            found += [
                Rule(group, verb, resource, where, names)
                for group in rule["apiGroups"]
                for verb in rule["verbs"]
                for resource in rule["resources"]
            ]
    return found


def decided(api: RealApi, user: str, allowed: list[Rule]) -> set[Asked]:
    """Every request of `user` was allowed by the real server, and each rule was needed by
    one; the requests, as the authorizer saw them."""
    events = api.audit(user)
    assert events, f"no request of {user} in the audit log"
    refused = [
        (e["verb"], e["requestURI"], e["responseStatus"])
        for e in events
        if e["annotations"].get("authorization.k8s.io/decision") != "allow"
        or e["responseStatus"]["code"] >= 400
    ]
    assert not refused, f"the real server refused: {refused}"
    # API discovery (no object) is every authenticated user's, not the deployed roles'.
    requests = {Asked.of(e) for e in events if "objectRef" in e}
    for request in requests:  # the rules are disjoint: each request is one rule's doing
        assert sum(r.allows(request) for r in allowed) == 1, request
    unused = [r for r in allowed if not any(r.allows(a) for a in requests)]
    assert not unused, f"rules no request needed: {unused}"
    return requests
