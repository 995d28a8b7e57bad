"""What the wheel carries: the product, and nothing only the tests need.

The wheel is built by the declared build backend from a copy of the package and the files its
metadata names, in a temporary directory (a build in the source tree would leave `build/` and
egg-info behind). Its file list is read, then it is unpacked and every module of it imported
by a fresh interpreter that finds the package there only: a product module importing something
the wheel does not ship fails here, not on a node.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# What the build reads besides the package: pyproject.toml names the readme and license files.
BUILD_INPUTS = ("pyproject.toml", "MANIFEST.in", PYPROJECT["project"]["readme"])

# The simulators `--gpus simulated:` and `demo` run; every other stand-in lives in tests/.
SHIPPED_SIMULATORS = {"nvml", "kubelet"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree, outside it."""
    source = tmp_path_factory.mktemp("wheel-source")
    shutil.copytree(
        ROOT / "sharing_plugin",
        source / "sharing_plugin",
        ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"),
    )
    for name in (*BUILD_INPUTS, *PYPROJECT["project"]["license-files"]):
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    backend = PYPROJECT["build-system"]["build-backend"]
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib, sys; importlib.import_module(sys.argv[1]).build_wheel(sys.argv[2])",
            backend,
            str(out),
        ],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=50,
    )
    (built,) = out.glob("*.whl")
    return built


def names(wheel: Path) -> list[PurePosixPath]:
    with zipfile.ZipFile(wheel) as archive:
        return [PurePosixPath(n) for n in archive.namelist() if not n.endswith("/")]


def test_the_wheel_ships_the_package_and_its_metadata_only(wheel: Path) -> None:
    tops = {n.parts[0] for n in names(wheel)}
    version = PYPROJECT["project"]["version"]
    assert tops == {"sharing_plugin", f"gpu_sharing_plugin-{version}.dist-info"}


def test_the_only_simulators_in_the_wheel_are_those_the_commands_run(wheel: Path) -> None:
    sim = [
        n.relative_to("sharing_plugin/sim")
        for n in names(wheel)
        if n.is_relative_to("sharing_plugin/sim")
    ]
    assert {n.parts[0] for n in sim if len(n.parts) > 1} == SHIPPED_SIMULATORS
    assert {str(n) for n in sim if len(n.parts) == 1} == {"__init__.py"}


def test_the_wheel_carries_the_data_the_commands_read(wheel: Path) -> None:
    listed = {str(n) for n in names(wheel)}
    presets = {p.name for p in (ROOT / "sharing_plugin/sim/nvml/presets").glob("*.yaml")}
    assert presets
    assert {f"sharing_plugin/sim/nvml/presets/{p}" for p in presets} <= listed
    for name in ("sharing_plugin/py.typed", "sharing_plugin/cli/demo-config.yaml"):
        assert name in listed
    protos = {str(p.relative_to(ROOT)) for p in (ROOT / "sharing_plugin").rglob("*.proto")}
    assert protos and protos <= listed


def test_every_module_of_the_wheel_imports_from_the_wheel_alone(
    wheel: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
    modules = sorted(
        ".".join(n.with_suffix("").parts).removesuffix(".__init__")
        for n in names(wheel)
        if n.suffix == ".py" and n.parts[0] == "sharing_plugin" and n.name != "__main__.py"
    )
    script = (
        "import importlib, json, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.__file__ for n, m in sys.modules.items()"
        " if n.split('.')[0] == 'sharing_plugin'})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *modules],
        # The unpacked wheel comes first on the path, ahead of the editable install's finder.
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert len(loaded) == len(modules)
    assert [f for f in loaded if not Path(f).is_relative_to(tmp_path)] == []
