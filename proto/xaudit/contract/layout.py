"""Where an image sample keeps its channels: one rule for the players, the references and the page.

torch's exporters give images as (C, H, W); Keras' and TensorFlow's (tf2onnx) keep channels last,
(H, W, C). A grid of players over the last two axes of an (H, W, C) image would cut it into bands of
columns by channel, a blur would mix its colours, and a per-channel mean would be a per-row one.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CHANNEL_COUNTS", "channels_last", "image_axes"]

CHANNEL_COUNTS = (1, 3, 4)  # grey, RGB, RGBA


def channels_last(sample_shape: Sequence[int]) -> bool:
    """Whether one sample of this shape is an (H, W, C) image: three axes, the last a channel count
    smaller than the other two, and the first not a channel count (so that a (3, 32, 32), a (1, 8, 8)
    or a two-channel (2, 3, 3) sample stays channels first)."""
    if len(sample_shape) != 3:
        return False
    height, width, channels = sample_shape
    return channels in CHANNEL_COUNTS and height not in CHANNEL_COUNTS and channels < min(height, width)


def image_axes(sample_shape: Sequence[int]) -> tuple[int, int]:
    """The (height, width) axes of one sample, counted from its end: the last two, or the two before
    the channels of an (H, W, C) image."""
    return (-3, -2) if channels_last(sample_shape) else (-2, -1)
