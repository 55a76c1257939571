"""Images with their channels last, as Keras and tf2onnx export them ((H, W, C) samples): the grid of
players, the blurred and mean references are those of the same image with its channels first
(xaudit.contract.layout). Before, the grid cut an (H, W, C) image over its width and channels, the
blur mixed its colours and the mean reference was a mean per row."""

from __future__ import annotations

import numpy as np
import pytest

from workers.players import auto_players, parse_players
from workers.references import make_baselines
from xaudit.contract.layout import channels_last

_FIRST, _LAST = (3, 12, 15), (12, 15, 3)


def _images(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The same two images, channels last then first."""
    last = np.random.default_rng(seed).normal(size=(2, *_LAST)).astype(np.float32)
    return last, np.ascontiguousarray(last.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("spec", ["auto", "grid:2x3", "grid:12x15"])
def test_the_grid_cuts_height_and_width_and_every_channel_alike(spec: str) -> None:
    last, first = parse_players(spec, _LAST), parse_players(spec, _FIRST)
    assert last.names == first.names and last.layout == first.layout
    np.testing.assert_array_equal(last.labels.transpose(2, 0, 1), first.labels)
    np.testing.assert_array_equal(last.labels[..., 0], last.labels[..., 2])  # every channel alike
    attributions, _ = _images(1)
    np.testing.assert_allclose(
        last.sum_per_player(attributions),
        first.sum_per_player(np.ascontiguousarray(attributions.transpose(0, 3, 1, 2))),
        rtol=1e-6,
    )


def test_the_default_grid_is_three_by_three_patches_of_the_image() -> None:
    labels = parse_players("auto", _LAST).labels
    assert auto_players(_LAST) == "grid:3x3"
    assert labels[0, 0, 1] == 0 and labels[11, 14, 0] == 8 and labels[5, 7, 2] == 4


@pytest.mark.parametrize("spec", ["blur", "blur:1.5", "mean"])
def test_the_references_are_the_channels_first_images(spec: str) -> None:
    last, first = _images()
    np.testing.assert_allclose(
        make_baselines(spec, last).transpose(0, 3, 1, 2), make_baselines(spec, first), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    ("shape", "last"),
    [((32, 32, 3), True), ((28, 28, 1), True), ((64, 64, 4), True), ((3, 32, 32), False),
     ((1, 8, 8), False), ((3, 4, 4), False), ((2, 3, 3), False), ((8, 3, 3), False), ((16, 16), False), ((1, 16, 16, 16), False)],
)  # fmt: skip
def test_which_samples_keep_their_channels_last(shape: tuple[int, ...], last: bool) -> None:
    assert channels_last(shape) is last
