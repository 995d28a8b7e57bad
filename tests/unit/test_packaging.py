"""What a release carries and promises: proved dependency bounds, a complete sdist, the license,
and an image whose inputs are pinned.

A lower bound in pyproject.toml is the pin of constraints/minimum.txt, which `make test-min`
installs and tests against (CI runs it), so each bound is a tested fact. The image installs only
versions that constraints/docker.txt pins. The sdist is built here by the build backend, without
network, and read: from a copy of the tree, since the backend writes its egg-info folder into the
tree it builds from (where a `python -m sharing_plugin` started from the repository root finds
it before the installed metadata) and walks every folder while other test workers write there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
BUILD_REQUIRES = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
MINIMUM = ROOT / "constraints" / "minimum.txt"
DOCKER = ROOT / "constraints" / "docker.txt"


def runtime() -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, PROJECT["dependencies"])}


def pins(path: Path) -> dict[str, Version]:
    """`name==version` per line; `#` starts a comment, as pip reads constraints files."""
    found: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        req = Requirement(text)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{path.name}: {line!r} is not an exact pin"
        found[canonicalize_name(req.name)] = Version(spec.version)
    return found


def lower_bound(req: Requirement) -> Version | None:
    bounds = [Version(s.version) for s in req.specifier if s.operator in (">=", "~=", "==")]
    return max(bounds, default=None)


# --- lower bounds -----------------------------------------------------------------------------


def test_every_runtime_dependency_has_its_lower_bound_pinned_in_the_minimum_constraints() -> None:
    minimum = pins(MINIMUM)
    wrong = []
    for name, req in runtime().items():
        bound = lower_bound(req)
        if bound is None or minimum.get(name) != bound:
            wrong.append(
                f"{name}: pyproject.toml says {req.specifier or 'no bound'}, "
                f"constraints/minimum.txt pins {minimum.get(name)}: declare a lower bound and pin "
                "it there (make test-min proves it)"
            )
    assert wrong == []


def test_minimum_pins_are_inside_the_declared_ranges() -> None:
    minimum = pins(MINIMUM)
    declared = runtime()
    assert {
        n: v for n, v in minimum.items() if n in declared and v not in declared[n].specifier
    } == {}


def test_installed_versions_are_the_expected_pins() -> None:
    """Under `make test-min` (TEST_EXPECT_PINS set): the suite really runs with the minimums."""
    expected = os.environ.get("TEST_EXPECT_PINS")
    if not expected:
        pytest.skip("only under make test-min")
    declared = runtime()
    installed = {n: Version(metadata.version(n)) for n in pins(ROOT / expected) if n in declared}
    assert installed == {n: v for n, v in pins(ROOT / expected).items() if n in declared}


def _generated(pattern: str, regex: str) -> set[Version]:
    files = (ROOT / "sharing_plugin").rglob(pattern)
    return {Version(m[1]) for f in files for m in re.finditer(regex, f.read_text())}


def test_grpc_and_protobuf_bounds_cover_the_committed_generated_code() -> None:
    # Generated modules refuse, at import, a grpcio older than the grpcio-tools that wrote them
    # and a protobuf runtime older than (or of another major than) the protoc that did.
    grpc_needs = _generated("*_pb2_grpc.py", r"GRPC_GENERATED_VERSION = '([0-9.]+)'")
    proto_needs = _generated("*_pb2.py", r"# Protobuf Python Version: ([0-9.]+)")
    assert grpc_needs and proto_needs
    deps = runtime()
    assert lower_bound(deps["grpcio"]) == max(grpc_needs)
    assert lower_bound(deps["protobuf"]) == max(proto_needs)
    (major,) = {v.major for v in proto_needs}
    assert f"{major + 1}" not in deps["protobuf"].specifier
    assert Version(f"{major}.999") in deps["protobuf"].specifier


# --- the image --------------------------------------------------------------------------------


def test_docker_constraints_pin_every_dependency_and_the_build_backend_in_range() -> None:
    docker = pins(DOCKER)
    wanted = {
        **runtime(),
        **{canonicalize_name(r.name): r for r in map(Requirement, BUILD_REQUIRES)},
    }
    missing = sorted(set(wanted) - set(docker))
    outside = {
        n: str(docker[n]) for n, r in wanted.items() if n in docker and docker[n] not in r.specifier
    }
    assert (missing, outside) == ([], {}), "run `make lock` and commit constraints/docker.txt"


def test_docker_constraints_pin_what_the_dependencies_need() -> None:
    # Walked through the installed metadata, where it is of the pinned version (an upstream
    # release that adds a dependency must not turn this red on unchanged code).
    docker = pins(DOCKER)
    env = default_environment() | {"extra": ""}
    seen: set[str] = set()
    todo = list(runtime())
    missing = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name not in docker:
            missing.add(name)
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != docker[name]:
            continue
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(canonicalize_name(req.name))
    assert missing == set(), "run `make lock` and commit constraints/docker.txt"


def dockerfile() -> list[str]:
    lines = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_image_builds_and_installs_only_pinned_versions() -> None:
    lines = dockerfile()
    build_run = next(i for i, line in enumerate(lines) if "pip wheel" in line)
    copy = next(i for i, line in enumerate(lines) if line.startswith("COPY constraints/docker.txt"))
    workdir = next(line.split()[1] for line in lines if line.startswith("WORKDIR "))
    destination = lines[copy].split()[-1]
    assert copy < build_run
    env = " ".join(line for line in lines[:build_run] if line.startswith("ENV "))
    # PIP_CONSTRAINT also reaches the isolated build environment, so the backend is pinned too.
    assert f"PIP_CONSTRAINT={(Path(workdir) / destination).as_posix()}" in env
    install = next(line for line in lines[build_run + 1 :] if "pip install" in line)
    assert "--no-index" in install and "--find-links /wheels" in install
    # The wheel's metadata names its license file: the build stage must have it.
    assert any(line.startswith("COPY ") and "LICENSE" in line.split() for line in lines[:build_run])


def _ignored_by_docker(path: str, patterns: list[str]) -> bool:
    # .dockerignore: the last pattern matching the path or one of its folders decides.
    ignored = False
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        regex = (
            re.escape(glob).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        )
        if any(re.fullmatch(regex, c) for c in candidates):
            ignored = not negated
    return ignored


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [
        source
        for line in dockerfile()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    files = [
        str(p.relative_to(ROOT))
        for source in sources
        for p in ([ROOT / source] if (ROOT / source).is_file() else (ROOT / source).rglob("*.py"))
    ]
    assert files and [f for f in files if _ignored_by_docker(f, patterns)] == []
    assert _ignored_by_docker("tests/conftest.py", patterns)


def test_the_image_base_is_a_release_tag() -> None:
    bases = {line.split()[1] for line in dockerfile() if line.startswith("FROM ")}
    (base,) = bases
    match = re.fullmatch(
        r"python:(\d+)\.(\d+)\.(\d+)-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", base
    )
    assert match, f"{base} is a moving tag"
    assert Version(f"{match[1]}.{match[2]}") in SpecifierSet(PROJECT["requires-python"])
    # constraints/lock.py resolves the pins for the image's Python.
    assert (
        f'"--python-version", "{match[1]}.{match[2]}"'
        in (ROOT / "constraints" / "lock.py").read_text()
    )


# --- the sdist and its metadata ---------------------------------------------------------------


# A checkout's own state, not its sources: left out of the copy, with one stand-in file each, so
# that the sdist is still shown to leave such folders out.
CHECKOUT_STATE = (".git", ".venv", "build", "dist", ".hypothesis", ".mypy_cache", ".ruff_cache")


def copy_of_tree(destination: Path) -> Path:
    """The source tree as it is now, copied file by file; a file that vanishes meanwhile (a
    worker's temporary file) is not part of it."""
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        if here == ROOT:
            dirs[:] = [d for d in dirs if d not in CHECKOUT_STATE and not d.endswith(".egg-info")]
            files = [f for f in files if f not in CHECKOUT_STATE]  # .git of a worktree
        target = destination / here.relative_to(ROOT)
        target.mkdir(exist_ok=True)
        for name in files:
            if here.name == "__pycache__" and not name.endswith(".pyc"):
                continue  # bytecode being written: a temporary name, renamed a moment later
            try:
                shutil.copy2(here / name, target / name)
            except FileNotFoundError:
                continue
    for folder in CHECKOUT_STATE:
        (destination / folder).mkdir()
        (destination / folder / "stand-in").write_text("state of a checkout\n")
    return destination


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], str]:
    """The sdist built from this tree: its file names (without the top folder) and PKG-INFO."""
    out = tmp_path_factory.mktemp("sdist")
    tree = copy_of_tree(tmp_path_factory.mktemp("tree"))
    # The backend pyproject.toml names, called as a build frontend calls it (`python -m build`
    # adds a second process and a dependency check: 0.6 s more CPU, nothing more to read).
    backend = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["build-backend"]
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib, sys; importlib.import_module(sys.argv[1]).build_sdist(sys.argv[2])",
            backend,
            str(out),
        ],
        cwd=tree,
        check=True,
        capture_output=True,
        timeout=50,
    )
    (archive,) = out.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        members = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()]
        top = tar.getmembers()[0].name.split("/", 1)[0]
        info = tar.extractfile(f"{top}/PKG-INFO")
        assert info is not None
        return set(members), info.read().decode()


