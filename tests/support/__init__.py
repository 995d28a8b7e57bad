"""What the tests import and the wheel does not ship.

The in-package simulators (simulated NVML, the kubelet simulator) serve `--gpus simulated:`
and `demo`, so they are part of the product. What is here only the tests need: stand-ins for
outside programs (the kubelet's DRA side with a test allocator in place of the scheduler's, a
stand-in for `nvidia-cuda-mps-control`), the observation points tests read the product's state
through (`observe`), and config texts many tests write (`configs`).
"""
