"""`python -m sharing_plugin.sim.mps [-d]`: the simulated `nvidia-cuda-mps-control`."""

from __future__ import annotations

import sys

from sharing_plugin.sim.mps.control import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
