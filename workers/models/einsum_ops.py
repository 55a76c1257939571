"""ONNX ``Einsum`` nodes that are batched matrix products written as Transpose, MatMul, Transpose, for
the methods' graph.

MONAI's self-attention block (its ViT, UNETR and ViTAutoEnc) computes its scores and context with
``torch.einsum("blxd,blyd->blxy", q, k)`` and ``torch.einsum("bhxy,bhyd->bhxd", att, v)``, which both
torch exporters write as ``Einsum``. The torch conversion runs it as one ``torch.einsum`` module, which
the gradient methods take but the rule methods have no rule for: LRP, alpha-beta and Deep Taylor
refused every such model. Written as the MatMul that an ``@`` exports to, the softmax weights are held
and the products with constant matrices are linear layers, as on any other transformer.

An equation is rewritten where it has two operands, no ellipsis and no index repeated within an
operand, and its indices are: batch indices (in both operands and the output), one contracted index
(in both operands only), one free index of the second operand and at least one of the first (in it
and the output; all but the last lead as batch axes that the second operand broadcasts along: a
linear layer's ``bnd,dk->bnk``, SAM's and MViT's decomposed relative positions ``bhwc,hkc->bhwk``).
Anything else (a sum over one operand's own index, two free indices of the second operand, a vector
product) stays as it is (tests/unit/models/test_einsum_ops.py, against onnxruntime). The game runs
the model as given.
"""

from __future__ import annotations

import onnx
from onnx import helper

from workers.models.onnx_nodes import attributes, rewrite_nodes

__all__ = ["einsums_as_matmul"]


def einsums_as_matmul(model: onnx.ModelProto) -> int:
    """Rewrite each batched matrix product ``Einsum`` of ``model``'s main graph in place (module
    docstring); returns how many."""
    return rewrite_nodes(
        model.graph,
        lambda node: _written(node) if node.op_type == "Einsum" and node.domain in ("", "ai.onnx") else None,
    )


def _written(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    equation = attributes(node).get("equation", b"")
    equation = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    if len(node.input) != 2 or "->" not in equation or "." in equation:
        return None
    operands, out = equation.split("->")
    if operands.count(",") != 1:
        return None
    a, b = operands.split(",")
    if any(len(set(term)) != len(term) for term in (a, b, out)) or not set(out) <= set(a) | set(b):
        return None
    batch = [i for i in out if i in a and i in b]
    contracted = [i for i in a if i in b and i not in out]
    free = [i for i in out if i in a and i not in b]  # the first operand's own indices
    right = [i for i in out if i in b and i not in a]
    kept = set(out) | set(contracted)  # no index summed over one operand alone
    if len(contracted) != 1 or not free or len(right) != 1 or not set(a) | set(b) <= kept:
        return None
    # MatMul's rows are the first operand's last free index; its other free indices lead, as batch axes
    # the second operand broadcasts along
    a_order = [*free[:-1], *batch, free[-1], *contracted]
    b_order = [*batch, *contracted, *right]
    product = [*free[:-1], *batch, free[-1], *right]
    name = node.name or node.output[0]
    p = f"{node.output[0]}/matmul"
    found: list[onnx.NodeProto] = []
    inputs = []
    for role, term, order, operand in (("a", a, a_order, node.input[0]), ("b", b, b_order, node.input[1])):
        if list(term) != order:
            perm = [term.index(i) for i in order]
            found.append(
                helper.make_node("Transpose", [operand], [f"{p}/{role}"], name=f"{name}/{role}", perm=perm)
            )
            operand = f"{p}/{role}"
        inputs.append(operand)
    if product == list(out):
        found.append(helper.make_node("MatMul", inputs, [node.output[0]], name=f"{name}/matmul"))
        return found
    found += [
        helper.make_node("MatMul", inputs, [f"{p}/product"], name=f"{name}/matmul"),
        helper.make_node(
            "Transpose",
            [f"{p}/product"],
            node.output[:1],
            name=f"{name}/out",
            perm=[product.index(i) for i in out],
        ),
    ]
    return found
