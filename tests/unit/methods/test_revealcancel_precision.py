"""RevealCancel's float64 plans (graphs with sums, and the redo of a chain's unresolved rows) compute
only W da in float64, and |W| |da| and the backward products in float32 (docs/science.md 5.8).
Every sign that routes multipliers is then a float64 difference's: checked against the same plan
with every product in float64, on a network built so that float32 gets a sign wrong, and on
torchvision's resnet18, where the float32 parts' rounding must stay small."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workers.methods._revealcancel_graph as revealcancel_graph
from tests.models.zoo.builders import IMAGE, image_model
from tests.unit.methods._context import context
from workers.methods import get_method
from workers.methods._revealcancel_maps import AffineMaps, affine_maps

EPS = 2.0**-23  # float32's spacing at 1


def _every_map_in_float64(module: nn.Module, dtype: torch.dtype) -> AffineMaps:
    """The reference: every map in ``dtype`` (float64 here), written with torch's functions and
    autograd, independent of the maps under test."""
    if not isinstance(module, nn.Conv2d | nn.Linear) or dtype != torch.float64:
        return affine_maps(module, dtype)
    weight = module.weight.detach().to(dtype)
    bias = None if module.bias is None else module.bias.detach().to(dtype)

    def apply(w: torch.Tensor, b: torch.Tensor | None):  # type: ignore[no-untyped-def]
        if isinstance(module, nn.Linear):
            return lambda x: F.linear(x, w, b)
        return lambda x: module._conv_forward(x, w, b)

    def transpose(w: torch.Tensor):  # type: ignore[no-untyped-def]
        def back(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            u = torch.zeros_like(like, dtype=dtype, requires_grad=True)
            with torch.enable_grad():
                (out,) = torch.autograd.grad(apply(w, None)(u), u, g)
            return out

        return back

    magnitude = weight.abs()
    return AffineMaps(
        apply(weight, bias),
        apply(weight, None),
        apply(magnitude, None),
        transpose(weight),
        transpose(magnitude),
    )


def _attribute(model: nn.Module, x: torch.Tensor, x0: torch.Tensor, classes: np.ndarray) -> np.ndarray:
    ctx = context(model, x[:1])  # a new graph each time: a new plan
    return get_method("deeplift_revealcancel").attribute(ctx, x.numpy(), x0.numpy(), classes)


def _linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    return layer


class _TinyDifference(nn.Module):
    """u0 = (1 + EPS) x0 - x1 after a ReLU. At x = (1 + EPS, 1 + 2 EPS) its difference from the zero
    reference is EPS**2 = 2**-46: exact in float64, 0 in float32 (where (1 + EPS)**2 rounds to
    1 + 2 EPS). Its sign decides which multiplier the sum after it sends back (W^T of the mean, or
    of the positive part's), and a residual sum makes the plan float64."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = _linear([[1 + EPS, 0.0], [0.0, 1.0]], [0.0, 0.0])
        self.l2 = _linear([[1.0, -1.0], [0.5, 0.5]], [0.5, 0.0])
        self.l3 = _linear([[2.0, -1.0], [-1.0, 1.0]], [-1.0, 0.2])
        self.l4 = _linear([[1.0, 1.0], [1.0, -1.0]], [0.0, 0.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = torch.relu(self.l2(torch.relu(self.l1(x))))
        return self.l4(torch.relu(self.l3(u) + u))


def test_a_difference_float32_cannot_resolve_routes_multipliers_as_in_float64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _TinyDifference().eval()
    x = torch.tensor([[1 + EPS, 1 + 2 * EPS]])
    x0 = torch.zeros_like(x)
    got = _attribute(model, x, x0, np.array([0]))
    monkeypatch.setattr(revealcancel_graph, "affine_maps", _every_map_in_float64)
    want = _attribute(model, x, x0, np.array([0]))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # W da in float32 gives [[0.84, 0.36]]: the same sum (f(x) - f(x0) = 1.2), split otherwise.
    np.testing.assert_allclose(want, [[1.35, -0.15]], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_residual_network_agrees_with_every_product_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    model = image_model("resnet18")  # batch norms calibrated: many units near their kinks
    rows = 6
    x = torch.rand(rows, *IMAGE, generator=torch.Generator().manual_seed(7))
    x[::2, :, :16] = 0.0  # the audit's sub-inputs: parts of the image at the reference
    x[1::3, :, :, 16:] = 0.0
    x0 = torch.zeros_like(x)
    classes = np.arange(rows) % 10
    got = _attribute(model, x, x0, classes)
    monkeypatch.setattr(revealcancel_graph, "affine_maps", _every_map_in_float64)
    want = _attribute(model, x, x0, classes)
    scale = np.abs(want).reshape(rows, -1).max(axis=1)
    off = np.abs(got - want).reshape(rows, -1).max(axis=1) / scale
    assert off.max() <= 2e-5, off  # 4e-7 to 7e-7 of each row's largest attribution here


@pytest.mark.parametrize("seed", [1, 3])
def test_max_pool_ties_are_the_models_not_the_roundings(seed: int) -> None:
    """A max-pool window of units a ReLU turns off at x is a tie, and the gradient sends it to the
    first zero. Taken as reference plus difference, those zeros carried each plan's rounding, which
    broke the tie: the float32 plan (a chain) and the float64 one (any graph with a sum) disagreed
    by up to 93% of a row's largest attribution. The values at x now come from the ReLU itself."""
    from functools import partial

    from tests.models import maxpool_cnn
    from workers.methods._revealcancel_graph import Reference, RevealCancelGraph
    from workers.methods.deeplift_revealcancel import target_seed
    from workers.targets import Target

    gen = torch.Generator().manual_seed(seed)
    x, x0 = torch.rand(128, 1, 8, 8, generator=gen), torch.rand(1, 1, 8, 8, generator=gen)
    graph = context(maxpool_cnn(seed=seed), x[:1]).model.torch_hookable("deeplift_revealcancel")
    rows, classes = torch.zeros(128, dtype=torch.long), torch.zeros(128, dtype=torch.long)
    got = {}
    for dtype in (torch.float32, torch.float64):
        plan = RevealCancelGraph(graph, "deeplift_revealcancel", dtype)
        ref = plan.reference(x0.double(), rows)
        dx = x.to(dtype) - x0.to(dtype)
        seed_fn = partial(target_seed, Target(), classes=classes, head=plan.head)
        m, _ = plan.multipliers(dx, Reference(ref.values, rows), seed_fn)
        got[dtype] = (dx * m).double().reshape(128, -1)
    h = torch.relu(maxpool_cnn(seed=seed)[0](x)).detach()
    assert (h.unfold(2, 2, 2).unfold(3, 2, 2).reshape(128, 3, 16, 4) == 0).all(-1).any()  # ties there
    scale = got[torch.float64].abs().amax(1).clamp_min(1e-12)
    assert ((got[torch.float32] - got[torch.float64]).abs().amax(1) / scale).max() < 1e-5
