"""The report's environment names the processors it ran on (workers/hardware.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import workers.metrics
from workers.audit.report import environment
from workers.hardware import cpu_model, processors
from workers.metrics import DeviceInfo


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454P 48-Core Processor\n"
    )
    assert cpu_model(info) == "AMD EPYC 9454P 48-Core Processor"


def test_without_cpuinfo_the_model_comes_from_platform(tmp_path: Path) -> None:
    name = cpu_model(tmp_path / "missing")
    assert name and name != cpu_model(_written(tmp_path, "model name : Made Up CPU\n"))


def _written(folder: Path, text: str) -> Path:
    path = folder / "made_up"
    path.write_text(text)
    return path


def test_a_cpu_report_names_the_cpu_and_the_kernels_torch_picked() -> None:
    found = environment("cpu", ["CPUExecutionProvider"])["processors"]
    assert found == {"cpu": cpu_model(), "cpu_kernels": torch.backends.cpu.get_cpu_capability()}


def test_a_cuda_report_also_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: torch's answer about the device is the one thing replaced.
    monkeypatch.setattr(
        workers.metrics,
        "describe_device",
        lambda device: DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 0, 2**36),
    )
    assert processors("cuda:0")["gpu"] == "NVIDIA H100 80GB HBM3"
