"""The NFD local feature file on a real filesystem: whole or absent, never part written."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sharing_plugin.observability.labels_file import LabelsFile, LabelsFileError
from sharing_plugin.views.labels import render_labels


def _big(n: int, value: str) -> dict[str, str]:
    # Large enough that a plain rewrite would be seen half done by a concurrent reader.
    return {f"nvidia.com/mig-{i}g.{value}.count": value * 40 for i in range(n)}


def test_writes_sorted_key_value_lines(tmp_path: Path) -> None:
    file = LabelsFile(tmp_path / "sharing-plugin")
    assert file.write({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "8"})
    assert file.path.read_text() == "nvidia.com/gpu.count=8\nnvidia.com/gpu.replicas=4\n"
    assert file.path.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["sharing-plugin"]  # no temporary file left behind


def test_unchanged_labels_are_not_rewritten(tmp_path: Path) -> None:
    file = LabelsFile(tmp_path / "sharing-plugin")
    assert file.write({"nvidia.com/gpu.count": "8"})
    before = file.path.stat()
    assert not file.write({"nvidia.com/gpu.count": "8"})
    after = file.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert file.write({"nvidia.com/gpu.count": "4"})
    assert file.path.stat().st_ino != before.st_ino  # replaced by rename, not edited in place


def test_a_file_changed_or_removed_behind_its_back_is_written_again(tmp_path: Path) -> None:
    file = LabelsFile(tmp_path / "sharing-plugin")
    file.write({"nvidia.com/gpu.count": "8"})
    file.path.write_text("garbage\n")
    assert file.write({"nvidia.com/gpu.count": "8"})
    file.path.unlink()
    assert file.write({"nvidia.com/gpu.count": "8"})
    assert file.current() == "nvidia.com/gpu.count=8\n"


def test_a_concurrent_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    file = LabelsFile(tmp_path / "sharing-plugin")
    versions = [_big(400, "a"), _big(400, "b"), _big(10, "c")]
    texts = {render_labels(v) for v in versions}
    file.write(versions[0])
    seen: set[str] = set()
    bad: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            text = file.path.read_text()  # the path exists throughout: rename replaces it
            seen.add(text)
            if text not in texts:
                bad.append(text[:80])
            # NFD skips hidden files; every other file in the directory is ours, whole.
            for name in os.listdir(tmp_path):
                assert name == "sharing-plugin" or name.startswith(".sharing-plugin.")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(90):  # each write is a rename over the file the reader keeps opening
            file.write(versions[i % len(versions)])
    finally:
        done.set()
        reader.join(10)
    assert not bad, f"partial file seen: {bad[:3]}"
    assert len(seen) > 1  # the reader did see the file change
    assert os.listdir(tmp_path) == ["sharing-plugin"]


def test_remove_deletes_the_file_once(tmp_path: Path) -> None:
    file = LabelsFile(tmp_path / "sharing-plugin")
    file.write({"nvidia.com/gpu.count": "8"})
    assert file.remove()
    assert not file.path.exists()
    assert not file.remove()
    assert file.current() is None


def test_an_unwritable_place_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    missing = LabelsFile(tmp_path / "no-such-dir" / "sharing-plugin")
    with pytest.raises(LabelsFileError, match=r"cannot write labels file .*no-such-dir"):
        missing.write({"nvidia.com/gpu.count": "8"})
    directory = tmp_path / "features.d"
    directory.mkdir()
    (directory / "sharing-plugin").mkdir()  # a directory where the file should be
    blocked = LabelsFile(directory / "sharing-plugin")
    with pytest.raises(LabelsFileError, match="cannot write labels file"):
        blocked.write({"nvidia.com/gpu.count": "8"})
    assert os.listdir(directory) == ["sharing-plugin"]  # the temporary file is gone
