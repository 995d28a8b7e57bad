"""`top --cluster` against a real kube-apiserver (tests/realapi.py): two `run` processes stand
for two nodes' plugin pods (Pods written by the admin, their status set to Running with the
plugin's address as pod IP), read through the server's real pod proxy by a ServiceAccount
bound to the usage component's Role `sharing-plugin-top`, as an admin's tool would be.

The server has no kubelet: its pod proxy dials the pod IP itself. It refuses loopback and
link-local pod IPs (its "address not allowed" check), and tests send traffic to loopback only
(or inside a network namespace of their own): so the plugins' pods are read only where
`SHARING_PLUGIN_TEST_POD_IP` names an address the test may listen on and dial (one in a
namespace the run made). Without it every pod here is loopback: the table still lists every
node with why it was not read, `--node` narrows it, and RBAC is what it says.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import realapi
from cli_capture import cli
from kustomize_render import render
from plugin_process import PluginProcess, free_port
from realapi_support import identity
from usage_support import write_node

from sharing_plugin.cli.top_cluster import HEADER

pytestmark = [
    pytest.mark.realtools,
    pytest.mark.kubectl,
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

LABEL = {"app.kubernetes.io/name": "gpu-sharing-plugin"}
SLICED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n"
)


POD_IP_ENV = "SHARING_PLUGIN_TEST_POD_IP"


def pod(name: str, namespace: str, node: str, port: int, labels: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "sharing-plugin",
                        "image": "gpu-sharing-plugin:0.1.0",
                        "ports": [{"name": "metrics", "containerPort": port}],
                    }
                ],
            },
        }
    )


def running_at(api: realapi.RealApi, name: str, namespace: str, ip: str) -> None:
    status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}
    api.kubectl(
        "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip


def top_role(namespace: str) -> dict[str, Any]:
    docs = render(components=["usage"])
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("top")]
    role["metadata"]["namespace"] = namespace
    return role


async def test_one_table_of_every_node_and_why_a_node_did_not_answer(
    real_api: realapi.RealApi, short_dir: Path, tmp_path: Path
) -> None:
    dialable = os.environ.get(POD_IP_ENV)
    ip = dialable or "127.0.0.1"
    namespace = realapi.unique("ns")
    node_a, node_b = realapi.unique("gpu-a"), realapi.unique("gpu-b")
    role = top_role(namespace)
    real_api.kubectl("create", "namespace", namespace)
    real_api.kubectl("apply", "-f", "-", stdin=json.dumps(role))
    real_api.kubectl("create", "serviceaccount", "gpu-admin", "-n", namespace)
    real_api.kubectl("create", "serviceaccount", "default", "-n", namespace)  # no controllers
    real_api.kubectl(
        "create", "rolebinding", "top", "-n", namespace, "--role=sharing-plugin-top",
        f"--serviceaccount={namespace}:gpu-admin",
    )  # fmt: skip
    viewer = identity(real_api, tmp_path, namespace=namespace, account="gpu-admin")

    config = short_dir / "config.yaml"
    config.write_text(SLICED)
    busy = write_node(short_dir / "a.yaml", [{"gpu": 0, "pid": 5, "memory": "3Gi"}], gpus=1)
    idle = write_node(short_dir / "b.yaml", gpus=1)
    ports = free_port(), free_port()
    plugins = [
        PluginProcess(
            [
                "--config",
                str(config),
                "--gpus",
                f"simulated:{node}",
                "--kubelet-dir",
                str(short_dir / name),
                "--metrics-address",
                f"{ip}:{port}",
            ]
        )
        for name, node, port in (("ka", busy, ports[0]), ("kb", idle, ports[1]))
    ]
    for name, node, port in (("plugin-a", node_a, ports[0]), ("plugin-b", node_b, ports[1])):
        real_api.kubectl("apply", "-f", "-", stdin=pod(name, namespace, node, port, LABEL))
        running_at(real_api, name, namespace, ip)
    # A pod the proxy may not dial (loopback), one not running yet, and one not the plugin's.
    real_api.kubectl("apply", "-f", "-", stdin=pod("plugin-c", namespace, "gpu-c", 9400, LABEL))
    running_at(real_api, "plugin-c", namespace, "127.0.0.1")
    real_api.kubectl("apply", "-f", "-", stdin=pod("plugin-d", namespace, "gpu-d", 9400, LABEL))
    real_api.kubectl("apply", "-f", "-", stdin=pod("other", namespace, "gpu-a", 80, {"a": "b"}))

    env = {"KUBECONFIG": str(viewer.kubeconfig)}
    async with plugins[0], plugins[1]:
        for plugin in plugins:
            await plugin.wait_for_line("applied")
        done = await asyncio.to_thread(
            cli, "top", "--cluster", "--once", "--plugin-namespace", namespace,
            "--timeout", "3", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith(f"{2 if dialable else 0} of 4 node(s) answered")
        assert lines[1].split() == " ".join(HEADER).split()
        rows = {line.split()[0]: line for line in lines[2:]}
        assert set(rows) == {node_a, node_b, "gpu-c", "gpu-d"}  # "other" is not the plugin's
        if dialable:
            assert "(pid 5, unattributed)" in rows[node_a] and "3.0/-/-" in rows[node_a]
            assert "0 Tesla T4" in rows[node_b] and "nvidia.com/gpu" in rows[node_b]
        else:
            assert all("address not allowed" in rows[n] for n in (node_a, node_b))
        assert "not read:" in rows["gpu-c"] and "address not allowed" in rows["gpu-c"]
        assert "pod plugin-d is Pending (no pod IP yet)" in rows["gpu-d"]

        one = await asyncio.to_thread(
            cli, "top", "--cluster", "--once", "--plugin-namespace", namespace,
            "--node", node_b, env=env,
        )  # fmt: skip
        assert one.returncode == 0, one.stderr
        assert [line.split()[0] for line in one.stdout.splitlines()[2:]] == [node_b]

        # A plugin that stopped answering costs its row the timeout, never the table.
        await plugins[1].stop()
        if dialable:
            gone = await asyncio.to_thread(
                cli, "top", "--cluster", "--once", "--plugin-namespace", namespace,
                "--timeout", "3", env=env,
            )  # fmt: skip
            assert gone.returncode == 0
            (row_b,) = [line for line in gone.stdout.splitlines() if line.startswith(node_b)]
            assert "not read:" in row_b and "connection refused" in row_b

    # Without the binding the pods cannot even be listed: exit 1, saying so.
    real_api.kubectl("delete", "rolebinding", "top", "-n", namespace)
    refused = await asyncio.to_thread(
        cli, "top", "--cluster", "--once", "--plugin-namespace", namespace, env=env
    )
    assert refused.returncode == 1
    assert "HTTP 403" in refused.stderr and "listing pods" in refused.stderr