def _tracked() -> set[str] | None:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=10
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return None  # not a git checkout (an unpacked sdist): the list below still applies
    return {p for p in listed.split("\0") if p and (ROOT / p).is_file()}


NOT_SHIPPED = {".gitignore"}


@pytest.mark.subprocess
def test_the_sdist_carries_every_file_of_the_repository(sdist: tuple[set[str], str]) -> None:
    names, _ = sdist
    expected = {
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "Dockerfile",
        "Makefile",
        "constraints/minimum.txt",
        "constraints/docker.txt",
        "schemas/sharing-config.v1.schema.json",
        "deploy/configmap.yaml",
        "tests/conftest.py",
        "tests/unit/test_packaging.py",
        "docs/contract.md",
        "bench/README.md",
        *(str(p.relative_to(ROOT)) for p in (ROOT / "config" / "examples").glob("*.yaml")),
    }
    tracked = _tracked()
    if tracked is not None:
        expected |= tracked - NOT_SHIPPED
    assert sorted(expected - names) == []


@pytest.mark.subprocess
def test_the_sdist_has_no_build_leftovers(sdist: tuple[set[str], str]) -> None:
    names, _ = sdist
    junk = [
        n
        for n in names
        if "__pycache__" in n
        or n.endswith((".pyc", ".pyo"))
        or n.startswith(tuple(f"{folder}/" for folder in CHECKOUT_STATE))
    ]
    assert junk == []


@pytest.mark.subprocess
def test_the_metadata_names_the_license_classifiers_and_dependencies(
    sdist: tuple[set[str], str],
) -> None:
    _, info = sdist
    fields = [line.split(": ", 1) for line in info.split("\n\n", 1)[0].splitlines() if ": " in line]
    assert ["License-Expression", "Apache-2.0"] in fields
    assert ["License-File", "LICENSE"] in fields
    classifiers = {v for k, v in fields if k == "Classifier"}
    assert classifiers == set(PROJECT["classifiers"])
    requires = {canonicalize_name(Requirement(v).name) for k, v in fields if k == "Requires-Dist"}
    assert set(runtime()) <= requires


def test_the_license_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    for part in (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "2. Grant of Copyright License.",
        "3. Grant of Patent License.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
    ):
        assert part in text
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]


def test_python_classifiers_say_what_requires_python_allows() -> None:
    allowed = SpecifierSet(PROJECT["requires-python"])
    versions = [
        c.rsplit(" :: ", 1)[1]
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert versions and all(Version(v) in allowed for v in versions)
