"""GPUs: the inventory values, the NVML adapter, the simulated NVML and the model catalog."""
