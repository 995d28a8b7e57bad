"""The plan command's renderings, and a plan problem placed at its config entry's line."""

from __future__ import annotations

from plan_factory import gpu, gpu_uuid, node, time_slicing

from sharing_plugin.cli.render import plan_json, plan_table
from sharing_plugin.config.loader import parse_config, parse_configs
from sharing_plugin.errors import Problem
from sharing_plugin.plan import plan

TEXT = """version: v1
sharing:
  timeSlicing:
    resources:
      - name: gpu
        devices: [0, 7]
        replicas: 2
"""


def test_a_problem_is_placed_at_its_entry_or_its_closest_written_ancestor() -> None:
    loaded = parse_config(TEXT, file="c.yaml")

    def placed(path: str) -> str:
        return str(loaded.place(Problem(path, "no")))

    assert placed("sharing.timeSlicing.resources[0].devices[1]") == (
        "c.yaml:6:22: sharing.timeSlicing.resources[0].devices[1]: no"
    )
    assert placed("sharing.timeSlicing.resources[0].rename") == (
        "c.yaml:5:9: sharing.timeSlicing.resources[0].rename: no"
    )
    assert placed("flags.migStrategy") == "c.yaml: flags.migStrategy: no"
    # Already placed: as it is.
    assert loaded.place(Problem("x", "y", file="other", line=1)) == Problem(
        "x", "y", file="other", line=1
    )


def test_a_problem_of_a_configmap_key_is_placed_at_the_manifests_line() -> None:
    indented = "".join(f"    {line}\n" for line in TEXT.splitlines())
    manifest = f"apiVersion: v1\nkind: ConfigMap\ndata:\n  small: |\n{indented}"
    loaded = parse_configs(manifest, file="cm.yaml")["small"]
    problem = Problem("sharing.timeSlicing.resources[0].devices[1]", "no")
    assert str(loaded.place(problem)) == (
        "cm.yaml:10:26: data.small: sharing.timeSlicing.resources[0].devices[1]: no"
    )


def test_json_contract_and_table() -> None:
    cfg = time_slicing({"name": "gpu", "devices": [1], "replicas": 2}, renameByDefault=True)
    p = plan(cfg, node(gpu(0, numa=None), gpu(1)))
    doc = plan_json(p, config_name="x", warnings=["from discovery"])
    assert doc["config"] == {"name": "x"}
    assert doc["mig"] == [] and doc["warnings"][0] == "from discovery"
    first = doc["resources"][0]
    assert first["name"] == "nvidia.com/gpu" and first["sharing"] == "none"
    assert first["devices"][0] == {
        "id": gpu_uuid(0),
        "physical": gpu_uuid(0),
        "health": "Healthy",
        "numa": None,
        "index": "0",
        "replica": None,
    }
    shared = doc["resources"][1]
    assert [d["id"] for d in shared["devices"]] == [f"{gpu_uuid(1)}::0", f"{gpu_uuid(1)}::1"]
    assert shared["perDevice"][0]["replicas"] == 2
    table = plan_table(p, config_name="x", warnings=["from discovery"])
    assert "nvidia.com/gpu.shared  " in table and "time-slicing" in table
    assert "  - from discovery" in table
    assert "GPU 1" in table and "2/2 healthy" in table
