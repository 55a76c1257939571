"""Paths and loaders for the golden signed reports in tests/assets/signing (TEST-ONLY keys)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "signing"


def asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


def pem(n: int) -> str:
    return (ASSETS / f"key-{n}.pub.pem").read_text()


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("xaudit_make_golden", ASSETS / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
