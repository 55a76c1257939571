"""The one-pass LRP, Deep Taylor and DeepLIFT Rescale against the field's reference implementations:
Zennit's rules (the same methods forced onto their Zennit path) and Captum's DeepLift/DeepLiftShap,
on a ReLU MLP, a ReLU CNN and the shipped digits CNN, for logit and probability targets."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from captum.attr import DeepLift, DeepLiftShap

from tests.models import CNN_SHAPE, MLP_FEATURES, maxpool_cnn, relu_cnn, relu_mlp, sigmoid_mlp
from tests.models.blocks import BLOCK_SHAPE, concatenated_block, dense_layer, shuffled_unit, small_resnet
from tests.unit.methods._context import context
from workers.methods import AttributionContext, get_method
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


def _transposed_cnn(seed: int) -> torch.nn.Module:
    """A U-Net decoder's upsampling: a transposed convolution, then a grouped one (not stacked)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(4, 4, 2, stride=2),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(4, 4, 3, padding=1, groups=2),
        torch.nn.ReLU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 3),
    ).eval()


def _two_pools(seed: int) -> torch.nn.Module:
    """Two max-pools in a chain, each behind a ReLU."""
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


# Residual sums with one overlapping max-pool, a concatenation, a batch norm after one, a channel
# split and shuffle.
BLOCKS = {
    "resnet": small_resnet,
    "concatenation": concatenated_block,
    "dense_layer": dense_layer,
    "channel_shuffle": shuffled_unit,
}
BUILDERS = {
    "mlp": relu_mlp,
    "cnn": relu_cnn,
    "maxpool": maxpool_cnn,
    "two_maxpools": _two_pools,
    "grouped": _grouped_cnn,
    "transposed": _transposed_cnn,
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


@pytest.mark.parametrize("kind", ["mlp", "cnn", "digits", "maxpool", "grouped", "transposed"])
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


@pytest.mark.parametrize(
    "kind", ["mlp", "cnn", "digits", "maxpool", "two_maxpools", "grouped", "transposed", *BLOCKS]
)
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.kind)
@pytest.mark.parametrize("references", REFERENCES)
def test_deeplift_rescale_equals_captum(kind: str, target: Target, references: str) -> None:
    """Through sums, concatenations and data movement too (the blocks); max-pools pass their
    gradient, in Captum here because a ReLU feeds each of them (see the next test)."""
    ctx, x = _case(kind, target)
    refs, classes = _references(x, references), _classes(ctx, x)
    ours = get_method("deeplift_rescale").attribute(ctx, x, refs, classes)
    graph = ctx.model.torch_hookable("deeplift_rescale")
    assert RescaleGraph.build(graph, "deeplift_rescale") is not None  # the one pass, not Captum
    _assert_close(ours, _captum_deeplift(ctx, x, refs, classes))


class _PoolThenReLU(torch.nn.Module):
    """Max-pooling straight after a convolution: the one place Captum's own max-pool rule acts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.conv = torch.nn.Conv2d(1, 3, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.head = torch.nn.Linear(48, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.pool(self.conv(x))).flatten(1))


class _GradientPool(torch.nn.Module):
    """A max-pool that Captum's DeepLift does not recognise, so autograd passes its gradient."""

    def __init__(self, pool: torch.nn.MaxPool2d) -> None:
        super().__init__()
        self.shape = (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, *self.shape)


def _pools_by_gradient(graph: torch.nn.Module) -> torch.nn.Module:
    copied = copy.deepcopy(graph)
    for name, module in list(copied.named_children()):
        if isinstance(module, torch.nn.MaxPool2d):
            setattr(copied, name, _GradientPool(module))
    return copied


@pytest.mark.parametrize("references", REFERENCES)
def test_deeplift_max_pools_pass_their_gradient(references: str) -> None:
    """DeepLIFT's reference implementation has one max-pool mode, the gradient. Captum's DeepLift
    has a rule of its own but hooks the tensor each module receives: behind a ReLU (the test
    above, every torchvision network) the ReLU's hook reads the gradient before the pool's hook
    replaces it, so the gradient passes there too. Straight after a convolution its rule acts and
    gives other numbers; this pass keeps the gradient, one rule whatever comes before the pool."""
    x = torch.randn(6, *CNN_SHAPE, generator=torch.Generator().manual_seed(31))
    ctx = context(_PoolThenReLU().eval(), x)
    x_np = x.numpy()
    refs, classes = _references(x_np, references), _classes(ctx, x_np)
    ours = get_method("deeplift_rescale").attribute(ctx, x_np, refs, classes)
    graph = ctx.model.torch_hookable("deeplift_rescale")
    _assert_close(ours, _captum_deeplift(ctx, x_np, refs, classes, _pools_by_gradient(graph)))
    if references == "distinct":  # Captum's own rule, where it acts, is another rule
        captums_rule = _captum_deeplift(ctx, x_np, refs, classes, graph)
        assert np.abs(captums_rule - ours).max() > 1e-3 * np.abs(ours).max()


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
    assert RescaleGraph.build(ctx.model.torch_hookable("deeplift_rescale"), "deeplift_rescale") is None
    refs, classes = np.full_like(x.numpy(), 0.5), np.array([0, 1, 0])
    ours = get_method("deeplift_rescale").attribute(ctx, x.numpy(), refs, classes)
    np.testing.assert_allclose(ours, _captum_deeplift(ctx, x.numpy(), refs, classes), atol=1e-6)


