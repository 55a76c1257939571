"""Hostile TorchScript models for the sandbox tests (real scripted code, no test hooks in the product)."""

from __future__ import annotations

import io

import torch
from torch import nn

__all__ = ["hog_memory_torchscript", "spin_forever_torchscript"]


class _SpinForever(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        i = 0
        while i >= 0:  # never ends: only RLIMIT_CPU stops it (SIGXCPU kills the sandbox process)
            y = y * 1.0
            i = i + 1
        return y


class _HogMemory(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = torch.ones([1 << 33], dtype=torch.float32)  # 32 GiB: past any sandbox memory limit
        return x + big[0]


def _save(module: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


def spin_forever_torchscript() -> bytes:
    return _save(_SpinForever())


def hog_memory_torchscript() -> bytes:
    return _save(_HogMemory())
