"""Captum's DeepLift with each reference evaluated once (workers/methods/_deeplift_hooks.py) gives
Captum's own attributions (RowwiseDeepLift on the doubled batch) on the graphs xaudit's Rescale
pass leaves to Captum: sigmoid and tanh-family activations, squeeze-and-excitation gates and SiLU
written as ``x * sigmoid(x)`` (Captum's hook on the Sigmoid's input replaces that tensor's whole
gradient, the Mul's share included: reproduced, not corrected), a softmax inside the network, a GRU,
softmaxes over windows folded into the batch (Swin's attention)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import sigmoid_mlp
from tests.unit.methods._context import context
from tests.unit.methods.test_modified_backward import REFERENCES, TARGETS, _assert_close, _references
from workers.methods import get_method
from workers.methods._captum_deeplift import RowwiseDeepLift
from workers.methods._deeplift_hooks import ModuleCalledTwice, ReferenceOnceDeepLift
from workers.methods._rescale_graph import RescaleGraph
from workers.targets import Target


class _SqueezeExcite(nn.Module):
    """A convolution, SiLU as x * sigmoid(x), a squeeze-and-excitation gate (mean, ReLU, Sigmoid)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.squeeze, self.excite = nn.Linear(4, 2), nn.Linear(2, 4)
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv(x)
        a = a * torch.sigmoid(a)
        gate = torch.sigmoid(self.excite(torch.relu(self.squeeze(a.mean((2, 3))))))
        return self.head((a * gate[:, :, None, None]).flatten(1))


class _SoftmaxInside(nn.Module):
    """Tanh, ELU, LeakyReLU and Softplus layers around a softmax over hidden units."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.softmax(torch.tanh(self.a(x)), dim=1)
        h = nn.functional.leaky_relu(nn.functional.elu(self.b(h)), 0.1)
        return self.d(nn.functional.softplus(self.c(h)))


class _Recurrent(nn.Module):
    """A GRU over 5 steps of 4 features, its last state read by a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.head = nn.GRU(4, 6, batch_first=True), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(torch.tanh(out[:, -1]))


class _Windows(nn.Module):
    """Attention-like softmaxes over windows folded into the batch, as Swin partitions its tokens:
    the hooked Softmax sees four entries per row along its first axis."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        windows = self.a(x).reshape(-1, 4)  # (rows * 4, 4), row-major
        return self.b(torch.tanh(torch.softmax(windows, dim=1)).reshape(-1, 16))


class _PoolThenSigmoid(nn.Module):
    """A max-pool straight after a convolution (Captum's own max-pool rule acts) and a Sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.pool, self.head = nn.Conv2d(1, 3, 3, padding=1), nn.MaxPool2d(2), nn.Linear(48, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.sigmoid(self.pool(self.conv(x))).flatten(1))


SHAPES = {
    "sigmoid_mlp": (4,),
    "squeeze_excite": (1, 8, 8),
    "softmax_inside": (4,),
    "gru": (5, 4),
    "windows": (16,),
}


def _module(kind: str) -> nn.Module:
    torch.manual_seed(11)
    builders = {
        "sigmoid_mlp": sigmoid_mlp,
        "squeeze_excite": _SqueezeExcite,
        "softmax_inside": _SoftmaxInside,
        "gru": _Recurrent,
        "windows": _Windows,
    }
    return builders[kind]().eval()


def _captum(
    ctx: object, graph: nn.Module, x: np.ndarray, refs: np.ndarray, classes: np.ndarray
) -> np.ndarray:
    model = ctx.target.wrap(graph)  # type: ignore[attr-defined]
    with pytest.warns(UserWarning):
        got = RowwiseDeepLift(model, multiply_by_inputs=True).attribute(
            torch.from_numpy(x), baselines=torch.from_numpy(refs), target=torch.from_numpy(classes)
        )
    return got.detach().numpy()


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.kind)
@pytest.mark.parametrize("references", REFERENCES)
def test_reference_once_equals_captums_deeplift(kind: str, target: Target, references: str) -> None:
    x = torch.randn(6, *SHAPES[kind], generator=torch.Generator().manual_seed(31))
    ctx = context(_module(kind), x, target=target)
    graph = ctx.model.torch_hookable("deeplift_rescale")
    assert RescaleGraph.build(graph, "deeplift_rescale") is None  # a graph left to Captum
    assert ReferenceOnceDeepLift.for_graph(target.wrap(graph), graph) is not None  # ... taken here
    x_np = x.numpy()
    refs, classes = _references(x_np, references), target.resolve_classes(ctx.model.predict(x_np))
    ours = get_method("deeplift_rescale").attribute(ctx, x_np, refs, classes)
    want = _captum(ctx, graph, x_np, refs, classes)
    # float32: the references' values come from another batch than Captum's, so rounding differs,
    # and a difference quotient dy / dx of small differences magnifies it (to 3e-5 of the largest
    # attribution after the softmax); in float64 the two agree to 1e-13 (the next test)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-4 * scale)


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("references", REFERENCES)
def test_reference_once_is_captums_deeplift_in_float64(kind: str, references: str) -> None:
    x = torch.randn(6, *SHAPES[kind], generator=torch.Generator().manual_seed(31))
    ctx = context(_module(kind), x)
    graph = ctx.model.torch_hookable("deeplift_rescale").double()
    model = ctx.target.wrap(graph)
    refs = torch.from_numpy(_references(x.numpy(), references)).double()
    classes = torch.from_numpy(ctx.target.resolve_classes(ctx.model.predict(x.numpy())))
    with pytest.warns(UserWarning):
        want = RowwiseDeepLift(model, multiply_by_inputs=True).attribute(
            x.double(), baselines=refs, target=classes
        )
    once = ReferenceOnceDeepLift.for_graph(model, graph)
    assert once is not None
    with torch.enable_grad():
        ours = once.attributions(x.double(), refs, classes)
    assert float((ours - want).abs().max()) <= 1e-12 * float(want.abs().max())


