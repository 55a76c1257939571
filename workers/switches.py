"""The operator's on/off switches in the environment, read one way everywhere.

A switch that is off by default is on only for ``1``, ``true`` or ``yes``; one that is on by default
is off only for ``0``, ``false`` or ``no`` (case and surrounding spaces ignored, unset = default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["switch"]


def switch(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    text = (os.environ if environ is None else environ).get(name, "").strip().lower()
    return text not in ("0", "false", "no") if default else text in ("1", "true", "yes")
