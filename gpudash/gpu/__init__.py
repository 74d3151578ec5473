"""The NVML layer alone, like nvitop's api/: NVML's life and its one choke point (nvml.py) and a GPU as NVML
sees it (device.py). It imports nothing of gpudash but the frozen records; the telemetry sources, the
advisor and the launcher read GPUs through it."""
