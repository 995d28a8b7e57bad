"""`top --cluster`'s rows from one node's `/status` (the reading is tests/integration's)."""

from __future__ import annotations

from typing import Any

from cli_capture import cli

from sharing_plugin.cli.top_cluster import HEADER, node_rows, table

GIB = 1 << 30


def status() -> dict[str, Any]:
    container = {
        "namespace": "ml", "pod": "train", "container": "main", "resource": "nvidia.com/gpu",
        "replicas": ["GPU-a::0"], "memoryUsed": 3 * GIB, "share": 8 * GIB, "cap": 8 * GIB,
        "utilization": 0.42, "pids": [5], "overShare": False,
    }  # fmt: skip
    return {
        "usage": {
            "gpus": [
                {
                    "index": 0,
                    "product": "Tesla T4",
                    "devices": [
                        {
                            "index": "0",
                            "mig": "",
                            "memoryUsed": 3 * GIB,
                            "memoryTotal": 15 * GIB,
                            "shares": [{"resource": "nvidia.com/gpu", "replicas": 2}],
                            "containers": [container],
                        }
                    ],
                },
                {
                    "index": 1,
                    "product": "Tesla T4",
                    "devices": [
                        {"index": "1", "mig": "", "memoryUsed": 0, "memoryTotal": 15 * GIB}
                    ],
                },
            ],
            "problems": [],
        }
    }


def test_a_row_per_container_and_one_per_unused_device() -> None:
    held, unused = node_rows("gpu-a", status(), namespace=None)
    assert held == (
        "gpu-a",
        "0 Tesla T4",
        "nvidia.com/gpu 1/2",
        "ml/train/main",
        "3.0/8.0/8.0",
        "42%",
    )
    assert unused == ("gpu-a", "1 Tesla T4", "-", "-", "0.0 of 15.0 GiB", "-")
    assert node_rows("gpu-a", status(), namespace="other") == []
    assert node_rows("gpu-a", status(), namespace="ml") == [held]
    lines = table([HEADER, held, unused])
    assert lines[0].split()[:4] == ["NODE", "GPU", "SHARE", "POD"]
    assert len({line.index("ml/") for line in lines if "ml/" in line}) == 1


def test_node_and_namespace_need_cluster_and_timeout_must_be_positive() -> None:
    done = cli("top", "--node", "n1", "--once")
    assert done.returncode == 2 and "--node and --namespace need --cluster" in done.stderr
    bad = cli("top", "--cluster", "--once", "--timeout", "0")
    assert bad.returncode == 2 and "--timeout must be seconds > 0" in bad.stderr


def test_without_credentials_it_says_where_it_looked(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    done = cli("top", "--cluster", "--once", env={})
    assert done.returncode == 1
    assert "no Kubernetes credentials: set KUBECONFIG" in done.stderr
