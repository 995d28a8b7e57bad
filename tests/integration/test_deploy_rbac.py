"""deploy/'s RBAC is exactly what the daemon asks the API for, run as the DaemonSet configures it.

The daemon is started with the options the rendered DaemonSet's env gives `run` (downward API
values filled in as kubelet would), against the fake API server with a token that may do only
what the rendered ClusterRole and Role grant its ServiceAccount. It is then taken through what
a node sees: start, an edit through the API, a broken edit reported twice (a repeated event is
patched, not created again). Every request it made must be allowed by the rules, namespace and
resourceNames included, and every rule must be needed by some request: a missing rule and a
rule nothing uses both fail.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml_fast
from daemon_harness import Running, eventually, flat_options, running
from k8s_fake import ConfigMapVolume
from kube_api import FakeKubeApi, Permissions, Request
from kustomize_render import daemonset_env
from kustomize_render import render as kustomize_render
from support.configs import sliced
from support.observe import next_rejected

from sharing_plugin.cli import run as run_command
from sharing_plugin.daemon.run.options import RunOptions
from sharing_plugin.observability.nodestatus import STATE_LABEL
from sharing_plugin.sources.kube import client_from_kubeconfig

pytestmark = pytest.mark.kubectl

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NODE = "gpu-node-1"
TOKEN = "sharing-plugin-token"
GPU = "nvidia.com/gpu"
RUN_ENV = {env for _, env, _, _ in run_command.FLAGS}
has_kubectl = shutil.which("kubectl") is not None


# --- the rendered manifests ------------------------------------------------------------------


def render(tmp_path: Path, components: tuple[str, ...]) -> list[dict[str, Any]]:
    """`kubectl kustomize` of the base with `components`, through an overlay as an admin writes
    one; without kubectl (base only), the manifests as written, which name their namespace."""
    if not has_kubectl:
        if components:
            pytest.skip("kubectl not installed")
        docs: list[dict[str, Any]] = []
        for path in sorted(DEPLOY.glob("*.yaml")):
            if path.name != "kustomization.yaml":
                docs += [d for d in yaml_fast.load_all(path.read_text()) if d is not None]
        return docs
    return kustomize_render(DEPLOY, components)


def the(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


# --- RBAC as kube-apiserver's authorizer reads it --------------------------------------------


@dataclass(frozen=True)
class Grant:
    verb: str
    resource: str
    namespace: str | None  # None: every namespace (a ClusterRole bound cluster-wide)
    names: frozenset[str] | None  # resourceNames; None: any name

    def allows(self, asked: Asked) -> bool:
        return (
            (self.verb, self.resource) == (asked.verb, asked.resource)
            and self.namespace in (None, asked.namespace)
            # A rule with resourceNames allows no request without a name (list, create).
            and (self.names is None or asked.name in self.names)
        )


def grants(docs: list[dict[str, Any]]) -> list[Grant]:
    """What the DaemonSet's ServiceAccount may do, from every binding that names it."""
    daemonset = the(docs, "DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {
        "kind": "ServiceAccount",
        "name": account,
        "namespace": daemonset["metadata"]["namespace"],
    }
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d.get("rules", [])
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    found: list[Grant] = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if subject not in binding.get("subjects", []):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role_ns = where if ref["kind"] == "Role" else None
        for rule in roles[(ref["kind"], role_ns, ref["name"])]:
            assert rule["apiGroups"] == [""], "the plugin only uses the core API group"
            names = frozenset(rule["resourceNames"]) if "resourceNames" in rule else None
            found += [
                Grant(verb, resource, where, names)
                for verb in rule["verbs"]
                for resource in rule["resources"]
            ]
    return found


@dataclass(frozen=True)
class Asked:
    verb: str
    resource: str
    namespace: str | None
    name: str | None


_NAME_SELECTOR = re.compile(r"(?:^|,)metadata\.name=([^,]+)")


def asked(request: Request) -> Asked:
    """The RBAC attributes of one request, as kube-apiserver derives them: a watch or list
    filtered by `metadata.name=X` is authorized as a request for the name X."""
    parts = unquote(request.path).strip("/").split("/")[2:]  # after api/v1
    namespace = None
    if parts[0] == "namespaces" and len(parts) >= 3:
        namespace, parts = parts[1], parts[2:]
    resource, name = parts[0], parts[1] if len(parts) > 1 else None
    if request.method == "GET" and name is None:
        watch = request.query.get("watch") in ("1", "true", "True")
        verb = "watch" if watch else "list"
        found = _NAME_SELECTOR.search(request.query.get("fieldSelector", ""))
        name = found.group(1) if found else None
    else:
        verb = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update"}.get(
            request.method, request.method.lower()
        )
    return Asked(verb, resource, namespace, None if verb == "create" else name)


