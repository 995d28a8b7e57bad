"""Stand-ins for the outside programs the tests drive and the wheel does not ship.

The in-package simulators (simulated NVML, the kubelet simulator) serve `--gpus simulated:`
and `demo`, so they are part of the product. What is here only the tests need: the kubelet's
DRA side with a test allocator in place of the scheduler's, and a stand-in for
`nvidia-cuda-mps-control`.
"""
