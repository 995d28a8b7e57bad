"""`/proc/<pid>/cgroup` text -> the pod and container it names, over real-world layouts."""

from __future__ import annotations

import pytest

from sharing_plugin.usage.cgroup import container_id, parse_cgroup
from sharing_plugin.usage.model import CgroupRef

UID = "8e5b4c4f-3b3a-4f5e-9d1c-2a1b3c4d5e6f"
UNDERSCORED = UID.replace("-", "_")
CID = "3b1f9c0e5d2a4b7c8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d"
POD = CgroupRef(pod_uid=UID, container_id=CID)
POD_ONLY = CgroupRef(pod_uid=UID, container_id=None)

# cgroup v1 lists a line per hierarchy; these are as a containerd or CRI-O node writes them.
V1_CGROUPFS = f"""\
12:hugetlb:/kubepods/burstable/pod{UID}/{CID}
11:memory:/kubepods/burstable/pod{UID}/{CID}
10:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""
V1_SYSTEMD = f"""\
13:misc:/
12:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(V1_CGROUPFS, POD, id="v1-cgroupfs-burstable"),
        pytest.param(V1_SYSTEMD, POD, id="v1-systemd-besteffort-containerd"),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}"
            f".slice/cri-containerd-{CID}.scope\n",
            POD,
            id="v2-systemd-burstable-containerd",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n",
            POD,
            id="v2-systemd-guaranteed-containerd",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}"
            f".slice/crio-{CID}.scope\n",
            POD,
            id="v2-systemd-besteffort-crio",
        ),
        pytest.param(f"0::/kubepods/pod{UID}/{CID}\n", POD, id="v2-cgroupfs-guaranteed"),
        pytest.param(f"0::/kubepods/besteffort/pod{UID}/{CID}\n", POD, id="v2-cgroupfs-besteffort"),
        pytest.param(f"0::/kubepods/burstable/pod{UID}/crio-{CID}\n", POD, id="v2-cgroupfs-crio"),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}"
            f".slice/docker-{CID}.scope\n",
            POD,
            id="v2-systemd-docker",
        ),
        pytest.param(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n",
            POD,
            id="kind-kubelet-slice",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}"
            f".slice/crio-conmon-{CID}.scope\n",
            POD_ONLY,
            id="crio-conmon-is-no-container",
        ),
        pytest.param(
            f"0::/kubepods/burstable/pod{UID.upper()}/{CID.upper()}\n",
            POD,
            id="upper-case-hex",
        ),
        pytest.param(
            f"0::/kubepods/burstable/pod6b0d2e4f8a1c3e5b7d9f1a3c5e7b9d1f/{CID}\n",
            CgroupRef(pod_uid="6b0d2e4f8a1c3e5b7d9f1a3c5e7b9d1f", container_id=CID),
            id="static-pod-hash-uid",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}"
            ".slice\n",
            POD_ONLY,
            id="pod-cgroup-itself",
        ),
        # hybrid: v1 lines without the pod (a controller not delegated), v2 with it
        pytest.param(f"3:cpuset:/\n2:memory:/\n0::/kubepods/pod{UID}/{CID}\n", POD, id="hybrid"),
    ],
)
def test_pod_and_container_from_real_world_lines(text: str, expected: CgroupRef) -> None:
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0::/system.slice/nvidia-persistenced.service\n", id="host-service"),
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", id="login-session"),
        pytest.param("0::/\n", id="root"),
        pytest.param("12:memory:/\n1:name=systemd:/init.scope\n", id="v1-init"),
        pytest.param("0::/kubepods.slice/kubepods-burstable.slice\n", id="qos-slice-only"),
        pytest.param("0::/kubepods/burstable/podnot-a-uid/x\n", id="not-a-uid"),
        pytest.param("", id="empty"),
        pytest.param("garbage without colons\n", id="garbage"),
    ],
)
def test_processes_outside_pods_name_none(text: str) -> None:
    assert parse_cgroup(text) is None


def test_container_ids_from_pod_status_match_cgroup_ids() -> None:
    assert container_id(f"containerd://{CID}") == CID
    assert container_id(f"cri-o://{CID.upper()}") == CID
    assert container_id(CID) == CID
