"""Freed tensor memory is reused: a method's elementwise steps stop page-faulting in fresh memory."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

_STEPS = """
import resource, sys, torch
if sys.argv[1] == "tuned":
    from workers.allocator import keep_freed_memory
    assert keep_freed_memory()
z = torch.randn(512, 16, 8, 8)  # DeepLIFT's ReLU rule on a 512-row batch of the digits CNN
def step():
    y = torch.relu(z); d = z - 0.5; m = torch.sub(y, 0.1).div_(d); u = d.abs_() < 1e-10
    return torch.where(u, (z > 0).to(z), m)
for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")
def test_elementwise_steps_reuse_freed_memory() -> None:
    def faults(mode: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, timeout=120, check=True
        )
        return float(done.stdout)

    tuned, default = faults("tuned"), faults("default")
    assert tuned < 50, tuned  # 5 tensors of 2 MiB per step: 2,500 pages if each were fresh
    assert tuned < default / 4, (tuned, default)
