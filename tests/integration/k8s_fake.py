"""A ConfigMap volume written as kubelet writes it: real files, real symlinks, real swaps.

(The fake API server is the `kube_api` package beside it.)
"""

from __future__ import annotations

import datetime
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path


class ConfigMapVolume:
    """A ConfigMap mounted as kubelet's AtomicWriter lays it out.

    `..<timestamp>/` holds the keys, `..data` points at it, and each key is a symlink
    `<key> -> ..data/<key>`. An update writes a new timestamped directory, points a `..data_tmp`
    symlink at it and renames that over `..data` (the atomic step), then fixes the key symlinks
    and removes the old directory.
    """

    def __init__(self, root: Path, data: Mapping[str, str]) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._serial = 0
        self._current: str | None = None
        self.swapped_at = 0.0  # time.perf_counter() of the last atomic `..data` rename
        self.update(data)

    def _stamp(self) -> str:
        self._serial += 1
        now = datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S")
        return f"..{now}.{os.getpid()}{self._serial:05d}"

    def update(self, data: Mapping[str, str]) -> None:
        stamp = self._stamp()
        new_dir = self.root / stamp
        new_dir.mkdir()
        for key, text in data.items():
            (new_dir / key).write_text(text)
        tmp = self.root / "..data_tmp"
        os.symlink(stamp, tmp)
        self.swapped_at = time.perf_counter()
        os.rename(tmp, self.root / "..data")
        for key in data:
            link = self.root / key
            if not link.is_symlink():
                os.symlink(f"..data/{key}", link)
        for entry in self.root.iterdir():
            if not entry.name.startswith(".") and entry.name not in data:
                entry.unlink()
        if self._current is not None:
            shutil.rmtree(self.root / self._current)
        self._current = stamp
