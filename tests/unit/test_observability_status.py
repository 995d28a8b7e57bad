"""StatusBoard: the /status document (docs/contract.md) and readiness."""

from __future__ import annotations

import datetime as dt
import json

from sharing_plugin.mig.state import GpuMigState, MigState
from sharing_plugin.observability import StatusBoard
from sharing_plugin.observability.status import rfc3339

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


def test_empty_board_has_the_documented_shape_and_is_not_ready() -> None:
    board = StatusBoard()
    doc = board.to_json()
    assert doc["config"] == {"name": None, "hash": None, "generation": 0, "loadedAt": None}
    assert doc["lastError"] is None
    assert doc["resources"] == {}
    assert doc["mig"] == {}
    assert board.readiness() == (False, "no config loaded yet")
    json.dumps(doc)  # serialisable as is


def test_full_document_matches_the_contract() -> None:
    board = StatusBoard()
    loaded = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    assert board.set_config(name="a100", hash="sha256:ab12", loaded_at=loaded) == 1
    board.set_resource(SHARED, devices=40, healthy=38, draining=["GPU-b::3", "GPU-a::9"])
    board.set_registered(SHARED, True)
    board.set_mig_states(
        {
            "GPU-a": GpuMigState(MigState.PENDING, "MIG-x is held by default/pod-1"),
            "GPU-b": GpuMigState(MigState.APPLIED),
        }
    )
    doc = board.to_json()
    assert doc["config"] == {
        "name": "a100",
        "hash": "sha256:ab12",
        "generation": 1,
        "loadedAt": "2024-05-01T12:00:00.123Z",
    }
    assert doc["resources"] == {
        SHARED: {
            "devices": 40,
            "healthy": 38,
            "draining": ["GPU-a::9", "GPU-b::3"],
            "registered": True,
        }
    }
    assert doc["mig"] == {
        "GPU-a": {"state": "pending", "reason": "MIG-x is held by default/pod-1"},
        "GPU-b": {"state": "applied", "reason": None},
    }
    assert doc["ready"] is True


def test_ready_only_when_every_resource_is_registered() -> None:
    board = StatusBoard()
    board.set_resource(GPU, devices=8, healthy=8)
    board.set_config(name=None, hash="h1")
    ready, reason = board.readiness()
    assert not ready
    assert reason == f"not registered with kubelet: {GPU}"
    board.set_registered(GPU, True)
    board.set_resource(SHARED, devices=4, healthy=4)
    assert not board.ready
    board.set_registered(SHARED, True)
    assert board.ready
    # kubelet restarted: re-registration pending again
    board.set_registered(GPU, False)
    assert not board.ready
    board.set_registered(GPU, True)
    # a push keeps the registration flag unless told otherwise
    board.set_resource(GPU, devices=7, healthy=7)
    assert board.ready
    board.remove_resource(SHARED)
    assert list(board.resources) == [GPU]
    assert board.ready


def test_last_error_shown_until_a_good_config_arrives() -> None:
    board = StatusBoard()
    board.set_config(name="x", hash="h1")
    err = "/etc/sharing-plugin/config/x:3:7: sharing.timeSlicing.resources[0].replicas: bad"
    board.set_error(err)
    assert board.to_json()["lastError"] == err
    assert board.to_json()["config"]["generation"] == 1  # the old config still serves
    assert board.set_config(name="x", hash="h2") == 2
    assert board.to_json()["lastError"] is None
    assert board.set_config(name="x", hash="h3", generation=10) == 10


def test_resources_property_is_a_copy() -> None:
    board = StatusBoard()
    board.set_resource(GPU, devices=1, healthy=1, draining=["a"])
    board.resources[GPU].draining.append("b")
    assert board.resources[GPU].draining == ["a"]


def test_mig_states_replace_the_previous_ones() -> None:
    board = StatusBoard()
    board.set_mig_states(
        {
            "GPU-a": GpuMigState(MigState.ERROR, "NVML_ERROR_NO_PERMISSION"),
            "GPU-b": GpuMigState(MigState.PENDING, "held"),
        }
    )
    board.set_mig_states({"GPU-b": GpuMigState(MigState.APPLIED)})
    assert board.to_json()["mig"] == {"GPU-b": {"state": "applied", "reason": None}}
    board.set_mig_states({})  # no GPU has a declared layout any more
    assert board.to_json()["mig"] == {}


def test_rfc3339_converts_to_utc() -> None:
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert rfc3339(dt.datetime(2024, 1, 1, 2, 0, tzinfo=plus2)) == "2024-01-01T00:00:00.000Z"
