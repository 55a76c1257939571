"""Hostile models of the attacks in docs/security.md: real TorchScript and ONNX, built by the tests.

Every model takes the test inputs (batch, MLP_FEATURES) float32 and returns a (batch, k) output, so
a job runs them exactly as it runs an honest model."""

from __future__ import annotations

import io

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from tests.models import MLP_FEATURES

__all__ = [
    "file_reader_torchscript",
    "file_writer_torchscript",
    "onnx_loop_bomb",
    "onnx_memory_bomb",
]


class _ReadFile(nn.Module):
    """Returns the first bytes of a file as its output: what it read comes back as target values."""

    def __init__(self, path: str, size: int) -> None:
        super().__init__()
        self.path = path
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        data = torch.from_file(self.path, shared=False, size=self.size, dtype=torch.uint8)
        return x[:, :1] * 0.0 + data.float().unsqueeze(0)


class _WriteFile(nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.save(x, self.path)
        return x


def _save(module: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


def file_reader_torchscript(path: str, size: int) -> bytes:
    return _save(_ReadFile(path, size))


def file_writer_torchscript(path: str) -> bytes:
    return _save(_WriteFile(path))


def _onnx(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> bytes:
    graph = helper.make_graph(
        nodes,
        "attack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", MLP_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", MLP_FEATURES])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def onnx_memory_bomb() -> bytes:
    """Expand the input to [2^28, batch, features] (6 GiB a row at 6 features), then sum it away."""
    shape = numpy_helper.from_array(np.array([1 << 28, 1, MLP_FEATURES], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [
        helper.make_node("Expand", ["x", "shape"], ["big"]),
        helper.make_node("ReduceSum", ["big", "axes"], ["y"], keepdims=0),
    ]
    return _onnx(nodes, [shape, axes])


def onnx_loop_bomb() -> bytes:
    """A Loop of 2^62 iterations adding one to a scalar; its result is added to the input."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, []),
        ],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    inits = [
        numpy_helper.from_array(np.array(1 << 62, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("Loop", ["trips", "cond", "zero"], ["acc"], body=body),
        helper.make_node("Add", ["x", "acc"], ["y"]),
    ]
    return _onnx(nodes, inits)
