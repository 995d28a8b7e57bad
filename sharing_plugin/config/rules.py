"""Rules between values, checked on a built config; the name a shared entry is advertised under.

A section of the model checks its own fields; these rules compare values with each other: an
entry with itself (an MPS entry sized twice), entries with each other (overlapping device
selections, rename collisions) and sections with each other (MPS with mixed MIG). They read the
built model and return `Issue`s, each at the path inside the config it is about, which the
loader places at their lines beside the field errors. The model never imports them.

A section is checked once its fields are valid and every section inside it keeps its rules, as
the admin reads a config: an entry that is itself wrong is not compared with the others. When
another part of the config has field errors, the sections that are valid are still checked
(`issues_beside`), so that one `validate` reports everything it can.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError

from sharing_plugin.config.base import Issue, Loc, sections_in
from sharing_plugin.config.devices import overlap
from sharing_plugin.config.model import (
    Config,
    Flags,
    Health,
    MigLayout,
    MpsResource,
    MpsSharing,
    Partitioning,
    ReplicatedResource,
    Sharing,
    SharingSection,
)
from sharing_plugin.config.options import resolve_health


def advertised_name(
    entry: ReplicatedResource, sharing: Sharing, *, honour_rename: bool = True
) -> str:
    """The name an entry's replicas are advertised under: its `rename`, else `<name>.shared`
    when its section sets renameByDefault, else its name. The one place this is decided: the
    plan, the rules and the notes must agree on it.

    `honour_rename=False` leaves the entry's own rename out: the name NVIDIA's device plugin
    binary advertises, since it resets explicit renames at start.
    """
    if honour_rename and entry.rename is not None:
        return entry.rename
    return f"{entry.name}.shared" if sharing.rename_by_default else entry.name


def _sized_once(entry: ReplicatedResource) -> Iterator[Issue]:
    given = "replicas" in entry.model_fields_set
    if given and entry.replicas < 1:
        yield Issue(("replicas",), f"must be >= 1 (got {entry.replicas})")
    if given and entry.memory_per_replica is not None:
        yield Issue(
            ("memoryPerReplica",),
            "replicas and memoryPerReplica both size the resource: keep one of them",
        )
    if not given and entry.memory_per_replica is None and isinstance(entry, MpsResource):
        yield Issue(
            (),
            "say how many clients share each GPU: set replicas (e.g. 4), or "
            "memoryPerReplica (e.g. 10Gi) to size them by GPU memory",
        )
    elif not given and entry.memory_per_replica is None:
        yield Issue(
            ("replicas",),
            "required field 'replicas' is missing: set replicas (e.g. 4), or "
            "memoryPerReplica (e.g. 10Gi) to size the replicas by GPU memory",
        )


def _one_mode(sharing: SharingSection) -> Iterator[Issue]:
    if sharing.time_slicing is not None and sharing.mps is not None:
        yield Issue(
            ("mps",),
            "timeSlicing and mps cannot both be set: a GPU is shared one way; "
            "keep one of the two sections",
        )


def _profiles_need_mig(layout: MigLayout) -> Iterator[Issue]:
    if not layout.enabled and layout.profiles:
        yield Issue(("profiles",), "profiles need MIG: remove them or set enabled: true")
    if layout.dynamic and not layout.enabled:
        yield Issue(("dynamic",), "dynamic MIG needs MIG: remove dynamic or set enabled: true")
    elif layout.dynamic and layout.profiles:
        yield Issue(
            ("profiles",),
            "a dynamic entry has no profiles: run-dra creates the instance each claim is "
            "allocated; remove profiles, or dynamic to declare a fixed layout",
        )


def _health(health: Health) -> Iterator[Issue]:
    # A section whose spellings contradict each other is left as written, so the contradictions
    # are still there to be found; a resolved one has none.
    contradictions = resolve_health(health).contradictions
    yield from contradictions
    if not contradictions and health.recovery_check_max_seconds < health.recovery_check_seconds:
        yield Issue(
            ("recoveryCheckMaxSeconds",),
            f"must be >= recoveryCheckSeconds ({health.recovery_check_seconds}); "
            f"got {health.recovery_check_max_seconds}",
        )


def _flags(flags: Flags) -> Iterator[Issue]:
    below = flags.gfd.use_node_feature_api if flags.gfd is not None else None
    if below is not None and below != flags.use_node_feature_api:
        yield Issue(
            ("gfd", "useNodeFeatureAPI"),
            f"contradicts flags.useNodeFeatureAPI ({_yaml(flags.use_node_feature_api)}); "
            "the two say the same thing: keep one",
        )


def _yaml(value: bool | None) -> str:
    return "true" if value else "false"


def _sharing(sharing: Sharing) -> Iterator[Issue]:
    entries = sharing.resources
    for j, later in enumerate(entries):
        for i, earlier in enumerate(entries[:j]):
            if earlier.name != later.name:
                continue
            common = overlap(earlier.devices, later.devices)
            if common is not None:
                yield Issue(
                    ("resources", j, "devices"),
                    f"overlaps resources[{i}] for {later.name} (both select {common}); "
                    "entries for the same resource must select disjoint devices",
                )
    owners: dict[str, tuple[int, str]] = {}
    for j, entry in enumerate(entries):
        name = advertised_name(entry, sharing)
        first = owners.setdefault(name, (j, entry.name))
        if first[1] != entry.name:
            yield Issue(
                ("resources", j, "rename" if entry.rename else "name"),
                f"{name!r} is also advertised for {first[1]} (resources[{first[0]}]); "
                "two resources cannot share one name: pick another rename",
            )


def _partitioning(partitioning: Partitioning) -> Iterator[Issue]:
    layouts = partitioning.mig
    for j, later in enumerate(layouts):
        for i, earlier in enumerate(layouts[:j]):
            common = overlap(earlier.devices, later.devices)
            if common is not None:
                yield Issue(
                    ("mig", j, "devices"),
                    f"overlaps mig[{i}] (both select {common}); each GPU gets one layout",
                )


def _config(config: Config) -> Iterator[Issue]:
    sharing = config.sharing
    if sharing.mps is not None and config.flags.mig_strategy == "mixed":
        yield Issue(
            ("sharing", "mps"),
            "MPS cannot share MIG devices, and migStrategy: mixed advertises them; "
            "use time-slicing, or migStrategy: none or single",
        )
    active = sharing.active
    if active is None:
        return
    section = "mps" if sharing.mps is not None else "timeSlicing"
    shared = {entry.name for entry in active.resources}
    declared = [
        (kind, k, pattern.name)
        for kind in ("gpus", "mig")
        for k, pattern in enumerate(getattr(config.resources, kind))
        if pattern.name not in shared
    ]
    for j, entry in enumerate(active.resources):
        name = advertised_name(entry, active)
        for kind, k, other in declared:
            if other == name and other != entry.name:
                yield Issue(
                    ("sharing", section, "resources", j, "rename" if entry.rename else "name"),
                    f"{name!r} is already advertised for resources.{kind}[{k}]; "
                    "pick another rename",
                )


Rule = Callable[[Any], Iterable[Issue]]

# Each section's rules; the paths of the issues are relative to the section.
_RULES: dict[type[BaseModel], Rule] = {
    ReplicatedResource: _sized_once,
    MpsResource: _sized_once,
    Sharing: _sharing,
    MpsSharing: _sharing,
    SharingSection: _one_mode,
    MigLayout: _profiles_need_mig,
    Partitioning: _partitioning,
    Health: _health,
    Flags: _flags,
    Config: _config,
}


def issues(config: Config) -> list[Issue]:
    """Every broken rule of a built config, each at its path inside the config."""
    return _checked(config, ())


def issues_beside(data: Any, errors: ValidationError) -> list[Issue]:
    """The broken rules of the sections of `data` (a config's raw mapping) that are valid
    although other parts of it have field errors: each such section is built on its own."""
    failed = [tuple(error["loc"]) for error in errors.errors(include_url=False)]
    return _valid_parts(Config, data, (), failed)


def _checked(section: BaseModel, at: Loc) -> list[Issue]:
    found: list[Issue] = []
    for attribute, key, _, many in _parts(type(section)):
        value = getattr(section, attribute)
        if many:
            for i, item in enumerate(value):
                found += _checked(item, (*at, key, i))
        elif value is not None:
            found += _checked(value, (*at, key))
    if found:
        return found  # the section's own rules would compare parts that are wrong themselves
    rule = _RULES.get(type(section))
    return [Issue((*at, *i.loc), i.message) for i in rule(section)] if rule else []


def _valid_parts(kind: type[BaseModel], data: Any, at: Loc, failed: Collection[Loc]) -> list[Issue]:
    if not any(loc[: len(at)] == at for loc in failed):
        section = kind.model_validate(data, by_alias=True, by_name=False)
        return _checked(section, at)
    if not isinstance(data, dict):
        return []
    found: list[Issue] = []
    for _, key, part, many in _parts(kind):
        value = data.get(key)
        if many and isinstance(value, list):
            for i, item in enumerate(value):
                found += _valid_parts(part, item, (*at, key, i), failed)
        elif not many and value is not None:
            found += _valid_parts(part, value, (*at, key), failed)
    return found  # a section with field errors is not built, so its own rules are not checked


@cache
def _parts(kind: type[BaseModel]) -> tuple[tuple[str, str, type[BaseModel], bool], ...]:
    """(attribute, key, section type, whether a list of them) for each field of `kind` that
    holds a section with rules, however deep, in field order."""
    found = []
    for attribute, info in kind.model_fields.items():
        held = list(sections_in(info.annotation))
        if len(held) == 1 and _has_rules(held[0][0]):
            found.append((attribute, info.alias or attribute, *held[0]))
    return tuple(found)


def _has_rules(kind: type[BaseModel]) -> bool:
    return kind in _RULES or bool(_parts(kind))