def test_squeeze_excite_hooks_replace_the_whole_gradient_as_captum_does() -> None:
    """The comparison above could pass if both dropped the hooks: the attributions differ from
    plain gradient x (x - x0), and from a hook that replaced only the Sigmoid's own path."""
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(31))
    ctx = context(_module("squeeze_excite"), x)
    x_np, refs = x.numpy(), np.zeros_like(x.numpy())
    classes = ctx.target.resolve_classes(ctx.model.predict(x_np))
    ours = get_method("deeplift_rescale").attribute(ctx, x_np, refs, classes)
    plain = get_method("gradient_x_input").attribute(ctx, x_np, refs, classes)
    assert np.abs(ours - plain).max() > 1e-3 * np.abs(ours).max()


def test_max_pools_stay_on_captum() -> None:
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(31))
    torch.manual_seed(5)
    ctx = context(_PoolThenSigmoid().eval(), x)
    graph = ctx.model.torch_hookable("deeplift_rescale")
    assert ReferenceOnceDeepLift.for_graph(ctx.target.wrap(graph), graph) is None
    x_np = x.numpy()
    refs, classes = _references(x_np, "distinct"), ctx.target.resolve_classes(ctx.model.predict(x_np))
    ours = get_method("deeplift_rescale").attribute(ctx, x_np, refs, classes)
    _assert_close(ours, _captum(ctx, graph, x_np, refs, classes))


def test_a_module_called_twice_is_refused_before_any_gradient() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer, self.act = nn.Linear(4, 4), nn.Sigmoid()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.layer(self.act(x)))

    graph = Twice()
    once = ReferenceOnceDeepLift.for_graph(graph, graph)
    assert once is not None
    x = torch.randn(3, 4)
    with pytest.raises(ModuleCalledTwice):
        once.attributions(x, torch.zeros_like(x), torch.zeros(3, dtype=torch.long))


def test_passes_are_bounded_and_take_the_whole_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass holds as many rows as a plain forward+backward (no doubled batch), and the rows cut
    into passes give the same attributions."""
    import workers.methods._passes as passes

    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(9))
    ctx = context(sigmoid_mlp(), x[:3])
    refs, classes = np.full_like(x.numpy(), 0.5), np.arange(40) % 2
    whole = get_method("deeplift_rescale").attribute(ctx, x.numpy(), refs, classes)
    calls: list[int] = []
    attributions = ReferenceOnceDeepLift.attributions

    def counted(self, x, x0, classes):  # type: ignore[no-untyped-def]
        calls.append(len(x))
        return attributions(self, x, x0, classes)

    monkeypatch.setattr(ReferenceOnceDeepLift, "attributions", counted)
    monkeypatch.setattr(passes, "CHUNK", 8)
    cut = get_method("deeplift_rescale").attribute(ctx, x.numpy(), refs, classes)
    assert calls == [8] * 5
    np.testing.assert_allclose(cut, whole, atol=1e-5)
