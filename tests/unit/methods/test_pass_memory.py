"""Gradient passes and Integrated Gradients' path points are bounded by input elements, not rows
(workers/methods/_passes.py): at 224x224 a fixed 512 rows per backward pass held 14 GB for
resnet18, and a fixed 8,192 path points 4.9 GB each for the points and their gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import workers.methods._autograd as autograd
import workers.methods._passes as passes
from tests.unit.methods._context import context
from workers.methods import get_method

SHAPE = (3, 224, 224)


def _image_net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 2, 8, stride=8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 3)
    )


def _recorded(monkeypatch: pytest.MonkeyPatch, ctx) -> list[int]:  # type: ignore[no-untyped-def]
    """Rows of every forward pass of ``ctx``'s differentiable graph."""
    graph, rows = ctx.model.torch_differentiable(), []
    forward = graph.forward

    def recording(x: torch.Tensor) -> torch.Tensor:
        rows.append(len(x))
        return forward(x)

    monkeypatch.setattr(graph, "forward", recording)
    return rows


def _gradient_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of every call of ``target_gradients_tensor`` from now on (the points or noisy copies a
    method holds at once)."""
    rows: list[int] = []
    gradients = autograd.target_gradients_tensor

    def recording(ctx, at, classes):  # type: ignore[no-untyped-def]
        rows.append(len(at))
        return gradients(ctx, at, classes)

    monkeypatch.setattr(autograd, "target_gradients_tensor", recording)
    return rows


def test_gradient_passes_hold_a_bounded_number_of_input_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.rand(64, *SHAPE, generator=torch.Generator().manual_seed(1))
    ctx = context(_image_net(), x[:1])
    classes, refs = np.zeros(64, dtype=np.int64), np.zeros_like(x.numpy())
    rows = _recorded(monkeypatch, ctx)
    cut = get_method("gradient_x_input").attribute(ctx, x.numpy(), refs, classes)
    assert passes.ELEMENTS // (3 * 224 * 224) == 27
    # the probe of one and two rows (saved bytes, cached), then the fewest passes of at most 27 rows,
    # as equal as they come: this graph saves little per row
    assert rows == [1, 2, 22, 22, 20]
    rows.clear()
    monkeypatch.setattr(passes, "ELEMENTS", 2**40)
    whole = get_method("gradient_x_input").attribute(ctx, x.numpy(), refs, classes)
    assert rows == [64]
    np.testing.assert_allclose(cut, whole, rtol=1e-6, atol=1e-7)


def test_small_inputs_keep_large_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.rand(3000, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    ctx = context(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), x[:1])
    rows = _recorded(monkeypatch, ctx)
    get_method("gradient_x_input").attribute(
        ctx, x.numpy(), np.zeros_like(x.numpy()), np.zeros(3000, dtype=np.int64)
    )
    assert rows == [1, 2, 1000, 1000, 1000]  # the probe, then passes.CHUNK rows at most


@pytest.mark.parametrize("form", ["onnx", "torchscript"])
def test_a_graph_that_saves_much_per_row_takes_fewer_rows(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input elements undercount what a transformer's pass holds: 64 inputs to a hidden layer of
    16,384 units save 64 KB per row, all of it the ReLU's output, whatever the input's size."""
    torch.manual_seed(6)
    module = nn.Sequential(nn.Linear(64, 16384), nn.ReLU(), nn.Linear(16384, 3))
    x = torch.rand(100, 64, generator=torch.Generator().manual_seed(7))
    ctx = context(module, x[:2], fmt=form)
    per_row = passes.saved_bytes_per_row(ctx.model.torch_differentiable(), x)
    assert 16384 * 4 <= per_row <= 3 * 16384 * 4
    monkeypatch.setattr(passes, "SAVED_BYTES", 16 * per_row)
    rows = _recorded(monkeypatch, ctx)
    classes, refs = np.zeros(100, dtype=np.int64), np.zeros_like(x.numpy())
    cut = get_method("gradient_x_input").attribute(ctx, x.numpy(), refs, classes)
    assert rows == [15] * 6 + [10]  # 16 rows at most: seven passes, as equal as they come
    rows.clear()
    monkeypatch.setattr(passes, "SAVED_BYTES", 2**40)
    whole = get_method("gradient_x_input").attribute(ctx, x.numpy(), refs, classes)
    assert rows == [100]
    np.testing.assert_allclose(cut, whole, rtol=1e-5, atol=1e-6)


