"""What the host says about enforcing GPU memory caps: its cgroup hierarchy, the CDI hook.

Read once per plan from the files the plugin sees: `/sys/fs/cgroup` (a cgroup v2 mount has
`cgroup.controllers` at its root; the DaemonSet's container sees the host's kind) and the hook
at `memoryLimits.hookPath` (the DaemonSet mounts the toolkit's directory there).
"""

from __future__ import annotations

import os
from pathlib import Path

from sharing_plugin.plan.caps import NodeFacts

CGROUP_ROOT = Path("/sys/fs/cgroup")


def host_cgroup_version(root: Path = CGROUP_ROOT) -> int | None:
    """2 for a unified (v2) hierarchy, 1 for a v1 one, None where none is mounted."""
    if (root / "cgroup.controllers").exists():
        return 2
    return 1 if root.is_dir() and any(root.iterdir()) else None


def hook_problem(path: str) -> str | None:
    """Why the toolkit's CDI hook cannot run at `path` (None: it can)."""
    hook = Path(path)
    if not hook.exists():
        return (
            f"the CDI hook {path} is not there: install the NVIDIA container toolkit 1.20.1 or "
            "later and mount its directory at memoryLimits.hookPath"
        )
    if not hook.is_file() or not os.access(hook, os.X_OK):
        return f"the CDI hook {path} is not an executable file"
    return None


def node_facts(*, cgroup_version: int | None, hook_path: str) -> NodeFacts:
    """What the node says about enforcing memory caps now (the hook is looked for each time:
    a toolkit installed after the plugin started counts at the next plan)."""
    return NodeFacts(cgroup_version=cgroup_version, hook_problem=hook_problem(hook_path))