def not_allowed(requests: list[Request], allowed: list[Grant]) -> set[Asked]:
    return {a for a in map(asked, requests) if not any(g.allows(a) for g in allowed)}


# --- the daemon as the DaemonSet runs it -----------------------------------------------------


def container_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The container's env as kubelet hands it over on NODE."""
    return daemonset_env(docs, node=NODE)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`os.environ` holding `values` and none of `run`'s other variables, then as it was."""
    saved = dict(os.environ)
    for name in RUN_ENV | {"DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS"}:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def options_from(env: dict[str, str], root: Path) -> RunOptions:
    """What `sharing-plugin run` resolves from that env; host paths moved under `root`."""
    env = {k: v for k, v in env.items() if k in RUN_ENV}
    env |= {"KUBELET_DIR": str(root), "METRICS_ADDRESS": "off"}
    if "LABELS_FILE" in env:
        (root / "features.d").mkdir()
        env["LABELS_FILE"] = str(root / "features.d" / Path(env["LABELS_FILE"]).name)
    if "PROC_ROOT" in env:  # the host's /proc, mounted: a tree the test writes cgroups into
        (root / "proc").mkdir()
        env["PROC_ROOT"] = str(root / "proc")
    with environment(env):
        parser = argparse.ArgumentParser()
        run_command.register(parser.add_subparsers())
        return run_command.run_options(parser.parse_args(["run"]))


@dataclass
class Deployed:
    api: FakeKubeApi
    run: Running
    volume: ConfigMapVolume  # the mounted copy (CONFIG_FILE)
    namespace: str
    name: str
    data: dict[str, str]
    from_api: bool  # the DaemonSet reads the ConfigMap through the API (CONFIG_MAP)

    def edit(self, key: str, text: str) -> None:
        """`kubectl apply` of the ConfigMap, as the daemon sees it: through the API, else in
        the mounted copy once kubelet refreshed it (only one of the two, so that each edit is
        one update)."""
        self.data[key] = text
        self.api.put_configmap(self.namespace, self.name, self.data)
        if not self.from_api:
            self.volume.update(self.data)


@contextlib.asynccontextmanager
async def deployed(
    root: Path,
    docs: list[dict[str, Any]],
    permissions: Permissions,
    gpus: str = "simulated:dgx-a100-80gb",
) -> AsyncIterator[Deployed]:
    """The daemon with the options the DaemonSet's env gives `run`, and the ConfigMap's data
    both in the API and mounted."""
    configmap = the(docs, "ConfigMap")
    namespace, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
    options = options_from(container_env(docs), root)
    assert options.source.node_name == NODE and options.source.config_path is not None
    volume = ConfigMapVolume(root / "config", configmap["data"])
    kept = {
        key: value
        for key, value in flat_options(options).items()
        if key not in ("config_path", "gpus", "kubelet_dir", "drain_recheck_s")
    }
    async with FakeKubeApi(tokens={TOKEN: permissions}) as api:
        api.put_node(NODE, {})
        api.put_configmap(namespace, name, configmap["data"])
        client = client_from_kubeconfig(api.kubeconfig(root / "kubeconfig", token=TOKEN))
        try:
            async with running(
                root,
                None,
                gpus=gpus,
                config_path=volume.root,
                kube_client=client,
                **kept,
            ) as run:
                data = dict(configmap["data"])
                from_api = options.source.config_map == (namespace, name)
                yield Deployed(api, run, volume, namespace, name, data, from_api)
        finally:
            await client.close()


async def a_node_s_life(node: Deployed) -> None:
    """Start, an edit, a broken edit, the same broken edit read again (SIGHUP)."""
    run, api = node.run, node.api
    reporter = run.daemon.pipeline.reports.node.reporter
    assert reporter is not None
    assert run.capacity() == {GPU: 8}  # deploy/configmap.yaml's default: whole GPUs
    node.edit("default", sliced(2))
    await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 16, timeout=10)
    with run.daemon.pipeline.outcomes() as outcomes:
        node.edit("default", sliced(0))
        await next_rejected(outcomes)
        assert run.capacity() == {GPU: 16}  # the last good config keeps serving
        run.daemon.request_reload()
        await next_rejected(outcomes)
    # The same rejection again: its event is patched (a count bump), granted or not.
    await eventually(
        lambda: any(r.method == "PATCH" and "/events/" in r.path for r in api.requests)
    )
    await reporter.flush()


COMPONENTS = {
    "base": (),
    "node-labels": ("node-labels",),
    "no-api": ("no-api",),
    "labels": ("labels",),
}


