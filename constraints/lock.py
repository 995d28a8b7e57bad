"""Write constraints/docker.txt: every package the image installs, pinned to one version.

The image's build installs the runtime dependencies of pyproject.toml and the build backend
(for the wheel of this project) with `-c constraints/docker.txt`, so a rebuild of the same
commit gets the same versions. This resolves them as pip would for the image's Python (3.11 on
manylinux, wheels only) and writes the pins; run it through `make lock` when a dependency
changes, and commit the result. Nothing is installed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The image: CPython 3.11 on Debian bookworm (glibc 2.36), so wheels tagged manylinux up to 2.36.
TARGET = ["--python-version", "3.11", "--implementation", "cp", "--only-binary", ":all:"]
TARGET += [arg for abi in ("cp311", "abi3", "none") for arg in ("--abi", abi)]
TARGET += [
    arg
    for tag in ["manylinux2014_x86_64", *(f"manylinux_2_{v}_x86_64" for v in range(17, 37))]
    for arg in ("--platform", tag)
]

HEADER = """\
# Exact versions of everything the image installs: the runtime dependencies of pyproject.toml,
# what they depend on, and the build backend. The Dockerfile builds with
# PIP_CONSTRAINT=constraints/docker.txt. Written by `make lock` (constraints/lock.py); commit
# the result.
"""


def requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [*project["project"]["dependencies"], *project["build-system"]["requires"]]


def resolve(wanted: list[str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "--quiet", "--dry-run"),
                *("--ignore-installed", "--target", tmp, *TARGET, "--report", str(report)),
                *wanted,
            ],
            check=True,
        )
        installs = json.loads(report.read_text())["install"]
    return {_canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    pins = resolve(requirements())
    lines = [f"{name}=={version}\n" for name, version in sorted(pins.items())]
    (ROOT / "constraints" / "docker.txt").write_text(HEADER + "".join(lines))
    print(f"constraints/docker.txt: {len(lines)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
