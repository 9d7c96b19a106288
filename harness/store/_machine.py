"""What a timing depends on: the processor, torch threads, the device and the machine's load.

Recorded beside every measured time (training sidecars, certification latency) so that speeds are only
compared when they were measured on the same hardware and load.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from harness.store.rundata import Hardware

if TYPE_CHECKING:
    import torch

CPUINFO = Path("/proc/cpuinfo")


def processor_name(cpuinfo: Path = CPUINFO) -> str:
    """The CPU model ("AMD EPYC 7B13"), from ``/proc/cpuinfo`` on Linux; else what :mod:`platform` knows."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The 1-minute load average, ``None`` where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def hardware(device: torch.device) -> Hardware:
    """The processor, logical CPUs, torch threads and device (and the GPU's name on CUDA)."""
    import torch

    info: Hardware = {"machine": platform.machine(), "processor": processor_name(),
                            "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


__all__ = ["hardware", "load_average", "processor_name"]
