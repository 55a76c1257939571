"""Volumes (CT, MRI: (C, D, H, W) samples, as MONAI's 3-D networks take them): ``grid:DxRxC`` players
are blocks over depth, height and width, the default for a volume is ``grid:2x2x2``, a blur runs over
depth too, and occlusion_patch's windows slide within each depth slab. Before, a volume's players
were columns through its whole depth (``grid:RxC`` over the last two axes) and nothing else could
be asked for without a mask file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter
from torch import nn

from clients.render import render_html
from clients.render._data import players_of
from clients.render._figures import _spatial
from tests.models import to_onnx
from tests.unit.render._html import parse
from workers.audit import run_audit
from workers.audit.schema import validate_report
from workers.inspect_model import inspect_model
from workers.methods import AttributionContext, get_method
from workers.methods.occlusion import patch_windows
from workers.models import load_model
from workers.players import auto_players, parse_players
from workers.prepare import prepare
from workers.references import make_baselines
from workers.targets import Target
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec
from xaudit.contract.subspecs import parse_players as parse_player_spec

_VOLUME = (1, 6, 8, 10)  # channels, depth, height, width


def test_the_contract_reads_two_and_three_sides() -> None:
    volume, image = parse_player_spec("grid:2x3x4"), parse_player_spec("grid:3x4")
    assert (volume.depth, volume.rows, volume.cols) == (2, 3, 4)
    assert (image.depth, image.rows, image.cols) == (0, 3, 4)
    for bad in ("grid:2x2x2x2", "grid:0x2x2", "grid:2x", "grid:2x2x-1"):
        with pytest.raises(InvalidInput, match="grid"):
            parse_player_spec(bad)


def test_blocks_over_depth_height_and_width() -> None:
    players = parse_players("grid:2x2x5", _VOLUME)
    assert players.n == 20 and players.layout == (2, 2, 5)
    assert players.names[:3] == ("d0r0c0", "d0r0c1", "d0r0c2") and players.names[-1] == "d1r1c4"
    attributions = np.random.default_rng(0).normal(size=(3, *_VOLUME))
    # the closed form: (3, 1, 2 depth blocks of 3, 2 row blocks of 4, 5 column blocks of 2) summed
    blocks = attributions.reshape(3, 1, 2, 3, 2, 4, 5, 2).sum(axis=(1, 3, 5, 7)).reshape(3, -1)
    np.testing.assert_allclose(players.sum_per_player(attributions), blocks, rtol=1e-10)


def test_a_channels_last_volume_has_the_same_blocks() -> None:
    first = parse_players("grid:2x2x2", (1, 6, 8, 10)).labels[0]
    last = parse_players("grid:2x2x2", (6, 8, 10, 1)).labels[..., 0]
    np.testing.assert_array_equal(first, last)


@pytest.mark.parametrize(
    ("shape", "spec"),
    [((1, 8, 8, 8), "grid:2x2x2"), ((2, 16, 32, 32), "grid:2x2x2"), ((16, 16, 16, 1), "grid:2x2x2"),
     ((3, 32, 32), "grid:3x3"), ((32, 32, 3), "grid:3x3"), ((1, 4, 32, 32), "grid:2x2x2")],
)  # fmt: skip
def test_the_default_players(shape: tuple[int, ...], spec: str) -> None:
    assert auto_players(shape) == spec
    assert parse_players("auto", shape).spec == spec


def test_a_grid_that_does_not_fit_is_refused() -> None:
    with pytest.raises(InvalidInput, match="three spatial axes"):
        parse_players("grid:2x2x2", (8, 8))
    with pytest.raises(InvalidInput, match="6x8x10"):
        parse_players("grid:7x2x2", _VOLUME)


def test_a_volume_is_blurred_over_its_depth_too() -> None:
    x = np.random.default_rng(1).normal(size=(2, *_VOLUME)).astype(np.float32)
    want = gaussian_filter(x.astype(np.float64), sigma=(0, 0, 1.5, 1.5, 1.5), mode="nearest")
    np.testing.assert_allclose(make_baselines("blur:1.5", x), want, rtol=1e-5, atol=1e-6)
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1))
    np.testing.assert_allclose(
        make_baselines("blur:1.5", last), want.transpose(0, 2, 3, 4, 1), rtol=1e-5, atol=1e-6
    )


def test_occlusion_patches_stay_in_their_depth_slab() -> None:
    windows = patch_windows((2, 3, 3), (2, 2), (1, 1))
    assert windows.shape == (8, 18) and (windows.sum(axis=1) == 4).all()
    slab = np.arange(18) // 9
    assert all(len(set(slab[w])) == 1 for w in windows)


class _Linear3d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, *_VOLUME, generator=torch.Generator().manual_seed(2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight).sum(dim=(1, 2, 3, 4))[:, None]


def test_shapley_values_of_a_linear_model_are_its_blocks() -> None:
    """For f(x) = sum w x, the Shapley value of a block is the sum of w (x - b) over it: the game's
    players are the blocks."""
    model = _Linear3d().eval()
    x = np.random.default_rng(3).normal(size=(2, *_VOLUME)).astype(np.float32)
    b = np.zeros_like(x)
    players = parse_players("grid:2x2x2", _VOLUME)
    ctx = AttributionContext(
        load_model(to_onnx(model, torch.from_numpy(x[:1])), "onnx", "cpu"), players, Target(), {}
    )
    got = players.sum_per_player(
        get_method("shapley_value").attribute(ctx, x, b, np.zeros(2, dtype=np.int64))
    )
    want = players.sum_per_player(model.weight.detach().numpy() * (x - b))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_audit_of_a_volume_reports_its_layout() -> None:
    net = nn.Sequential(
        nn.Conv3d(1, 2, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(2, 2)
    )
    torch.manual_seed(4)
    x = np.random.default_rng(4).normal(size=(2, *_VOLUME)).astype(np.float32)
    spec = JobSpec(players="auto", baseline="blur", target="class:0", device="cpu",
                   methods=("shapley_value", "occlusion_patch", "gradient_x_input"))  # fmt: skip
    model = to_onnx(net.eval(), torch.from_numpy(x[:1]))
    assert "players by default: grid:2x2x2, blocks over the volume's depth" in inspect_model(model).text()
    result = run_audit(prepare(spec, model, None, {"inputs": x}))
    report = result.report
    validate_report(report)
    assert report["game"]["layout"] == [2, 2, 2] and report["game"]["n"] == 8
    assert report["game"]["players"][7]["name"] == "d1r1c1"
    # the page draws each map summed over depth, with the grid's rows and columns
    players = players_of(report)
    assert (players.depth, players.layout, players.is_grid) == (2, (2, 2), True)
    html = render_html(report, attributions=result.attributions, inputs=x)
    assert "the input's middle depth slice" in html and "summed over depth" in html
    page = parse(html)
    for name, maps in result.attributions.items():
        assert f"{name} total {float(maps[0].sum()):+.3g}" in page.images["grid-0"]["alt"]
    heat, _ = _spatial(result.attributions["gradient_x_input"][0])
    np.testing.assert_allclose(
        heat, result.attributions["gradient_x_input"][0].astype(np.float64).sum(axis=(0, 1)), rtol=1e-10
    )


class _Tiles(nn.Module):
    """A multiple-instance model: each of a sample's tiles through one CNN, then their mean."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 2, 3, padding=1), nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tiles = x.reshape(-1, *x.shape[2:])  # (rows * tiles, 3, H, W)
        features = torch.relu(self.conv(tiles)).mean((2, 3)).reshape(x.shape[0], x.shape[1], 2)
        return self.head(features.mean(1))


def test_inspect_suggests_a_player_per_tile_for_a_stack_of_images() -> None:
    """(tiles, 3, H, W) reads as a volume by shape; inspect says how to make each tile a player, and
    says nothing of the kind for a volume whose second axis is depth."""
    torch.manual_seed(2)
    stack = inspect_model(to_onnx(_Tiles().eval(), torch.zeros(1, 4, 3, 8, 8))).text()
    assert "if its first axis holds 4 separate images" in stack
    assert "--players windows:4:axis=0" in stack
    volume = nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * 6 * 8 * 8, 2))
    said = inspect_model(to_onnx(volume.eval(), torch.zeros(1, 1, 6, 8, 8))).text()
    assert "blocks over the volume's depth" in said and "separate images" not in said
    assert parse_players("windows:4:axis=0", (4, 3, 8, 8)).n == 4
