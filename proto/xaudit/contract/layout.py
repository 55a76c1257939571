"""Where an image or a volume keeps its channels: one rule for the players, the references and the page.

torch's exporters give images as (C, H, W) and volumes as (C, D, H, W); Keras' and TensorFlow's
(tf2onnx) keep channels last, (H, W, C) and (D, H, W, C). A grid of players over the last two axes
of an (H, W, C) image would cut it into bands of columns by channel, a blur would mix its colours,
and a per-channel mean would be a per-row one.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CHANNEL_COUNTS", "channels_last", "image_axes", "is_volume", "spatial_axes"]

CHANNEL_COUNTS = (1, 3, 4)  # grey, RGB, RGBA


def channels_last(sample_shape: Sequence[int]) -> bool:
    """Whether one sample of this shape is an (H, W, C) image or a (D, H, W, C) volume: the last axis a
    channel count smaller than every other axis, and the first not a channel count (so that a
    (3, 32, 32), a (1, 8, 8), a two-channel (2, 3, 3) or a (1, 16, 16, 16) sample stays channels
    first)."""
    if len(sample_shape) not in (3, 4):
        return False
    *space, channels = sample_shape
    return channels in CHANNEL_COUNTS and space[0] not in CHANNEL_COUNTS and channels < min(space)


def is_volume(sample_shape: Sequence[int]) -> bool:
    """A sample with three spatial axes: (C, D, H, W) or (D, H, W, C)."""
    return len(sample_shape) == 4


def spatial_axes(sample_shape: Sequence[int], count: int) -> tuple[int, ...]:
    """The last ``count`` spatial axes of one sample, counted from its end: the last axes, or the ones
    before the channels of a channels-last sample."""
    end = -1 if channels_last(sample_shape) else 0
    return tuple(range(end - count, end))


def image_axes(sample_shape: Sequence[int]) -> tuple[int, int]:
    """The (height, width) axes of one sample, counted from its end."""
    height, width = spatial_axes(sample_shape, 2)
    return height, width
