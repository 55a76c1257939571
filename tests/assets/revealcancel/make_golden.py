"""Write digits_golden.npz with the *current* RevealCancel implementation (see README.md before running).

.venv/bin/python tests/assets/revealcancel/make_golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from tests.unit.methods.test_revealcancel_golden import GOLDEN, golden_cases  # noqa: E402
from workers.methods import get_method  # noqa: E402


def main() -> None:
    method = get_method("deeplift_revealcancel")
    arrays = {key: method.attribute(*case) for key, case in golden_cases().items()}
    np.savez_compressed(GOLDEN, **arrays)
    print(f"wrote {GOLDEN} ({', '.join(f'{k} {v.shape}' for k, v in arrays.items())})")


if __name__ == "__main__":
    main()
