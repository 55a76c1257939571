"""A progress bar on a terminal; nothing when stderr is not one (CI logs stay clean)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["progress_bar"]


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[float, str], None]]:
    if not sys.stderr.isatty():
        yield lambda fraction, message: None
        return
    from tqdm import tqdm

    bar = tqdm(
        total=1000,
        desc=label,
        unit="‰",
        file=sys.stderr,
        leave=False,
        bar_format="{desc} {bar} {percentage:3.0f}% {postfix}",
    )

    def update(fraction: float, message: str) -> None:
        bar.n = int(max(0.0, min(1.0, fraction)) * 1000)
        bar.set_postfix_str(message, refresh=False)
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()
