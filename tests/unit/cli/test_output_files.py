"""Output files: refused before any work when they cannot be written, and written at the exact path
given (np.savez alone appends .npz to a name without it, and the CLI then named a file that did not
exist)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from clients.cli._files import check_writable, write_npz
from xaudit.contract.errors import InvalidInput


def test_unwritable_outputs_are_refused_by_reason(tmp_path: Path) -> None:
    check_writable(None)
    check_writable(tmp_path / "report.json")
    with pytest.raises(InvalidInput, match="it is a directory"):
        check_writable(tmp_path)
    with pytest.raises(InvalidInput, match="does not exist"):
        check_writable(tmp_path / "missing" / "report.json")
    check_writable(Path("/dev/null"))  # an existing writable file, in a directory users cannot write


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(InvalidInput, match="permission denied"):
        check_writable(locked / "report.json")
    existing = tmp_path / "summary.md"
    existing.write_text("")
    existing.chmod(0o444)
    with pytest.raises(InvalidInput, match="permission denied"):
        check_writable(existing)


def test_an_npz_lands_at_the_path_given(tmp_path: Path) -> None:
    bare = tmp_path / "attributions"
    write_npz(bare, {"saliency": np.arange(3.0)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attributions"]
    with np.load(bare) as loaded:
        np.testing.assert_array_equal(loaded["saliency"], np.arange(3.0))
