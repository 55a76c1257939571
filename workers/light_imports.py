"""onnx2torch and zennit without torchvision.

Both packages import torchvision from their ``__init__`` for parts xaudit never uses (onnx2torch:
the NMS and RoIAlign detection-operator converters; zennit: canonizers for torchvision's ResNet
blocks), and torchvision costs seconds and hundreds of MB at start-up. Each function here
registers the package object itself and imports every submodule but those; the packages then work
as usual (onnx2torch reports NMS and RoIAlign as unsupported operators). Call them before the
package is imported anywhere else; they are idempotent.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path

__all__ = ["SKIPPED", "onnx2torch", "zennit"]

# Submodules left out, per package: the ones that import torchvision.
SKIPPED: dict[str, tuple[str, ...]] = {
    "onnx2torch": ("node_converters.nms", "node_converters.roialign"),
    "zennit": ("torchvision",),
}


def _package(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__package__ = name
    module.__file__ = str(path / "__init__.py")
    sys.modules[name] = module
    return module


def _load(name: str, fill: Callable[[types.ModuleType, Path], None]) -> types.ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{name} is not installed", name=name)
    root = Path(spec.origin).parent
    top = _package(name, root)
    try:
        fill(top, root)
    except BaseException:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
        raise
    return top


def _import_all(package: str, folder: Path, skipped: tuple[str, ...]) -> dict[str, types.ModuleType]:
    return {
        file.stem: importlib.import_module(f"{package}.{file.stem}")
        for file in sorted(folder.glob("*.py"))
        if file.stem != "__init__" and file.stem not in skipped
    }


def onnx2torch() -> types.ModuleType:
    def fill(top: types.ModuleType, root: Path) -> None:
        converters = _package("onnx2torch.node_converters", root / "node_converters")
        skipped = tuple(s.split(".", 1)[1] for s in SKIPPED["onnx2torch"])
        _import_all("onnx2torch.node_converters", root / "node_converters", skipped)
        registry = importlib.import_module("onnx2torch.node_converters.registry")
        for attr in ("OperationDescription", "TConverter", "get_converter"):
            setattr(converters, attr, getattr(registry, attr))
        top.convert = importlib.import_module("onnx2torch.converter").convert  # type: ignore[attr-defined]

    return _load("onnx2torch", fill)


def zennit() -> types.ModuleType:
    def fill(top: types.ModuleType, root: Path) -> None:
        for stem, module in _import_all("zennit", root, SKIPPED["zennit"]).items():
            setattr(top, stem, module)

    return _load("zennit", fill)
