"""Any config the model accepts dumps to YAML and loads back unchanged."""

from __future__ import annotations

from typing import Any

import yaml_fast
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharing_plugin.config.loader import dump_config, parse_config
from sharing_plugin.config.model import Config
from sharing_plugin.errors import ConfigError

UUID = st.uuids().map(str)
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_ALNUM = _LOWER + "0123456789"
# [a-z][a-z0-9]{0,8}(\.[a-z0-9]{1,5})?, built from parts (st.from_regex costs several times more
# per draw).
NAME = st.builds(
    lambda head, tail, suffix: head + tail + suffix,
    st.sampled_from(_LOWER),
    st.text(_ALNUM, max_size=8),
    st.one_of(st.just(""), st.text(_ALNUM, min_size=1, max_size=5).map(lambda s: "." + s)),
)
DEVICE_REF = st.one_of(
    st.integers(0, 15),
    st.integers(0, 15).map(str),
    st.tuples(st.integers(0, 7), st.integers(0, 6)).map(lambda t: f"{t[0]}:{t[1]}"),
    UUID.map(lambda u: f"GPU-{u}"),
    UUID.map(lambda u: f"MIG-{u}"),
    st.tuples(UUID, st.integers(0, 14), st.integers(0, 7)).map(
        lambda t: f"MIG-GPU-{t[0]}/{t[1]}/{t[2]}"
    ),
    st.sampled_from(["NVIDIA A100*", "Tesla T4"]).map(lambda p: {"product": p}),
)
DEVICES = st.one_of(
    st.just("all"),
    st.integers(1, 16),
    st.lists(DEVICE_REF, min_size=1, max_size=4),
)


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping where every field may be left out."""
    return st.fixed_dictionaries({}, optional=fields)


ENTRY = st.fixed_dictionaries(
    {"name": NAME, "replicas": st.integers(1, 60_000)},
    optional={"rename": NAME, "devices": DEVICES},
)
SHARING = st.fixed_dictionaries(
    {"resources": st.lists(ENTRY, min_size=1, max_size=3)},
    optional={
        "renameByDefault": st.booleans(),
        "failRequestsGreaterThanOne": st.booleans(),
    },
)
CONFIG = optional(
    version=st.just("v1"),
    flags=optional(
        migStrategy=st.sampled_from(["none", "single", "mixed"]),
        failOnInitError=st.booleans(),
        nvidiaDriverRoot=st.sampled_from(["/", "/run/nvidia/driver"]),
        gdsEnabled=st.booleans(),
        plugin=optional(
            passDeviceSpecs=st.booleans(),
            deviceListStrategy=st.one_of(
                st.sampled_from(["envvar", "cdi-cri"]),
                st.lists(
                    st.sampled_from(["envvar", "volume-mounts", "cdi-annotations"]),
                    min_size=1,
                    max_size=3,
                ),
            ),
            deviceIDStrategy=st.sampled_from(["uuid", "index"]),
            sharedDevicesAllocationPolicy=st.sampled_from(["distributed", "packed"]),
        ),
        gfd=optional(oneshot=st.booleans(), sleepInterval=st.just("60s")),
    ),
    resources=optional(
        gpus=st.lists(
            st.fixed_dictionaries({"pattern": st.just("*A100*"), "name": NAME}), max_size=2
        ),
        mig=st.lists(st.fixed_dictionaries({"pattern": st.just("1g.*"), "name": NAME}), max_size=2),
    ),
    sharing=st.one_of(
        st.fixed_dictionaries({"timeSlicing": SHARING}),
        st.fixed_dictionaries({"mps": SHARING}),
        st.just({}),
    ),
    health=optional(enabled=st.booleans(), ignoredXids=st.lists(st.integers(0, 200), max_size=4)),
    partitioning=optional(
        mig=st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "devices": DEVICES,
                    "profiles": st.dictionaries(
                        st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "1g.10gb+me"]),
                        st.integers(1, 7),
                        max_size=3,
                    ),
                },
            ),
            max_size=2,
        )
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=CONFIG)
def test_accepted_configs_round_trip(raw: dict[str, Any]) -> None:
    try:
        loaded = parse_config(yaml_fast.dump(raw), file="gen.yaml")
    except ConfigError:
        return  # the generator also produces overlaps and collisions; only accepted ones matter
    dumped = dump_config(loaded.config)
    again = parse_config(yaml_fast.dump(dumped, sort_keys=False), file="dump.yaml")
    assert again.config == loaded.config
    assert dump_config(again.config) == dumped


def test_default_config_dumps_every_section() -> None:
    dumped = dump_config(Config())
    assert set(dumped) == {
        "version",
        "flags",
        "resources",
        "sharing",
        "health",
        "dra",
        "usage",
        "memoryLimits",
    }
    assert parse_config(yaml_fast.dump(dumped), file="d").config == Config()
