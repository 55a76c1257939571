"""Units every role writes its sizes in (limits, messages, memory caps)."""

from __future__ import annotations

__all__ = ["MiB"]

MiB = 1024 * 1024
