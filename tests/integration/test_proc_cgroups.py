"""`<proc root>/<pid>/cgroup` read from a directory tree laid out as /proc is."""

from __future__ import annotations

from pathlib import Path

from sharing_plugin.sources.proc import CgroupReader
from sharing_plugin.usage.model import CgroupRef

UID = "8e5b4c4f-3b3a-4f5e-9d1c-2a1b3c4d5e6f"
CID = "3b" * 32


def write(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(text)


def test_each_pid_is_read_once_while_it_runs(tmp_path: Path) -> None:
    write(tmp_path, 10, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    write(tmp_path, 11, "0::/system.slice/dcgm.service\n")
    reader = CgroupReader(tmp_path)
    assert reader.cgroups([10, 11, 12]) == {10: CgroupRef(UID, CID), 11: None}  # 12: not there
    write(tmp_path, 10, "0::/\n")  # the same pid is the same process while NVML lists it
    assert reader.cgroups([10]) == {10: CgroupRef(UID, CID)}
    # a pid NVML stopped listing is forgotten: seen again, it is read again (a new process)
    assert reader.cgroups([11]) == {11: None}
    assert reader.cgroups([10, 11]) == {10: None, 11: None}
