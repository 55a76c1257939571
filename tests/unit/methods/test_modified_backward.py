"""The one-pass LRP, Deep Taylor and DeepLIFT Rescale against the field's reference implementations:
Zennit's rules (the same methods forced onto their Zennit path) and Captum's DeepLift/DeepLiftShap,
on a ReLU MLP, a ReLU CNN and the shipped digits CNN, for logit and probability targets."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from captum.attr import DeepLift, DeepLiftShap
from torch import fx

from tests.models import CNN_SHAPE, MLP_FEATURES, maxpool_cnn, relu_cnn, relu_mlp, sigmoid_mlp
from tests.models.blocks import BLOCK_SHAPE, concatenated_block, shuffled_unit, small_resnet
from tests.unit.methods._context import context
from workers.methods import AttributionContext, _rescale_graph, get_method
from workers.methods._modified_backward import RelevanceGraph
from workers.methods._rescale_graph import RescaleGraph
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

ASSETS = Path(__file__).parents[3] / "workers" / "assets"
LRP = {
    "lrp_epsilon": [{}, {"epsilon": 0.25}],
    "lrp_alpha_beta": [{}, {"alpha": 1.0, "beta": 0.0}],
    "deep_taylor": [{}, {"low": -3.0, "high": 2.5}],
}
TARGETS = [Target("logit"), Target("prob"), Target("logodds", fixed_class=1)]


def _grouped_cnn(seed: int) -> torch.nn.Module:
    """A grouped convolution (its terms cannot be stacked into one call) and average pooling (LRP-0)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3, padding=1, groups=2),
        torch.nn.ReLU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 3),
    ).eval()


def _two_pools(seed: int) -> torch.nn.Module:
    """Two max-pools: below the second, Captum's reference half may drift from the input half."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 3),
    ).eval()


# Residual sums with one overlapping max-pool, a concatenation, a channel split and shuffle.
BLOCKS = {"resnet": small_resnet, "concatenation": concatenated_block, "channel_shuffle": shuffled_unit}
BUILDERS = {
    "mlp": relu_mlp,
    "cnn": relu_cnn,
    "maxpool": maxpool_cnn,
    "two_maxpools": _two_pools,
    "grouped": _grouped_cnn,
    **BLOCKS,
}


def _case(kind: str, target: Target, params: dict | None = None) -> tuple[AttributionContext, np.ndarray]:
    """A context and 6 input rows; the first three rows' references repeat (the audit's sub-inputs)."""
    if kind == "digits":
        model = load_model((ASSETS / "digits_cnn.onnx").read_bytes(), "onnx", "cpu")
        x = np.load(ASSETS / "digits_inputs.npy")
        x = np.concatenate([x, x[:2] * 0.5]).astype(np.float32)
        players = parse_players("grid:2x4", x.shape[1:])
        return AttributionContext(model, players, target, dict(params or {})), x
    gen = torch.Generator().manual_seed(31)
    module = BUILDERS[kind](7)
    shape = {"mlp": (MLP_FEATURES,), **dict.fromkeys(BLOCKS, BLOCK_SHAPE)}.get(kind, CNN_SHAPE)
    x = torch.randn(6, *shape, generator=gen)
    return context(module, x, params=params, target=target), x.numpy()


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    """To 1e-5, relative to the attributions' size where that is below 1 (a confident model's
    probability target has gradients near 1e-5)."""
    scale = float(np.abs(want).max())
    assert scale > 1e-9  # a comparison of zeros could not fail
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * min(1.0, scale))


def _classes(ctx: AttributionContext, x: np.ndarray) -> np.ndarray:
    return ctx.target.resolve_classes(ctx.model.predict(x))


@pytest.mark.parametrize("kind", ["mlp", "cnn", "digits", "maxpool", "grouped"])
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.kind)
@pytest.mark.parametrize(("name", "params"), [(n, p) for n, ps in LRP.items() for p in ps])
def test_lrp_rules_equal_zennit(
    name: str, params: dict, kind: str, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, x = _case(kind, target, params)
    method, classes, refs = get_method(name), _classes(ctx, x), np.zeros_like(x)
    ours = method.attribute(ctx, x, refs, classes)
    monkeypatch.setattr(RelevanceGraph, "build", classmethod(lambda cls, plan, rules: None))
    zennit = method.attribute(ctx, x, refs, classes)  # the same rules, through Zennit's hooks
    _assert_close(ours, zennit)


def test_z_beta_below_a_relu_is_left_to_zennit() -> None:
    # z-beta's bound terms are relevance at the layer's input; a ReLU under it is not a reshape.
    module = torch.nn.Sequential(torch.nn.ReLU(), relu_mlp(3)).eval()
    x = torch.randn(4, MLP_FEATURES, generator=torch.Generator().manual_seed(5))
    ctx = context(module, x)
    from workers.methods._fx_plan import plan_graph
    from workers.methods._lrp_rules import ZBox

    plan = plan_graph(ctx.model.torch_hookable("deep_taylor"), "deep_taylor", "LRP")
    assert RelevanceGraph.build(plan, lambda i: ZBox(-1.0, 1.0)) is None
    got = get_method("deep_taylor").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), np.zeros(4, np.int64))
    assert np.isfinite(got).all() and np.abs(got).max() > 0


REFERENCES = ["repeated", "distinct", "zeros"]


def _references(x: np.ndarray, kind: str) -> np.ndarray:
    gen = np.random.default_rng(3)
    if kind == "zeros":
        return np.zeros_like(x)
    if kind == "repeated":  # as the audit passes them: one reference per sample, repeated
        refs = np.repeat(gen.normal(size=(2, *x.shape[1:])), [3, 3], axis=0).astype(np.float32)
        refs[:2] = x[:2]  # no change at all: the gradient, not the multiplier
        return refs
    return gen.normal(size=x.shape).astype(np.float32)


def _captum_deeplift(
    ctx: AttributionContext,
    x: np.ndarray,
    refs: np.ndarray,
    classes: np.ndarray,
    graph: torch.nn.Module | None = None,
) -> np.ndarray:
    model = ctx.target.wrap(graph if graph is not None else ctx.model.torch_hookable("deeplift_rescale"))
    with pytest.warns(UserWarning):
        got = DeepLift(model, multiply_by_inputs=True).attribute(
            torch.from_numpy(x), baselines=torch.from_numpy(refs), target=torch.from_numpy(classes)
        )
    return got.detach().numpy()


@pytest.mark.parametrize("kind", ["mlp", "cnn", "digits", "grouped", *BLOCKS])
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.kind)
@pytest.mark.parametrize("references", REFERENCES)
def test_deeplift_rescale_equals_captum(
    kind: str, target: Target, references: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through sums, concatenations and data movement too (the blocks). ResNet's max-pool passes its
    plain gradient here, as it does in Captum's DeepLift (the max-pool tests below)."""
    if kind == "resnet":
        monkeypatch.setattr(_rescale_graph, "_MaxPoolRescale", _PlainPool)
    ctx, x = _case(kind, target)
    refs, classes = _references(x, references), _classes(ctx, x)
    ours = get_method("deeplift_rescale").attribute(ctx, x, refs, classes)
    graph = ctx.model.torch_hookable("deeplift_rescale")
    assert RescaleGraph.build(graph, "deeplift_rescale") is not None  # the one pass, not Captum
    _assert_close(ours, _captum_deeplift(ctx, x, refs, classes))


class _PlainPool(torch.autograd.Function):
    """A max-pool that passes its plain gradient: what Captum's DeepLift delivers (see below)."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, z0: torch.Tensor, pool: torch.nn.Module) -> torch.Tensor:
        ctx.pool = pool
        ctx.save_for_backward(z)
        return pool(z)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (z,) = ctx.saved_tensors
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(ctx.pool(z), z, g)
        return grad, None, None


def _hook_takes_effect(graph: torch.nn.Module) -> fx.GraphModule:
    """A copy of ``graph`` with a copy of each max-pool's input in front of it. Captum hooks the
    tensor a module receives; a ReLU's output fed straight to a max-pool is hooked twice, and the
    ReLU's hook reads the gradient before the pool's hook has replaced it, so Captum's max-pool rule
    never reaches the inputs. Behind a copy, the ReLU's hook reads the pool's rule."""
    copied = copy.deepcopy(graph)
    assert isinstance(copied, fx.GraphModule)
    for node in list(copied.graph.nodes):
        if node.op == "call_module" and isinstance(copied.get_submodule(node.target), torch.nn.MaxPool2d):
            with copied.graph.inserting_before(node):
                clone = copied.graph.call_function(torch.clone, (node.args[0],))
            node.replace_input_with(node.args[0], clone)
    copied.recompile()
    return copied


@pytest.mark.parametrize("references", REFERENCES)
def test_deeplift_max_pool_rule_is_captums_where_its_hook_takes_effect(references: str) -> None:
    """Non-overlapping windows and a logit target: there Captum's rule, once it reaches the inputs,
    is the one this pass implements. As shipped, Captum passes the pool's plain gradient instead."""
    ctx, x = _case("maxpool", Target())
    refs, classes = _references(x, references), _classes(ctx, x)
    ours = get_method("deeplift_rescale").attribute(ctx, x, refs, classes)
    graph = ctx.model.torch_hookable("deeplift_rescale")
    _assert_close(ours, _captum_deeplift(ctx, x, refs, classes, _hook_takes_effect(graph)))
    if references == "distinct":
        shipped = _captum_deeplift(ctx, x, refs, classes, graph)
        assert np.abs(shipped - ours).max() > 1e-3 * np.abs(ours).max()


