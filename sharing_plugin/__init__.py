"""gpu-sharing-plugin: a Kubernetes device plugin for NVIDIA GPUs driven by a validated config."""

__version__ = "0.1.0"

__all__ = ["__version__"]
