"""Einsum nodes that are batched matrix products, written as Transpose, MatMul, Transpose for the
methods' graph (workers/models/einsum_ops.py): each equation against onnxruntime's Einsum, and MONAI's
self-attention block (its ViT's and UNETR's), whose scores and context are einsums, gets the rule
methods' attributions of its twin written with ``@``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from tests.models import ort_outputs, to_onnx
from workers.methods import AttributionContext, get_method
from workers.methods._fx_plan import held_constant
from workers.models import load_model
from workers.models.onnx_to_torch import methods_copy, onnx_to_torch
from workers.players import parse_players
from workers.targets import Target

# equation -> the operands' shapes
WRITTEN = {
    "blxd,blyd->blxy": ([2, 3, 4, 5], [2, 3, 6, 5]),  # MONAI's scores
    "bhxy,bhyd->bhxd": ([2, 3, 4, 6], [2, 3, 6, 5]),  # its context: a plain MatMul
    "bnd,dk->bnk": ([2, 4, 5], [5, 3]),  # a linear layer
    "bhid,hdj->bhij": ([2, 3, 4, 5], [3, 5, 6]),  # the second operand's batch the last of the first's
    "bij,bjk->bki": ([2, 4, 5], [2, 5, 3]),  # the output transposed
    "ijb,jkb->bik": ([4, 5, 2], [5, 3, 2]),  # batch last in the operands
    "bhwc,hkc->bhwk": ([2, 3, 4, 5], [3, 6, 5]),  # two free indices of the first (decomposed rel-pos)
}
KEPT = {
    "bij,bij->bi": ([2, 4, 5], [2, 4, 5]),  # no free index of the second operand
    "bij,jkl->bikl": ([2, 4, 5], [5, 3, 2]),  # two free indices of the second
    "...ij,...jk->...ik": ([2, 4, 5], [2, 5, 3]),  # an ellipsis
    "bij,bjk->bk": ([2, 4, 5], [2, 5, 3]),  # a sum over the first operand's own index
}


def _einsum(equation: str, shapes: tuple[list[int], list[int]]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["a", "b"], ["y"], name="einsum", equation=equation)],
        "einsum",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip("ab", shapes, strict=True)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("equation", list(WRITTEN))
def test_a_batched_matrix_product_is_written_as_a_matmul(equation: str) -> None:
    model = _einsum(equation, WRITTEN[equation])
    written = methods_copy(model)
    assert "Einsum" not in {n.op_type for n in written.graph.node}
    rng = np.random.default_rng(81)
    feeds = {n: rng.normal(size=s).astype(np.float32) for n, s in zip("ab", WRITTEN[equation], strict=True)}
    want = ort_outputs(model, feeds)
    np.testing.assert_allclose(ort_outputs(written, feeds), want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        got = onnx_to_torch(model)(*(torch.from_numpy(feeds[n]) for n in "ab")).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("equation", list(KEPT))
def test_other_equations_stay_as_they_are(equation: str) -> None:
    model = _einsum(equation, KEPT[equation])
    assert [n.op_type for n in methods_copy(model).graph.node] == ["Einsum"]


class _SelfAttention(nn.Module):
    """MONAI's SABlock as it computes without flash attention: einsums for the scores and the
    context (``einsum=False``: the same with ``@``, the twin)."""

    def __init__(self, einsum: bool) -> None:
        super().__init__()
        torch.manual_seed(82)
        self.einsum = einsum
        self.qkv, self.out, self.head = nn.Linear(16, 48), nn.Linear(16, 16), nn.Linear(80, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        q, k, v = self.qkv(x).reshape(rows, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
        scores = torch.einsum("blxd,blyd->blxy", q, k) if self.einsum else q @ k.transpose(-1, -2)
        weights = (scores * 8**-0.5).softmax(-1)
        context = torch.einsum("bhxy,bhyd->bhxd", weights, v) if self.einsum else weights @ v
        return self.head(self.out(context.transpose(1, 2).reshape(rows, 5, 16)).flatten(1))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_monais_self_attention_gets_its_matmul_twins_attributions(name: str, dynamo: bool) -> None:
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(83))
    exported = [
        to_onnx(_SelfAttention(einsum).eval(), x[:1], opset=17, dynamo=dynamo) for einsum in (True, False)
    ]
    assert "Einsum" in {n.op_type for n in onnx.load_from_string(exported[0]).graph.node}
    contexts = [
        AttributionContext(
            load_model(data, "onnx", "cpu"), parse_players("windows:5:axis=0", (5, 16)), Target(), {}
        )
        for data in exported
    ]
    classes = np.array([0, 1, 2])
    got, want = (
        get_method(name).attribute(c, x.numpy(), np.zeros_like(x.numpy()), classes) for c in contexts
    )
    assert np.abs(want).max() > 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert "attention weights" in held_constant(contexts[0].model.torch_differentiable(), name)
