"""The files commands write: checked before any work starts, so that an audit is never computed
only to fail at its last step, and written exactly where asked."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from xaudit.contract.errors import InvalidInput

if TYPE_CHECKING:  # numpy is loaded when a file is written, not for --help
    import numpy as np

__all__ = ["check_writable", "write_npz"]


def check_writable(path: Path | None) -> None:
    """Refuse now an output that cannot be written: a directory, a missing or read-only directory."""
    if path is None:
        return
    if path.is_dir():
        raise InvalidInput(f"cannot write {path}: it is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidInput(f"cannot write {path}: directory {parent} does not exist")
    # An existing file is written in place (it may be /dev/stdout or $GITHUB_STEP_SUMMARY in a
    # directory the user cannot write); a new one needs its directory writable.
    writable = os.access(path, os.W_OK) if path.exists() else os.access(parent, os.W_OK | os.X_OK)
    if not writable:
        raise InvalidInput(f"cannot write {path}: permission denied")


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """One .npz at ``path`` itself (np.savez given a name appends .npz to one that lacks it)."""
    import numpy as np

    with path.open("wb") as handle:
        np.savez(handle, **arrays)  # type: ignore[arg-type]
