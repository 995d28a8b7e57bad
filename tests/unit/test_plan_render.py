"""The plan command's renderings and the config-path locator."""

from __future__ import annotations

from plan_factory import gpu, gpu_uuid, node, time_slicing

from sharing_plugin.cli.render import plan_json, plan_table
from sharing_plugin.config.locate import locate
from sharing_plugin.plan import plan

TEXT = """version: v1
sharing:
  timeSlicing:
    resources:
      - name: gpu
        devices: [0, 7]
        replicas: 2
"""


def test_locate_points_at_the_entry_or_its_closest_written_ancestor() -> None:
    assert locate("sharing.timeSlicing.resources[0].devices[1]", TEXT) == (6, 22)
    assert locate("sharing.timeSlicing.resources[0].rename", TEXT) == (5, 9)
    assert locate("flags.migStrategy", TEXT) is None
    assert locate("version", "{") is None


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
