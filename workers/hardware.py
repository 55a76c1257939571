"""The processors a report's numbers were computed on, for its environment section.

Float results can differ in their last bits between machines with the same packages (oneDNN, MKL
and ONNX Runtime pick their kernels at run time by the CPU's vector instructions, AVX2 or AVX-512),
and so can speed: a report, and a benchmark, says which processors it ran on.
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_model", "processors"]

_CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = _CPUINFO) -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows, else "unknown"."""
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def processors(device: str) -> dict[str, str]:
    """``cpu``: the CPU's model; ``cpu_kernels``: the vector instructions torch's CPU kernels use
    (``torch.backends.cpu.get_cpu_capability()``: AVX512, AVX2, DEFAULT, ...); ``gpu``: the GPU's
    model where ``device`` is a CUDA device."""
    import torch

    from workers.metrics import describe_device

    found = {"cpu": cpu_model(), "cpu_kernels": str(torch.backends.cpu.get_cpu_capability())}
    gpu = describe_device(device)
    if gpu.device == "cuda":
        found["gpu"] = gpu.name
    return found
