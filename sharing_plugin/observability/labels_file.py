"""The node labels as a Node Feature Discovery local feature file (`--labels-file`).

NFD's worker reads every file in its `features.d` directory (the DaemonSet mounts it) as
`key=value` lines and turns them into node labels; it skips hidden files. A file caught half
written would drop or garble labels that pods are scheduled on, so the labels are written whole
to a hidden temporary file in the same directory (the same filesystem, so the rename is atomic)
and renamed over the old file: a reader sees the old labels or the new ones, never a part.
Labels that did not change are not written again, so a reload that changes nothing labelled
touches nothing. The file is removed when the plugin stops, so a plugin that is gone leaves no
labels claiming what it no longer advertises.

Small files on a local disk: plain synchronous I/O, a few system calls per change.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sharing_plugin.errors import SharingPluginError
from sharing_plugin.views.labels import render_labels

__all__ = ["LabelsFile", "LabelsFileError"]


class LabelsFileError(SharingPluginError):
    """The feature file could not be written or removed (the OS error is in the message)."""


class LabelsFile:
    """One NFD local feature file, owned by this plugin."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def current(self) -> str | None:
        """The file's text, or None when there is none (or it cannot be read)."""
        try:
            return self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def write(self, labels: Mapping[str, str]) -> bool:
        """Make the file hold `labels`; False when it already did (nothing was written)."""
        text = render_labels(labels)
        if self.current() == text:
            return False
        directory = self.path.parent
        try:
            fd, temporary = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".tmp", dir=directory
            )
        except OSError as exc:
            raise LabelsFileError(f"cannot write labels file {self.path}: {exc}") from exc
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, 0o644)  # mkstemp makes it 0600; NFD may run as another user
            os.replace(temporary, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise LabelsFileError(f"cannot write labels file {self.path}: {exc}") from exc
        _sync_directory(directory)
        return True

    def remove(self) -> bool:
        """Delete the file; False when there was none."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise LabelsFileError(f"cannot remove labels file {self.path}: {exc}") from exc
        _sync_directory(self.path.parent)
        return True


def _sync_directory(directory: Path) -> None:
    """Make the rename or unlink durable: a node that loses power keeps one whole file."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
