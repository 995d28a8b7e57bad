"""`sharing-plugin top`: a running daemon's holders and usage, one frame, in 80 columns."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cli_capture import cli
from plugin_process import free_port
from usage_support import admit, cgroup, index_of, plugin, write_node


async def test_one_frame_shows_each_gpu_its_holders_and_their_usage(short_dir: Path) -> None:
    async with plugin(short_dir, gpus_count=1) as (run, port):
        await admit(run, "train-with-a-rather-long-name-that-will-not-fit-0123456789")
        cgroup(short_dir / "proc", 7, "0::/system.slice/some-host-daemon.service\n")
        write_node(
            short_dir / "node.yaml",
            [
                {"gpu": 0, "pid": 5, "memory": "10Gi", "sm": 60},  # the only holder's
                {"gpu": 0, "pid": 7, "memory": "1Gi"},  # a host process
            ],
            gpus=1,
        )
        done = await asyncio.to_thread(cli, "top", "--url", f"http://127.0.0.1:{port}", "--once")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [len(line) for line in lines]
    header = next(line for line in lines if line.startswith("GPU"))
    assert header.split() == ["GPU", "POD", "REPLICAS", "MEMORY", "USED/SHARE", "SM"]
    (gpu_row,) = [line for line in lines if line.startswith("0 ")]
    assert "Tesla T4" in gpu_row and "11.0 of 15.0 GiB" in gpu_row
    (holder,) = [line for line in lines if "ml/train-with" in line]
    assert "~" in holder and holder.rstrip().endswith("60%")  # shortened in the middle
    assert "1/2" in holder and "10.0/7.5 GiB !" not in holder  # not reported: 60 s not passed
    assert "10.0/7.5 GiB" in holder
    (host,) = [line for line in lines if "unattributed" in line]
    assert "(pid 7, unattributed)" in host and "1.0 GiB" in host and host.rstrip().endswith("0%")
    assert index_of(run, run.nvml.gpus[0].uuid) == 0


def test_a_plugin_that_does_not_answer_is_exit_1_and_a_bad_url_exit_2() -> None:
    gone = cli("top", "--url", f"http://127.0.0.1:{free_port()}", "--once")
    assert gone.returncode == 1
    assert gone.stderr.startswith("sharing-plugin top: http://127.0.0.1:")
    assert "refused" in gone.stderr.lower()
    bad = cli("top", "--url", "127.0.0.1:9400", "--once")
    assert bad.returncode == 2
    assert "--url must be http://HOST:PORT" in bad.stderr
