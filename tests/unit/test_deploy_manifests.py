"""deploy/ and the Dockerfile agree with what `sharing-plugin run` expects (docs/contract.md)."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
import yaml_fast
from kustomize_render import render

from sharing_plugin.cli.run import FLAGS
from sharing_plugin.observability import parse_metrics_address

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONFIGMAP_NAME = "sharing-plugin-config"

# The env var behind each `run` flag (docs/contract.md); NVIDIA_* are read by the NVIDIA
# container runtime; POD_NAMESPACE (downward API) only feeds CONFIG_MAP's `$(POD_NAMESPACE)`.
RUN_ENV_VARS = {env for _, env, _, _ in FLAGS}
EXPANDED_ONLY = {"POD_NAMESPACE"}


def manifests() -> dict[str, list[dict[str, Any]]]:
    """Every YAML file in deploy/ (except the kustomization) -> its documents."""
    found = {}
    for path in sorted(DEPLOY.glob("*.y*ml")):
        if path.name == "kustomization.yaml":
            continue
        with path.open() as f:
            found[path.name] = [doc for doc in yaml_fast.load_all(f) if doc is not None]
    return found


def objects(kind: str) -> list[dict[str, Any]]:
    return [doc for docs in manifests().values() for doc in docs if doc.get("kind") == kind]


def the_daemonset() -> dict[str, Any]:
    (daemonset,) = objects("DaemonSet")
    return daemonset


def the_container() -> dict[str, Any]:
    (container,) = the_daemonset()["spec"]["template"]["spec"]["containers"]
    return container


def env() -> dict[str, Any]:
    return {item["name"]: item for item in the_container()["env"]}


def mount_paths() -> set[PurePosixPath]:
    return {PurePosixPath(m["mountPath"]) for m in the_container()["volumeMounts"]}


def test_every_manifest_is_kubernetes_yaml() -> None:
    found = manifests()
    assert {"daemonset.yaml", "rbac.yaml"} <= set(found)
    for name, docs in found.items():
        assert docs, f"{name} is empty"
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{name}: {doc.get('kind')}"


def test_env_names_are_run_flags_or_nvidia_runtime_settings() -> None:
    unknown = {
        n for n in env() if n not in RUN_ENV_VARS | EXPANDED_ONLY and not n.startswith("NVIDIA_")
    }
    assert not unknown, f"`run` reads no such env var: {sorted(unknown)}"
    assert env()["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env()["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env()["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"


def test_mounts_cover_the_kubelet_sockets_and_the_config() -> None:
    kubelet_dir = PurePosixPath(env()["KUBELET_DIR"]["value"])
    mounts = {m["mountPath"]: m for m in the_container()["volumeMounts"]}
    volumes = {v["name"]: v for v in the_daemonset()["spec"]["template"]["spec"]["volumes"]}
    for sub in ("device-plugins", "pod-resources"):
        path = str(kubelet_dir / sub)
        assert path in mounts, f"nothing mounted at {path}"
        # same path inside and out: kubelet is told socket names relative to its own directory
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    assert not mounts[str(kubelet_dir / "device-plugins")].get("readOnly", False)

    config = env()["CONFIG_FILE"]["value"]
    assert config in mounts, "CONFIG_FILE must be the mounted ConfigMap directory itself"
    assert "subPath" not in mounts[config], "a subPath mount never sees ConfigMap updates"
    assert volumes[mounts[config]["name"]]["configMap"]["name"] == CONFIGMAP_NAME


def test_the_configmap_the_daemonset_mounts_is_shipped() -> None:
    if not (DEPLOY / "configmap.yaml").exists():
        pytest.skip("deploy/configmap.yaml not written yet")
    names = {doc["metadata"]["name"] for doc in objects("ConfigMap")}
    assert CONFIGMAP_NAME in names


def test_probes_and_port_use_the_metrics_address() -> None:
    address = parse_metrics_address(env()["METRICS_ADDRESS"]["value"])
    assert address is not None
    host, port = address
    assert host in ("0.0.0.0", "", "::"), "probes come from kubelet on the node, not localhost"
    container = the_container()
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in named.values()
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert named.get(get["port"], get["port"]) == port


def test_pod_is_node_critical_tolerates_gpu_taints_and_runs_locked_down() -> None:
    pod = the_daemonset()["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    # No RuntimeClass in the base, as in NVIDIA's chart: where none is named nvidia, a pod that
    # asks for one is never started (components/runtime-class-nvidia adds it).
    assert "runtimeClassName" not in pod
    tolerated = {(t["key"], t.get("effect")) for t in pod["tolerations"]}
    assert ("nvidia.com/gpu", "NoSchedule") in tolerated
    assert "CriticalAddonsOnly" in {key for key, _ in tolerated}
    context = the_container()["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "add" not in context["capabilities"]
    assert context["seccompProfile"]["type"] == "RuntimeDefault"
    assert not context.get("privileged", False)
    assert not pod.get("hostNetwork", False)
    assert not pod.get("hostPID", False)


def test_config_map_is_read_through_the_api_with_the_mount_as_fallback() -> None:
    (configmap,) = objects("ConfigMap")
    name, namespace = configmap["metadata"]["name"], configmap["metadata"]["namespace"]
    # CONFIG_MAP is NAMESPACE/NAME with the pod's own namespace from the downward API, so the
    # kustomization's `namespace` moves it along with the ConfigMap.
    assert env()["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    names = list(env())
    assert names.index("POD_NAMESPACE") < names.index("CONFIG_MAP"), "$(VAR) needs VAR first"
    assert env()["CONFIG_MAP"]["value"] == f"$(POD_NAMESPACE)/{name}"
    assert the_daemonset()["metadata"]["namespace"] == namespace
    volumes = {v["name"]: v for v in the_daemonset()["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in the_container()["volumeMounts"]}
    assert volumes[mounts[env()["CONFIG_FILE"]["value"]]]["configMap"]["name"] == name
    assert env()["NODE_STATUS"]["value"] == "on"


def test_rbac_grants_exactly_what_the_code_asks_for() -> None:
    """The rules, written out; tests/integration/test_deploy_rbac.py shows the daemon needs
    every one of them and nothing else, against a fake API server that enforces them."""
    account = the_daemonset()["spec"]["template"]["spec"]["serviceAccountName"]
    (service_account,) = objects("ServiceAccount")
    assert service_account["metadata"]["name"] == account
    subject = {"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}
    (cluster_role,) = objects("ClusterRole")
    # GET its Node, LIST and WATCH it by field selector, PATCH its labels and annotation;
    # create Events in `default` and patch them to bump a repeat's count.
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    (cluster_binding,) = objects("ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert cluster_binding["subjects"] == [subject]
    (role,) = objects("Role")
    (configmap,) = objects("ConfigMap")
    # Only the one ConfigMap, only in its namespace, only get, list and watch.
    assert role["metadata"]["namespace"] == configmap["metadata"]["namespace"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [configmap["metadata"]["name"]],
            "verbs": ["get", "list", "watch"],
        }
    ]
    (binding,) = objects("RoleBinding")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [subject]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml_fast.load((DEPLOY / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = set(manifests())
    assert on_disk <= listed, f"not in kustomization.yaml: {sorted(on_disk - listed)}"
    # configmap.yaml is written separately; everything else listed must exist
    missing = {name for name in listed - on_disk if name != "configmap.yaml"}
    assert not missing, f"kustomization.yaml lists missing files: {sorted(missing)}"
    image = the_container()["image"].split(":")[0]
    assert image in {i["name"] for i in kustomization["images"]}


needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
COMPONENTS = DEPLOY / "components"


def kustomize(root: Path) -> list[dict[str, Any]]:
    return render(root)


def with_components(tmp_path: Path, *names: str) -> list[dict[str, Any]]:
    """The base rendered through an overlay that uses `names` from deploy/components/."""
    return render(DEPLOY, names)


def rendered_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def kubelet_paths(pod: dict[str, Any]) -> dict[str, str]:
    """KUBELET_DIR and every hostPath and mountPath that must follow it."""
    (container,) = pod["containers"]
    found = {"env": next(e["value"] for e in container["env"] if e["name"] == "KUBELET_DIR")}
    for volume in pod["volumes"]:
        if volume["name"] in ("device-plugins", "pod-resources"):
            found[f"host {volume['name']}"] = volume["hostPath"]["path"]
    for mount in container["volumeMounts"]:
        if mount["name"] in ("device-plugins", "pod-resources"):
            found[f"mount {mount['name']}"] = mount["mountPath"]
    return found


@pytest.mark.kubectl
@needs_kubectl
def test_kustomize_builds() -> None:
    docs = kustomize(DEPLOY)
    kinds = [doc["kind"] for doc in docs]
    assert {
        "DaemonSet",
        "ConfigMap",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    } <= set(kinds)
    assert "runtimeClassName" not in rendered_pod(docs)


def test_the_components_are_the_documented_ones() -> None:
    on_disk = {p.name for p in COMPONENTS.iterdir() if p.is_dir()}
    assert on_disk == {
        "runtime-class-nvidia",
        "kubelet-dir-k0s",
        "image",
        "labels",
        "node-labels",
        "no-api",
        "mps",
        "usage",
        "memory-limits",
        "gpu-operator",
        "node-feature",
    }
    for name in on_disk:
        assert (
            yaml_fast.load((COMPONENTS / name / "kustomization.yaml").read_text())["kind"]
            == "Component"
        )
    # the base's comment lists every component an admin can pick
    documented = (DEPLOY / "kustomization.yaml").read_text()
    assert all(f"components/{name}" in documented for name in on_disk)


@pytest.mark.kubectl
@needs_kubectl
def test_usage_component_mounts_the_host_proc_read_only_and_points_proc_root_there(
    tmp_path: Path,
) -> None:
    docs = with_components(tmp_path, "usage")
    pod = rendered_pod(docs)
    (container,) = pod["containers"]
    assert {"name": "PROC_ROOT", "value": "/host/proc"} in container["env"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/host/proc"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert "hostPID" not in pod
    (role,) = [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-pods")
    ]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    base = [d for d in kustomize(DEPLOY) if d["kind"] == "ClusterRole"]
    assert all("pods" not in str(d["rules"]) for d in base)  # only with the component


@pytest.mark.kubectl
@needs_kubectl
def test_memory_limits_component_gives_the_plugin_the_cdi_dir_and_the_hook_at_host_paths(
    tmp_path: Path,
) -> None:
    pod = rendered_pod(with_components(tmp_path, "memory-limits"))
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    hook, cdi = env["NVIDIA_CDI_HOOK_PATH"], env["CDI_DIR"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    # The runtime runs the hook and reads the spec on the host: the plugin sees both where the
    # host has them.
    assert volumes[mounts[hook]["name"]]["hostPath"] == {"path": hook, "type": "File"}
    assert mounts[hook]["readOnly"] is True
    assert volumes[mounts[cdi]["name"]]["hostPath"]["path"] == cdi
    assert not mounts[cdi].get("readOnly", False)


@pytest.mark.kubectl
@needs_kubectl
def test_runtime_class_component(tmp_path: Path) -> None:
    assert rendered_pod(with_components(tmp_path, "runtime-class-nvidia"))["runtimeClassName"] == (
        "nvidia"
    )


@pytest.mark.kubectl
@needs_kubectl
def test_kubelet_dir_component_moves_the_env_and_every_path(tmp_path: Path) -> None:
    base = kubelet_paths(rendered_pod(kustomize(DEPLOY)))
    assert base == {
        "env": "/var/lib/kubelet",
        "host device-plugins": "/var/lib/kubelet/device-plugins",
        "host pod-resources": "/var/lib/kubelet/pod-resources",
        "mount device-plugins": "/var/lib/kubelet/device-plugins",
        "mount pod-resources": "/var/lib/kubelet/pod-resources",
    }
    docs = with_components(tmp_path, "kubelet-dir-k0s")
    moved = kubelet_paths(rendered_pod(docs))
    assert moved == {
        key: value.replace("/var/lib/", "/var/lib/k0s/") for key, value in base.items()
    }
    assert "/var/lib/kubelet" not in yaml.safe_dump(docs)


@pytest.mark.kubectl
@needs_kubectl
def test_image_component(tmp_path: Path) -> None:
    (container,) = rendered_pod(with_components(tmp_path, "image"))["containers"]
    assert container["image"] == "registry.example.com/gpu-sharing-plugin:0.1.0"


def rendered_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = rendered_pod(docs)["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


NFD_FEATURES = "/etc/kubernetes/node-feature-discovery/features.d"


@pytest.mark.kubectl
@needs_kubectl
def test_labels_component_writes_the_nfd_feature_file(tmp_path: Path) -> None:
    docs = with_components(tmp_path, "labels")
    pod = rendered_pod(docs)
    labels_file = PurePosixPath(rendered_env(docs)["LABELS_FILE"])
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (name,) = [n for n, m in mounts.items() if PurePosixPath(m["mountPath"]) == labels_file.parent]
    # NFD's worker reads the host's features.d; the file is written there by temp file + rename,
    # so the directory itself is mounted read-write (the root filesystem stays read-only).
    assert volumes[name]["hostPath"]["path"] == NFD_FEATURES == str(labels_file.parent)
    assert not mounts[name].get("readOnly", False)
    assert "NODE_LABELS" not in rendered_env(docs)


@pytest.mark.kubectl
@needs_kubectl
def test_node_labels_component_turns_node_labels_on(tmp_path: Path) -> None:
    docs = with_components(tmp_path, "node-labels")
    assert rendered_env(docs)["NODE_LABELS"] == "on"
    # The same permissions: node labels use the patch on nodes that node status needs.
    base = {d["kind"]: d for d in kustomize(DEPLOY) if d["kind"] in ("ClusterRole", "Role")}
    assert {d["kind"]: d for d in docs if d["kind"] in ("ClusterRole", "Role")} == base


@pytest.mark.kubectl
@needs_kubectl
def test_no_api_component_reads_the_mounted_copy_only(tmp_path: Path) -> None:
    docs = with_components(tmp_path, "no-api")
    env_ = rendered_env(docs)
    assert "CONFIG_MAP" not in env_ and "POD_NAMESPACE" not in env_
    assert env_["CONFIG_FILE"] == "/etc/sharing-plugin/config"
    assert env_["NODE_STATUS"] == "on"  # the Node is still told what happened
    kinds = sorted(d["kind"] for d in docs)
    assert "Role" not in kinds and "RoleBinding" not in kinds  # no ConfigMap permission
    assert "ClusterRole" in kinds and "ConfigMap" in kinds


@pytest.mark.kubectl
@needs_kubectl
def test_components_combine(tmp_path: Path) -> None:
    docs = with_components(
        tmp_path, "runtime-class-nvidia", "kubelet-dir-k0s", "image", "labels", "node-labels"
    )
    pod = rendered_pod(docs)
    assert pod["runtimeClassName"] == "nvidia"
    assert set(kubelet_paths(pod).values()) == {
        "/var/lib/k0s/kubelet",
        "/var/lib/k0s/kubelet/device-plugins",
        "/var/lib/k0s/kubelet/pod-resources",
    }
    assert pod["containers"][0]["image"].startswith("registry.example.com/")
    assert rendered_env(docs)["NODE_LABELS"] == "on" and "LABELS_FILE" in rendered_env(docs)
    # everything else is the base's: the same objects, the same namespace
    assert sorted(d["kind"] for d in docs) == sorted(d["kind"] for d in kustomize(DEPLOY))


def test_dockerfile_runs_the_daemon_on_the_metrics_port() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms and all(base.startswith("python:3.11") for base in froms)
    (entrypoint,) = [line for line in lines if line.startswith("ENTRYPOINT ")]
    command = json.loads(entrypoint.removeprefix("ENTRYPOINT "))
    assert command == ["sharing-plugin", "run"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts
    address = parse_metrics_address(env()["METRICS_ADDRESS"]["value"])
    assert address is not None
    assert f"EXPOSE {address[1]}" in lines


def test_device_plugin_daemonset_leaves_dra_nodes_to_run_dra() -> None:
    daemonset = yaml_fast.load((ROOT / "deploy" / "daemonset.yaml").read_text())
    affinity = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    excluded = {"key": "gpu.sharing-plugin.io/dra", "operator": "NotIn", "values": ["true"]}
    assert terms and all(excluded in term["matchExpressions"] for term in terms)
