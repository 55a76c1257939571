"""A progress bar on a terminal; elsewhere (CI logs, pipes) nothing for short work, then one line a
minute, so that an hour-long audit is seen to move and a short one leaves the log clean."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["heartbeat", "progress_bar"]

HEARTBEAT_S = 60.0  # off a terminal: the first line after this long, then one per this long

Update = Callable[[float, str], None]


@contextmanager
def progress_bar(label: str) -> Iterator[Update]:
    if not sys.stderr.isatty():
        yield heartbeat(label)
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


def heartbeat(label: str, every: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic) -> Update:
    """An update that prints ``xaudit LABEL: 37% MESSAGE (12 min)`` on stderr at most once per
    ``every`` seconds, the first after ``every`` seconds."""
    start = clock()
    last = [start]

    def update(fraction: float, message: str) -> None:
        now = clock()
        if now - last[0] < every:
            return
        last[0] = now
        minutes = (now - start) / 60
        print(
            f"xaudit {label}: {max(0.0, min(1.0, fraction)):.0%} {message} ({minutes:.0f} min)",
            file=sys.stderr,
            flush=True,
        )

    return update