def test_captums_path_runs_in_bounded_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Captum's DeepLift took every row with its reference in one pass: 8 GB for 256 rows of a BERT.
    (Captum itself runs where the graph has a max-pool: forced here on a sigmoid network.)"""
    import captum.attr

    import workers.methods._passes as module
    from workers.methods._deeplift_hooks import ReferenceOnceDeepLift

    monkeypatch.setattr(ReferenceOnceDeepLift, "for_graph", classmethod(lambda cls, model, graph: None))
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(9))
    ctx = context(sigmoid_mlp(), x[:3])
    refs, classes = np.full_like(x.numpy(), 0.5), np.arange(40) % 2
    whole = get_method("deeplift_rescale").attribute(ctx, x.numpy(), refs, classes)
    calls: list[int] = []
    attribute = captum.attr.DeepLift.attribute

    def counted(self, inputs, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(inputs))
        return attribute(self, inputs, *args, **kwargs)

    monkeypatch.setattr(captum.attr.DeepLift, "attribute", counted)
    monkeypatch.setattr(module, "CHUNK", 8)
    cut = get_method("deeplift_rescale").attribute(ctx, x.numpy(), refs, classes)
    assert calls == [4] * 10  # a pass of 8 rows: 4 and their references
    # float32 noise only: a matmul of 4 rows may take another kernel than one of 40 (1.4e-6 on one
    # host), and the sigmoid's multiplier divides by z - z0
    np.testing.assert_allclose(cut, whole, atol=1e-5)


def test_chunked_rows_give_the_same_deeplift(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.methods._passes as module

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


@pytest.mark.parametrize("used", ["both", "positive", "negative"])
def test_signed_parts_have_the_clamps_gradient_bit_for_bit(used: str) -> None:
    """alpha-beta's parts a+ and a- of a signed input: torch's clamp gradient (0 at +0.0 and -0.0)
    without its masks, for either part alone too."""
    from workers.methods._lrp_rules import _signed_parts

    gen = torch.Generator().manual_seed(3)
    a = torch.cat([torch.tensor([0.0, -0.0, 1e-30, -1e-30]), torch.randn(60, generator=gen)]).reshape(8, 8)
    g_pos, g_neg = torch.randn(2, 8, 8, generator=gen)
    weights = {"both": (g_pos, g_neg), "positive": (g_pos, None), "negative": (None, g_neg)}[used]

    def gradient(parts: list[torch.Tensor], at: torch.Tensor) -> torch.Tensor:
        total = sum((p * w).sum() for p, w in zip(parts, weights, strict=True) if w is not None)
        (grad,) = torch.autograd.grad(total, at)
        return grad

    ours_at, theirs_at = a.clone().requires_grad_(True), a.clone().requires_grad_(True)
    ours = _signed_parts(ours_at)
    theirs = [theirs_at.clamp(min=0), theirs_at.clamp(max=0)]
    assert all(torch.equal(o, t) for o, t in zip(ours, theirs, strict=True))
    assert torch.equal(gradient(ours, ours_at), gradient(theirs, theirs_at))


@pytest.mark.parametrize(
    "activation", [torch.nn.GELU(), torch.nn.SiLU(), torch.nn.Hardswish(), torch.nn.Tanh(), torch.nn.ReLU6()]
)
def test_passed_activations_scale_by_value_over_input_and_zero_at_zero(activation: torch.nn.Module) -> None:
    """Relevance passed through an activation: the gradient is activation(z) / z, 0 at +0.0 and -0.0
    (no NaN from 0 / 0), bit for bit, subnormal inputs included."""
    from workers.methods._modified_backward import _passed

    special = torch.tensor([0.0, -0.0, 1e-38, -1e-38, 1e-45, -1e-45, 7.0, -7.0])
    z = torch.cat([special, torch.randn(120, generator=torch.Generator().manual_seed(2)) * 5]).reshape(2, -1)
    z.requires_grad_(True)
    y = activation(z).detach()
    (grad,) = torch.autograd.grad(_passed(activation, z).sum(), z)
    assert torch.equal(grad, torch.where(z.detach() != 0, y / z.detach(), torch.zeros_like(y)))
    assert bool(torch.isfinite(grad).all())
