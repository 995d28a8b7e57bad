"""The e2e harness clears every variable `run` reads, so a developer's shell cannot leak in."""

from __future__ import annotations

import pytest
from plugin_process import RUN_ENV_VARS, child_env

from sharing_plugin.cli.run import FLAGS


def test_every_env_var_run_reads_is_cleared_for_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = {env for _, env, _, _ in FLAGS}
    read |= {"KUBECONFIG", "DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS"}
    read |= {"NVIDIA_CDI_HOOK_PATH", "NVIDIA_DRIVER_ROOT"}
    assert read <= set(RUN_ENV_VARS), f"not cleared: {sorted(read - set(RUN_ENV_VARS))}"
    for name in read:
        monkeypatch.setenv(name, "from-the-parent")
    env = child_env({"NODE_STATUS": "off"})
    assert not read & set(env) - {"NODE_STATUS"}
    assert env["NODE_STATUS"] == "off"  # what the test itself passes still reaches the child
