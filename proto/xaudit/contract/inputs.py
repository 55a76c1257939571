"""Named model inputs on the wire: the explained one travels as ``inputs``, every other one as
``input:NAME`` (held at its value); and the checks of given names against a model's own inputs.

Shared by the client (building requests), the service (checking them at submission) and the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from xaudit.contract.errors import InvalidInput

__all__ = ["INPUT_PREFIX", "check_names", "held_inputs", "input_key", "onnx_input_names"]

T = TypeVar("T")

INPUT_PREFIX = "input:"


def input_key(name: str) -> str:
    """The tensor name under which a held-fixed input ``name`` travels."""
    return INPUT_PREFIX + name


def held_inputs(tensors: Mapping[str, T]) -> dict[str, T]:
    """The ``input:NAME`` tensors, by NAME."""
    return {k[len(INPUT_PREFIX) :]: v for k, v in tensors.items() if k.startswith(INPUT_PREFIX)}


def check_names(model_inputs: tuple[str, ...], explain: str, held: tuple[str, ...]) -> None:
    """Every given name is a model input, every model input is given, the explained one once."""
    if explain in held:
        raise InvalidInput(f"input '{explain}' is given twice")
    given = (explain, *held)
    unknown = [n for n in given if n not in model_inputs]
    if unknown:
        raise InvalidInput(
            f"the model has no input named {', '.join(repr(n) for n in unknown)} "
            f"(its inputs: {', '.join(model_inputs)})"
        )
    missing = [n for n in model_inputs if n not in given]
    if missing:
        raise InvalidInput(
            f"missing required input {', '.join(repr(n) for n in missing)} "
            f"(the model's inputs: {', '.join(model_inputs)})"
        )


def onnx_input_names(data: bytes) -> tuple[str, ...] | None:
    """The graph inputs of ONNX bytes (initializers excluded); None for other formats."""
    from xaudit.contract.onnx_checks import detect_format

    if detect_format(data) != "onnx":
        return None
    import onnx

    try:
        proto = onnx.load_model_from_string(data)
    except Exception:
        return None  # loading says what is wrong with it
    initializers = {i.name for i in proto.graph.initializer}
    return tuple(i.name for i in proto.graph.input if i.name not in initializers)
