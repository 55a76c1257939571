"""Running a Zennit composite on a hookable graph, with the relevance seeded by the target score."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from zennit.attribution import Gradient
from zennit.core import Composite, Hook
from zennit.types import Convolution, Linear

from workers.methods._base import AttributionContext, to_numpy, to_tensor

__all__ = ["CHUNK", "affine_modules", "is_affine", "lrp_relevance", "module_composite"]

# Rows per backward pass, and input elements per pass: bound the memory of the hooks' stored
# activations (a heuristic: activations are assumed to be tens of times the input).
CHUNK = 256
_ELEMENTS = 2**22

ModuleRule = Callable[[torch.nn.Module], Hook | None]


def is_affine(module: torch.nn.Module) -> bool:
    """Layers LRP rules apply to: linear and (transposed) convolution modules."""
    return isinstance(module, Linear | Convolution)


def affine_modules(graph: torch.nn.Module) -> list[torch.nn.Module]:
    """Affine modules in execution order (fx node order when the graph is an fx GraphModule)."""
    if isinstance(graph, torch.fx.GraphModule):
        found: list[torch.nn.Module] = []
        for node in graph.graph.nodes:
            if node.op == "call_module":
                module = graph.get_submodule(str(node.target))
                if is_affine(module) and module not in found:
                    found.append(module)
        return found
    return [m for m in graph.modules() if is_affine(m)]


def module_composite(rule: ModuleRule) -> Composite:
    """A composite that asks ``rule`` for a fresh hook per module (``None``: plain gradient)."""

    def mapping(ctx: dict[str, Any], name: str, module: torch.nn.Module) -> Hook | None:
        return rule(module)

    return Composite(module_map=mapping)


def lrp_relevance(
    ctx: AttributionContext,
    method: str,
    rule: ModuleRule,
    inputs: np.ndarray,
    classes: np.ndarray,
) -> np.ndarray:
    """Input relevance (k, *shape) for the target class of each row.

    The output relevance is the one-hot target score (one-hot times the target value), so relevance
    is in the target's units and a conservative rule makes it sum to the target value.
    """
    device = ctx.model.device
    model = ctx.target.wrap(ctx.model.torch_hookable(method))
    chunk = max(1, min(CHUNK, _ELEMENTS // max(1, int(np.prod(inputs.shape[1:])))))
    out: list[np.ndarray] = []
    for start in range(0, inputs.shape[0], chunk):
        x = to_tensor(inputs[start : start + chunk], device, requires_grad=True)
        c = torch.as_tensor(classes[start : start + chunk], dtype=torch.long, device=device)

        def seed(output: torch.Tensor, c: torch.Tensor = c) -> torch.Tensor:
            onehot = torch.zeros_like(output).scatter_(1, c[:, None], 1.0)
            return onehot * output.detach()

        with torch.enable_grad(), Gradient(model=model, composite=module_composite(rule)) as attributor:
            _, relevance = attributor(x, seed)
        out.append(to_numpy(relevance))
    return np.concatenate(out).astype(np.float32)
