"""Zennit as the reference for xaudit's LRP pass: its own hooks on a twin model, seeded by the
explained class's score, and the three LRP methods' parameters with the rules they give each layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from zennit.attribution import Gradient
from zennit.core import Composite, Hook
from zennit.rules import Norm, Pass

from workers.methods import AttributionContext, get_method
from workers.methods._lrp_rules import AlphaBeta, Epsilon, LayerRule, ZBox

__all__ = ["assert_equals_zennit", "lrp_cases", "passing", "zennit_relevance"]

Z_PLUS = AlphaBeta(1.0, 0.0, zero_bias=True)


def lrp_cases(layers: int) -> dict[str, tuple[dict[str, Any], list[LayerRule]]]:
    """Each LRP method's parameters and its rule for each of ``layers`` Linear/Conv layers."""
    return {
        "lrp_epsilon": ({}, [Epsilon(1e-6)] * layers),
        "lrp_alpha_beta": ({"alpha": 2.0, "beta": 1.0}, [AlphaBeta(2.0, 1.0)] * layers),
        "deep_taylor": ({"low": -4.0, "high": 4.0}, [ZBox(-4.0, 4.0)] + [Z_PLUS] * (layers - 1)),
    }


def passing(
    layers: list[nn.Module], rules: list[LayerRule], passed: type[nn.Module]
) -> Callable[[dict, str, nn.Module], Hook | None]:
    """Zennit's hooks: each of ``layers`` its rule, Pass on every ``passed`` module (Zennit's hooks
    carry relevance itself, so an elementwise module held as it is passes it on unchanged), Norm on
    pooling layers."""
    hooks = dict(zip(map(id, layers), rules, strict=True))

    def mapping(context: dict, module_name: str, module: nn.Module) -> Hook | None:
        if id(module) in hooks:
            return hooks[id(module)].zennit()
        if isinstance(module, passed):
            return Pass()
        return Norm() if "Pool" in type(module).__name__ else None

    return mapping


def zennit_relevance(
    twin: nn.Module,
    mapping: Callable[[dict, str, nn.Module], Hook | None],
    x: torch.Tensor,
    classes: np.ndarray,
) -> np.ndarray:
    """Zennit's relevance of ``twin`` at ``x`` with the hooks ``mapping`` gives its modules, seeded
    (as xaudit's pass is) by the score of each row's class."""
    c = torch.as_tensor(classes)
    with Gradient(model=twin, composite=Composite(module_map=mapping)) as attributor:
        _, relevance = attributor(
            x.clone().requires_grad_(True),
            lambda out: torch.zeros_like(out).scatter_(1, c[:, None], 1.0) * out.detach(),
        )
    return relevance.detach().numpy()


def assert_equals_zennit(
    name: str,
    ctx: AttributionContext,
    x: torch.Tensor,
    reference: Callable[[list[LayerRule], np.ndarray], np.ndarray],
    layers: int,
    atol: float,
) -> None:
    """xaudit's LRP method ``name`` on rows ``x`` equals ``reference`` (Zennit on a twin, given the
    rules and the rows' classes) within ``atol`` of the largest relevance."""
    classes = np.array([0, 1, 2, 1])[: len(x)]
    ours = get_method(name).attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    want = reference(lrp_cases(layers)[name][1], classes)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=atol * np.abs(want).max())
