"""`sharing-plugin run` with tracemalloc on, for `bench_soak.py --tracemalloc`.

    python bench/traced_run.py OUT [run arguments...]

On SIGUSR1 (after a full garbage collection) writes the size of the Python heap that
tracemalloc traces, in bytes, to OUT, replacing it: what a benchmark compares with VmRSS to tell
Python objects that pile up from memory the C libraries (grpc) hold.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType


def main() -> int:
    out = Path(sys.argv[1])
    tracemalloc.start()

    def report(signum: int, frame: FrameType | None) -> None:
        gc.collect()
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(f"{tracemalloc.get_traced_memory()[0]}\n")
        os.replace(tmp, out)

    signal.signal(signal.SIGUSR1, report)
    from sharing_plugin.cli import main as cli

    return cli(["run", *sys.argv[2:]])


if __name__ == "__main__":
    sys.exit(main())
