"""Config texts many tests write, spelled once."""

from __future__ import annotations


def sliced(replicas: int, *, rename: bool | None = None) -> str:
    """A config sharing every GPU as `nvidia.com/gpu` by time-slicing into `replicas`, with
    `renameByDefault` written out when `rename` is given. Tests read error positions in it
    (`replicas` on line 6, or 7 with `rename`): keep its lines."""
    renamed = "" if rename is None else f"    renameByDefault: {'true' if rename else 'false'}\n"
    return (
        f"version: v1\nsharing:\n  timeSlicing:\n{renamed}    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )
