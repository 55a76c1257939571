"""Classifiers exported with their probabilities: a Softmax, LogSoftmax or Sigmoid as the model's
output. The rule methods cross it as they cross a probability target's softmax (docs/science.md 5.8):
LRP and DeepLIFT Rescale by its gradient, RevealCancel by the gradient averaged along the path from
the reference's output, which keeps summation-to-delta. So a model with a Softmax head explains as its
headless twin does for the probability target, and the report says the head was crossed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from workers.methods import AttributionContext, get_method
from workers.methods._fx_plan import family_plan
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

SHAPE = (1, 6, 6)
X = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(41))
X0 = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(42)) * 0.3
RULE_METHODS = ("lrp_epsilon", "lrp_alpha_beta", "deep_taylor", "deeplift_rescale", "deeplift_revealcancel")


def _body(outputs: int) -> nn.Sequential:
    torch.manual_seed(43)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, outputs)
    ).eval()


def _context(model: nn.Module, target: Target, dynamo: bool = False) -> AttributionContext:
    loaded = load_model(to_onnx(model, X[:1], opset=18 if dynamo else 17, dynamo=dynamo), "onnx", "cpu")
    loaded.check_sample(X.numpy())
    return AttributionContext(loaded, parse_players("grid:2x2", SHAPE), target, {})


def _attribute(ctx: AttributionContext, name: str, classes: np.ndarray) -> np.ndarray:
    method = get_method(name)
    params = method.bind(method.params_from({}), X.numpy(), (X0.numpy(),))
    ctx = AttributionContext(ctx.model, ctx.players, ctx.target, params)
    return method.attribute(ctx, X.numpy(), X0.numpy(), classes)


# A head, the number of outputs, and the headless twin's target that reads the same score.
HEADS = {"softmax": (nn.Softmax(dim=1), 3), "sigmoid": (nn.Sigmoid(), 1)}


CASES = [(name, head, False) for name in RULE_METHODS for head in sorted(HEADS)] + [
    ("lrp_epsilon", "softmax", True),  # the dynamo exporter writes its own Softmax
    ("deeplift_revealcancel", "sigmoid", True),
]


@pytest.mark.parametrize(("name", "head", "dynamo"), CASES)
def test_a_head_is_crossed_as_the_probability_target_is(name: str, head: str, dynamo: bool) -> None:
    module, outputs = HEADS[head]
    body = _body(outputs)
    headed = _context(nn.Sequential(body, module).eval(), Target(), dynamo)
    twin = _context(body, Target("prob"), dynamo)
    classes = np.array([0, 2, 1, 0]) if outputs == 3 else np.zeros(4, np.int64)
    got = _attribute(headed, name, classes)
    want = _attribute(twin, name, classes)
    assert np.abs(want).max() > 1e-6
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("head", [nn.Softmax(dim=1), nn.LogSoftmax(dim=1), nn.Sigmoid()], ids=str)
def test_revealcancel_adds_up_to_the_change_of_the_models_own_output(head: nn.Module) -> None:
    model = nn.Sequential(_body(3), head).eval()
    ctx = _context(model, Target())
    classes = np.array([0, 1, 2, 1])
    attributions = _attribute(ctx, "deeplift_revealcancel", classes)
    with torch.no_grad():
        change = (model(X) - model(X0)).numpy()[np.arange(4), classes]
    np.testing.assert_allclose(attributions.reshape(4, -1).sum(1), change, rtol=1e-4, atol=1e-6)


def test_the_report_says_the_head_was_crossed_and_other_softmaxes_stay_refused() -> None:
    ctx = _context(nn.Sequential(_body(3), nn.Softmax(dim=1)).eval(), Target())
    for name in ("lrp_epsilon", "deeplift_rescale"):
        said = get_method(name).implementation(ctx.model)
        assert said is not None and "output Softmax is crossed by its gradient" in said, said
    assert get_method("lrp_epsilon").implementation(_context(_body(3), Target()).model) is None
    # A softmax inside the network (attention-like) is no output head.
    inner = nn.Sequential(_body(3), nn.Softmax(dim=1), nn.Linear(3, 2)).eval()
    graph = _context(inner, Target()).model.torch_hookable("lrp_epsilon")
    with pytest.raises(NotApplicable, match="operator Softmax"):
        family_plan(graph, "lrp_epsilon", "LRP")


def test_inspect_says_what_a_head_means_for_the_target() -> None:
    from workers.inspect_model import inspect_model

    for head, said in ((nn.Softmax(dim=1), "--target prob or logodds would take a softmax of them again"),
                       (nn.LogSoftmax(dim=1), "--target prob reads the probabilities")):  # fmt: skip
        check = inspect_model(to_onnx(nn.Sequential(_body(3), head).eval(), X[:1]))
        assert check.output_head == type(head).__name__ and said in check.text()
        assert check.methods["deeplift_revealcancel"].startswith("runs")
    assert inspect_model(to_onnx(_body(3), X[:1])).output_head == ""