def test_integrated_gradients_holds_a_bounded_number_of_path_points(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(4))
    ctx = context(_image_net(), x[:1], params={"steps": 64})
    points = _gradient_calls(monkeypatch)
    method, refs, classes = (
        get_method("integrated_gradients"),
        np.zeros_like(x.numpy()),
        np.array([0, 1, 2, 0]),
    )
    cut = method.attribute(ctx, x.numpy(), refs, classes)
    assert points == [64, 64, 64, 64]  # 2**24 elements hold 111 points: one row's 64 steps per chunk
    points.clear()
    monkeypatch.setattr("workers.methods.integrated_gradients._POINT_ELEMENTS", 2**40)
    whole = method.attribute(ctx, x.numpy(), refs, classes)
    assert points == [256]
    np.testing.assert_allclose(cut, whole, rtol=1e-6, atol=1e-7)


def test_smoothgrad_draws_its_noise_in_bounded_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """SmoothGrad held its noise, the noisy copies and their gradients for every copy of a call at once:
    6 GB for an audit call at 224x224 with the default 32 copies."""
    x = torch.rand(6, *SHAPE, generator=torch.Generator().manual_seed(5))
    ctx = context(_image_net(), x[:1], params={"samples": 32})
    classes, refs = np.array([0, 1, 2, 0, 1, 2]), np.zeros_like(x.numpy())
    held = _gradient_calls(monkeypatch)  # noisy rows held at once
    cut = get_method("smoothgrad").attribute(ctx, x.numpy(), refs, classes)
    assert held == [24] * 8  # 2**22 elements hold 4 noisy copies of the 6 rows
    held.clear()
    monkeypatch.setattr(passes, "ELEMENTS", 2**40)
    whole = get_method("smoothgrad").attribute(ctx, x.numpy(), refs, classes)
    assert held == [192]
    np.testing.assert_allclose(cut, whole, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("samples", "elements", "budget"), [(32, 6 * 150528, 2**22), (50, 100, 1000), (40, 5, 64), (33, 5, 64)]
)
def test_smoothgrads_groups_draw_the_noise_of_one_draw(samples: int, elements: int, budget: int) -> None:
    """The same seed gives the same noise however the copies are grouped (torch draws normals in
    blocks of 16; the groups keep to them), so a job's SmoothGrad does not depend on the budget."""
    from workers.methods.saliency import noise_groups

    groups = noise_groups(samples, elements, budget)
    assert sum(groups) == samples and len(groups) > 1
    assert all(g * elements <= max(budget, 32 * elements) for g in groups)
    one = torch.randn((samples, elements), generator=torch.Generator().manual_seed(9))
    generator = torch.Generator().manual_seed(9)
    grouped = torch.cat([torch.randn((g, elements), generator=generator) for g in groups])
    assert torch.equal(one, grouped)


def test_the_probe_runs_once_for_every_samples_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token model's head is bound to each sample in a new module: the probe is kept per shared graph,
    not run again on every call (two extra forwards per pass of a few dozen rows)."""
    from tests.unit.multi_input.models import tiny_token_job

    prep = tiny_token_job()
    head = prep.model.for_sample(0).embedding.head
    first, second = head.torch_differentiable(), head.torch_differentiable()
    assert first is not second
    x = torch.rand(4, 6, 16)
    probes: list[int] = []
    saved = passes._saved_bytes
    monkeypatch.setattr(
        passes, "_saved_bytes", lambda graph, rows: probes.append(len(rows)) or saved(graph, rows)
    )
    assert passes.saved_bytes_per_row(first, x) == passes.saved_bytes_per_row(second, x) > 0
    assert probes == [1, 2]
