"""Graphs that fold several entries per row into the batch axis (Swin's attention windows, the tiles
of a multiple-instance model), or keep it second (torch's transformer layers by default): DeepLIFT's
passes read each row's reference values block by block, along the batch axis
(workers.methods._base.at_references). Before, Rescale's own pass and the Captum-hooks pass raised
on them, and RevealCancel took the first block's reference for every block, silently: its
attributions no longer added up to the change of the output."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tests.unit.methods._context import context
from workers.methods import get_method
from workers.methods._base import at_references
from workers.methods._captum_deeplift import RowwiseDeepLift


class _Folded(nn.Module):
    """A convolution's four channels folded into the batch, each through one shared convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(4 * 2 * 64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tiles = torch.relu(self.a(x)).reshape(-1, 1, 8, 8)  # (rows * 4, 1, 8, 8)
        return self.head(torch.relu(self.b(tiles)).reshape(-1, 4 * 2 * 64))


def _unfolded(folded: _Folded) -> nn.Sequential:
    """The same function without the fold: the shared convolution as a grouped one."""
    grouped = nn.Conv2d(4, 8, 3, padding=1, groups=4)
    with torch.no_grad():
        grouped.weight.copy_(folded.b.weight.repeat(4, 1, 1, 1))
        grouped.bias.copy_(folded.b.bias.repeat(4))
    return nn.Sequential(folded.a, nn.ReLU(), grouped, nn.ReLU(), nn.Flatten(), folded.head).eval()


def _case(references: str) -> tuple[_Folded, torch.Tensor, torch.Tensor, np.ndarray]:
    torch.manual_seed(0)
    model = _Folded().eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 8, 8, generator=gen)
    x0 = torch.full_like(x, 0.2) if references == "one" else torch.randn(6, 1, 8, 8, generator=gen)
    return model, x, x0, np.array([0, 1, 2, 0, 1, 2])


@pytest.mark.parametrize("references", ["one", "distinct"])
def test_rescale_on_a_folded_batch_is_captums(references: str) -> None:
    model, x, x0, classes = _case(references)
    ctx = context(model, x[:1])
    assert get_method("deeplift_rescale").implementation(ctx.model).startswith("xaudit's Rescale pass")
    graph = ctx.target.wrap(ctx.model.torch_hookable("deeplift_rescale"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = RowwiseDeepLift(graph, multiply_by_inputs=True).attribute(
            x, baselines=x0, target=torch.from_numpy(classes)
        )
    got = get_method("deeplift_rescale").attribute(ctx, x.numpy(), x0.numpy(), classes)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("references", ["one", "distinct"])
def test_revealcancel_on_a_folded_batch_is_the_unfolded_models(references: str) -> None:
    model, x, x0, classes = _case(references)
    twin = _unfolded(model)
    np.testing.assert_allclose(twin(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    got = get_method("deeplift_revealcancel").attribute(context(model, x[:1]), x.numpy(), x0.numpy(), classes)
    want = get_method("deeplift_revealcancel").attribute(context(twin, x[:1]), x.numpy(), x0.numpy(), classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    change = (model(x) - model(x0)).detach().numpy()[np.arange(6), classes]
    np.testing.assert_allclose(got.reshape(6, -1).sum(1), change, rtol=1e-4, atol=1e-5)


class _SequenceFirst(nn.Module):
    """torch's transformer layers in their default (sequence, batch, features) layout inside a model
    that takes (batch, sequence, features); ``batch_first`` gives the same function batch first."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.batch_first = batch_first
        self.inp, self.head = nn.Linear(6, 16), nn.Linear(16, 3)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if self.batch_first:
            return self.head(self.enc(h).mean(1))
        return self.head(self.enc(h.transpose(0, 1)).mean(0))


def test_deeplift_with_the_batch_on_the_second_axis_is_the_batch_first_twins() -> None:
    """Captum's own DeepLift halves its doubled batch along the first axis, which is the sequence
    here: on this graph it is 7.5% of the largest attribution off its batch-first twin. xaudit's
    pass spreads the references along the batch axis and gives the twin's attributions."""
    second, first = _SequenceFirst(batch_first=False).eval(), _SequenceFirst(batch_first=True).eval()
    first.load_state_dict(second.state_dict())
    gen = torch.Generator().manual_seed(3)
    # References shared by consecutive rows, as the audit's sub-inputs of one sample share one.
    x, x0 = torch.rand(3, 8, 6, generator=gen), torch.rand(2, 8, 6, generator=gen)[[0, 0, 1]]
    np.testing.assert_allclose(first(x).detach().numpy(), second(x).detach().numpy(), atol=1e-6)
    classes = np.array([0, 1, 2])
    got, want = (
        get_method("deeplift_rescale").attribute(context(m, x[:1]), x.numpy(), x0.numpy(), classes)
        for m in (second, first)
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    assert np.abs(want).max() > 1e-3


def test_reference_values_are_spread_row_by_row_block_by_block() -> None:
    refs = torch.arange(2 * 3 * 2.0).reshape(6, 2)  # 2 references, 3 entries per row each
    runs = torch.tensor([1, 0, 1, 1])
    spread = at_references(refs, (12, 2), 2, runs, 4)
    assert torch.equal(spread.reshape(4, 3, 2), refs.reshape(2, 3, 2)[runs])
    one = at_references(refs[:3], (12, 2), 1, torch.zeros(4, dtype=torch.long), 4)
    assert torch.equal(one, refs[:3].repeat(4, 1))
    per_row = torch.arange(4.0)[:, None]  # one entry per row: indexed, or a single row broadcast
    assert torch.equal(at_references(per_row, (3, 1), 4, torch.tensor([3, 3, 0]), 3), per_row[[3, 3, 0]])
    assert at_references(per_row, (3, 1), 4, torch.tensor([2, 2, 2]), 3).shape == (1, 1)
    # A chunk of as many rows as there are references, all of one (RevealCancel passes in chunks).
    assert torch.equal(
        at_references(per_row, (4, 1), 4, torch.tensor([2, 2, 3, 3]), 4), per_row[[2, 2, 3, 3]]
    )
    assert at_references(per_row, (4, 1), 4, torch.arange(4), 4) is per_row  # each row its own, in order
    # (sequence, batch, features), torch's default for its transformer layers: the batch is axis 1.
    seq = torch.arange(5 * 3 * 2.0).reshape(5, 3, 2)  # 3 references
    assert torch.equal(at_references(seq, (5, 4, 2), 3, runs, 4), seq[:, runs])
    assert at_references(seq[:, :1], (5, 4, 2), 1, torch.zeros(4, dtype=torch.long), 4).shape == (5, 1, 2)
    with pytest.raises(ValueError, match="not a batch of rows"):
        at_references(torch.ones(5, 2, 2), (5, 3, 2), 2, torch.tensor([0, 1, 1]), 2)
