"""CDI spec files in `--cdi-dir`: written whole or not at all, removed when no longer needed.

Container runtimes (containerd, CRI-O) watch the CDI directories and read every `*.json` and
`*.yaml` file in them; a spec they read half-written would fail the container that needs it.
So a spec is written under a hidden temporary name that no runtime reads (`.<name>.tmp`) and
renamed into place, which is atomic within the directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_MODE = 0o644  # runtimes read specs as root; nothing secret is in them


class CdiSpecDir:
    """The directory the plugin writes its claims' CDI specs into."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def write(self, file_name: str, spec: Mapping[str, Any]) -> Path:
        """Write `spec` as `file_name` (replacing it); the path written."""
        if "/" in file_name or file_name.startswith("."):
            raise ValueError(f"not a spec file name: {file_name!r}")
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / file_name
        temporary = self.path / f".{file_name}.tmp"
        data = json.dumps(spec, indent=2) + "\n"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _MODE)
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, _MODE)  # whatever the umask made of it
        os.replace(temporary, target)
        return target

    def remove(self, file_name: str) -> None:
        """Remove `file_name`; nothing happens when it is already gone."""
        (self.path / file_name).unlink(missing_ok=True)
