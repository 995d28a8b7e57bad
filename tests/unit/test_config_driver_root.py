"""`NVIDIA_DRIVER_ROOT` is the driver root of a config that names none, as in the reference."""

from __future__ import annotations

from plan_factory import config

from sharing_plugin.config.options import with_driver_root

OPERATOR = "/run/nvidia/driver"


def test_a_config_naming_no_root_takes_the_nodes_and_its_device_nodes_follow() -> None:
    flags = with_driver_root(config().flags, OPERATOR)
    assert (flags.nvidia_driver_root, flags.nvidia_dev_root) == (OPERATOR, OPERATOR)


def test_a_config_naming_its_roots_keeps_them() -> None:
    own = config(flags={"nvidiaDriverRoot": "/opt/driver"}).flags
    assert with_driver_root(own, OPERATOR) is own
    dev = with_driver_root(config(flags={"nvidiaDevRoot": "/"}).flags, OPERATOR)
    assert (dev.nvidia_driver_root, dev.nvidia_dev_root) == (OPERATOR, "/")


def test_no_root_given_changes_nothing() -> None:
    flags = config().flags
    assert with_driver_root(flags, None) is flags and with_driver_root(flags, "") is flags