@pytest.mark.parametrize("kind", ["maxpool", "two_maxpools", "resnet"])
def test_deeplift_adds_up_through_max_pools(kind: str) -> None:
    """Summation-to-delta: the attributions add up to the logit's change, through overlapping
    windows (ResNet's 3x3 pool with stride 2) and stacked pools; Captum's DeepLift does not."""
    ctx, x = _case(kind, Target())
    refs, classes = _references(x, "distinct"), _classes(ctx, x)
    ours = get_method("deeplift_rescale").attribute(ctx, x, refs, classes)
    rows = np.arange(len(x))
    change = ctx.model.predict(x)[rows, classes] - ctx.model.predict(refs)[rows, classes]
    np.testing.assert_allclose(ours.reshape(len(x), -1).sum(axis=1), change, rtol=1e-4, atol=1e-5)
    shipped = _captum_deeplift(ctx, x, refs, classes, ctx.model.torch_hookable("deeplift_rescale"))
    assert np.abs(shipped.reshape(len(x), -1).sum(axis=1) - change).max() > 1e-3


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.kind)
def test_deepshap_equals_captum_deepliftshap_on_digits(target: Target) -> None:
    from workers.methods import attribute

    ctx, x = _case("digits", target)
    background = np.load(ASSETS / "digits_background.npy")[:5]
    classes = _classes(ctx, x)
    ours = attribute(get_method("deepshap"), ctx, x, np.zeros_like(x), classes, background)
    model = ctx.target.wrap(ctx.model.torch_hookable("deepshap"))
    with pytest.warns(UserWarning):
        want = DeepLiftShap(model).attribute(
            torch.from_numpy(x), baselines=torch.from_numpy(background), target=torch.from_numpy(classes)
        )
    _assert_close(ours, want.detach().numpy())


def test_a_graph_the_plan_refuses_keeps_captum() -> None:
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(8))
    ctx = context(sigmoid_mlp(), x)
    graph = ctx.model.torch_hookable("deeplift_rescale")
    assert RescaleGraph.build(graph, "deeplift_rescale") is None
    refs, classes = np.full_like(x.numpy(), 0.5), np.array([0, 1, 0])
    ours = get_method("deeplift_rescale").attribute(ctx, x.numpy(), refs, classes)
    np.testing.assert_allclose(ours, _captum_deeplift(ctx, x.numpy(), refs, classes), atol=1e-6)


def test_chunked_rows_give_the_same_deeplift(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.methods._modified_backward as module

    ctx, x = _case("cnn", Target())
    refs = np.repeat(x[:2] * 0.3, 3, axis=0)  # runs of one reference cut by the chunk boundaries
    classes = _classes(ctx, x)
    whole = get_method("deeplift_rescale").attribute(ctx, x, refs, classes)
    monkeypatch.setattr(module, "CHUNK", 4)
    np.testing.assert_allclose(
        get_method("deeplift_rescale").attribute(ctx, x, refs, classes), whole, atol=1e-7
    )


def test_stabilizer_is_zennits_bit_for_bit() -> None:
    from zennit.core import stabilize as zennit_stabilize

    from workers.methods._lrp_rules import stabilize

    z = torch.cat([torch.tensor([0.0, -0.0, 1e-7, -1e-7, 3.0, -3.0]), torch.randn(100)])
    for eps in (1e-6, 0.25):
        assert torch.equal(stabilize(z, eps), zennit_stabilize(z, eps))