@pytest.mark.parametrize("install", list(COMPONENTS))
async def test_rbac_is_exactly_what_the_daemon_asks_for(
    install: str, short_dir: Path, tmp_path: Path
) -> None:
    docs = render(tmp_path, COMPONENTS[install])
    allowed = grants(docs)
    permissions = Permissions({(g.verb, g.resource) for g in allowed})
    async with deployed(short_dir, docs, permissions) as node:
        await a_node_s_life(node)
    api = node.api
    refused = not_allowed(api.requests, allowed)
    assert not refused, f"the code asks for what the RBAC in deploy/ does not grant: {refused}"
    # Every rule is needed: without it some request the daemon made would be refused.
    unused = [g for g in allowed if not not_allowed(api.requests, [h for h in allowed if h != g])]
    assert not unused, f"RBAC in deploy/ grants what the code never asks for: {unused}"

    # And the daemon did what the grants are for.
    metadata = api.node(NODE)["metadata"]
    assert metadata["labels"][STATE_LABEL] == "failed"  # node status: the broken edit
    events = api.events("default")
    assert [(e["reason"], e.get("count", 1)) for e in events] == [
        ("ConfigApplied", 1),
        ("ConfigApplied", 1),
        ("ConfigRejected", 2),  # the repeat patched onto the first
    ]
    from_api = install != "no-api"
    assert node.from_api == from_api
    configmaps = {a.verb for a in map(asked, api.requests) if a.resource == "configmaps"}
    assert configmaps == ({"get", "list", "watch"} if from_api else set())
    assert events[-1]["message"].startswith(
        f"{node.namespace}/{node.name}[default]:" if from_api else str(node.volume.root)
    )
    published = {k for k in metadata["labels"] if k.startswith("nvidia.com/gpu.")}
    assert bool(published) == (install == "node-labels")


async def test_the_usage_component_grants_exactly_what_naming_gpu_processes_needs(
    short_dir: Path, tmp_path: Path
) -> None:
    """A GPU process in a pod's cgroup: the pods on the node are listed and watched, and a pod
    over its share gets its GpuShareExceeded event (in its namespace) with the base's grant."""
    docs = render(tmp_path, ("usage",))
    allowed = grants(docs)
    permissions = Permissions({(g.verb, g.resource) for g in allowed})
    gpus = [{"product": "NVIDIA A100-SXM4-80GB", "count": 8}]
    node_file = tmp_path / "node.yaml"
    node_file.write_text(yaml_fast.dump({"gpus": gpus}))
    async with deployed(short_dir, docs, permissions, gpus=f"simulated:{node_file}") as node:
        await a_node_s_life(node)
        run, api = node.run, node.api
        assert run.daemon.options.proc_root == short_dir / "proc"
        node.edit("default", sliced(2) + "usage:\n  overShareSeconds: 0\n")
        await eventually(lambda: run.daemon.status.last_error is None)
        container = "f" * 64
        pod = api.put_pod(
            "ml", "greedy", node=NODE, containers={"main": f"containerd://{container}"}
        )
        uid = pod["metadata"]["uid"].replace("-", "_")
        (short_dir / "proc" / "4242").mkdir()
        (short_dir / "proc" / "4242" / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{container}.scope\n"
        )
        held = await run.kubelet.admit_pod("greedy", "ml", containers={"main": {GPU: 1}})
        (replica,) = held.device_ids("main", GPU)
        index = next(g.index for g in run.nvml.gpus if replica.startswith(g.uuid))
        tmp = node_file.with_name("node.tmp")
        tmp.write_text(
            yaml_fast.dump(
                {"gpus": gpus, "processes": [{"gpu": index, "pid": 4242, "memory": "50Gi"}]}
            )
        )
        tmp.replace(node_file)
        await eventually(
            lambda: any(e["reason"] == "GpuShareExceeded" for e in api.events("ml")), within=10
        )
        await run.daemon.pipeline.reports.node.reporter.flush()  # type: ignore[union-attr]
    refused = not_allowed(api.requests, allowed)
    assert not refused, f"the code asks for what the RBAC in deploy/ does not grant: {refused}"
    unused = [g for g in allowed if not not_allowed(api.requests, [h for h in allowed if h != g])]
    assert not unused, f"RBAC in deploy/ grants what the code never asks for: {unused}"
    pods = {(a.verb, a.namespace) for a in map(asked, api.requests) if a.resource == "pods"}
    assert pods == {("list", None), ("watch", None)}


async def test_a_missing_rule_is_found(short_dir: Path, tmp_path: Path) -> None:
    """Without `patch` on events, the repeated ConfigRejected is refused, and said so."""
    docs = render(tmp_path, ())
    allowed = [g for g in grants(docs) if (g.verb, g.resource) != ("patch", "events")]
    permissions = Permissions({(g.verb, g.resource) for g in allowed})
    async with deployed(short_dir, docs, permissions) as node:
        await a_node_s_life(node)
    assert not_allowed(node.api.requests, allowed) == {
        Asked("patch", "events", "default", node.api.events("default")[-1]["metadata"]["name"])
    }
