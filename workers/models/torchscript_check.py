"""Refuse TorchScript that can reach outside the process, before any of its code runs.

A TorchScript archive carries code. Two checks, both before the model computes anything:

* :func:`check_archive` (before loading): no ``__setstate__`` in the archive's code, because
  ``torch.jit.load`` runs it while unpickling; the model is refused, naming the file.
* :func:`check_module` (after loading, before any call): every node of every method of every
  submodule, with calls inlined, must be an allowed operator: an ``aten::`` tensor operator other than
  the ones that reach files or global state (:data:`REFUSED_ATEN`; every aten operator with a file
  name argument is among them, a unit test keeps it so), or one of the structural ``prim::``
  operators of :data:`ALLOWED_PRIM`. Other namespaces (custom ``torch.ops`` libraries, ``prim::rpc_*``,
  ``prim::PythonOp``, quantized or distributed kernels) are refused, naming the operator.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator

import torch

from xaudit.contract.errors import InvalidModel

__all__ = ["ALLOWED_PRIM", "REFUSED_ATEN", "check_archive", "check_module", "refused_operator"]

# aten operators that read or write files, or set process-wide state another job would inherit.
REFUSED_ATEN = frozenset(
    {
        "aten::from_file",
        "aten::save",
        "aten::_cufft_set_plan_cache_max_size",
        "aten::_cufft_clear_plan_cache",
        "aten::manual_seed",
        "aten::seed",
        "aten::record_stream",
        "aten::_set_torch_function_mode",
    }
)

# Control flow, containers, constants and attribute access: what scripted Python compiles to.
ALLOWED_PRIM = frozenset(
    {
        "prim::Constant", "prim::GetAttr", "prim::SetAttr", "prim::If", "prim::Loop", "prim::Return",
        "prim::ListConstruct", "prim::ListUnpack", "prim::TupleConstruct", "prim::TupleUnpack",
        "prim::TupleIndex", "prim::TupleSlice", "prim::DictConstruct", "prim::DictIndex",
        "prim::CreateObject", "prim::CallMethod", "prim::CallFunction", "prim::Uninitialized",
        "prim::unchecked_cast", "prim::unchecked_unwrap_optional", "prim::isinstance", "prim::RaiseException",
        "prim::NumToTensor", "prim::device", "prim::dtype", "prim::layout", "prim::requires_grad",
        "prim::data", "prim::is_cuda", "prim::is_cpu", "prim::is_sparse", "prim::is_quantized",
        "prim::is_meta", "prim::is_mkldnn", "prim::is_nested", "prim::min", "prim::max", "prim::abs",
        "prim::shape", "prim::grad", "prim::type", "prim::name", "prim::index", "prim::tolist",
        "prim::rangelist", "prim::StringIndex", "prim::EnumName", "prim::EnumValue", "prim::Print",
        "prim::Enter", "prim::Exit", "prim::fork", "prim::ModuleContainerIndex", "prim::itemsize",
        "prim::nbytes", "prim::id", "prim::AutogradAdd", "prim::AutogradZero", "prim::BroadcastSizes",
        "prim::ChunkSizes", "prim::ConstantChunk", "prim::Closure", "prim::ListIndex",
    }
)  # fmt: skip

_SETSTATE = re.compile(rb"\bdef\s+__setstate__\s*\(")


def refused_operator(kind: str) -> bool:
    """Whether a graph node of this kind is refused (an operator name such as ``aten::add``)."""
    namespace = kind.split("::", 1)[0]
    if namespace == "aten":
        return kind in REFUSED_ATEN
    if namespace == "prim":
        return kind not in ALLOWED_PRIM
    return True


def check_archive(data: bytes) -> None:
    """Refuse an archive whose code defines ``__setstate__`` (it would run while loading)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                if "/code/" in f"/{name}" and name.endswith(".py") and _SETSTATE.search(archive.read(name)):
                    raise InvalidModel(
                        f"the TorchScript model defines __setstate__ ({name}), which runs while loading; refused"
                    )
    except zipfile.BadZipFile:
        return  # torch.jit.load says what is wrong with it


def _nodes(block: torch._C.Block) -> Iterator[torch._C.Node]:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def _graphs(module: torch.jit.ScriptModule) -> Iterator[tuple[str, torch._C.Graph]]:
    for prefix, sub in module.named_modules():
        c = getattr(sub, "_c", None)
        if c is None:
            continue
        for method in c._method_names():
            graph = c._get_method(method).graph.copy()
            torch._C._jit_pass_inline(graph)  # free functions and known methods become nodes here
            yield f"{prefix}.{method}" if prefix else method, graph


def check_module(module: torch.jit.ScriptModule) -> None:
    """Raise :class:`InvalidModel` naming the first refused operator and the method that uses it."""
    for where, graph in _graphs(module):
        for node in _nodes(graph.block()):
            kind = node.kind()
            if refused_operator(kind):
                raise InvalidModel(
                    f"the TorchScript model uses operator {kind} (in {where}), which is not an allowed "
                    "tensor operator (it can reach files, processes, the network or process-wide state); refused"
                )
