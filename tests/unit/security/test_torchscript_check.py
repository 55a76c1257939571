"""The TorchScript operator allow-list (workers/models/torchscript_check.py), on real scripted code."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch
from torch import nn

from tests.models import MLP_FEATURES, maxpool_cnn, relu_cnn, relu_mlp, to_torchscript
from workers.models.torchscript_check import REFUSED_ATEN, check_archive, check_module, refused_operator
from xaudit.contract.errors import InvalidModel


def test_every_aten_operator_with_a_file_argument_is_refused() -> None:
    # Guards a torch upgrade: a new operator taking a file name must be added to REFUSED_ATEN.
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("aten::") and any(
            "file" in a.name.lower() or a.name.lower() in ("path", "filename")
            for a in schema.arguments
            if "str" in str(a.type)
        ):
            assert refused_operator(schema.name), schema.name
    assert {"aten::from_file", "aten::save"} <= REFUSED_ATEN


@pytest.mark.parametrize(
    ("kind", "refused"),
    [("aten::conv2d", False), ("prim::If", False), ("prim::rpc_async", True), ("prim::PythonOp", True),
     ("mylib::exfiltrate", True), ("quantized::linear", True), ("aten::from_file", True)],
)  # fmt: skip
def test_namespaces(kind: str, refused: bool) -> None:
    assert refused_operator(kind) is refused


@pytest.mark.parametrize("build", [relu_mlp, relu_cnn, maxpool_cnn])
def test_honest_models_pass(build) -> None:  # type: ignore[no-untyped-def]
    shape = (2, MLP_FEATURES) if build is relu_mlp else (2, 1, 8, 8)
    data = to_torchscript(build(), torch.zeros(shape))
    check_archive(data)
    check_module(torch.jit.load(io.BytesIO(data)))


def _helper(path: str) -> torch.Tensor:
    return torch.from_file(path, size=4)


class _Hidden(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class _Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 1e30):  # a branch never taken on honest inputs
            return x + _helper("/etc/hostname").float().sum()
        return x


def test_an_operator_hidden_in_a_branch_of_a_submodule_function_is_found() -> None:
    module = torch.jit.script(_Hidden())
    with pytest.raises(InvalidModel, match=r"aten::from_file \(in (inner\.)?forward\)"):
        check_module(module)


def test_an_archive_with_setstate_is_refused_before_loading() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("m/code/__torch__/evil.py", "def __setstate__(self, state):\n  pass\n")
    with pytest.raises(InvalidModel, match="__setstate__"):
        check_archive(buffer.getvalue())
