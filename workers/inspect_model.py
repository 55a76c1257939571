"""What xaudit reads from a model before any audit: ``xaudit inspect MODEL``.

Inputs (declared shapes with their dim names, dtypes, the batch axis found from the graph),
outputs, opsets and domains, which methods can run and why the others cannot, and a command line
to audit it. Applicability is decided the way the audit decides it: by building the torch graph
and planning the rule methods on it, so "can run" here means the audit will not refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.methods import ALL_METHODS, get_method
from workers.methods._isolation import judged_alone
from workers.methods.lrp import LrpMethod
from workers.models.base import ModelAdapter
from workers.players import auto_players
from xaudit.contract.errors import NotApplicable, XauditError
from xaudit.contract.layout import channels_last

if TYPE_CHECKING:
    import numpy as np

    from workers.models.named import OnnxGraph

__all__ = ["ModelCheck", "inspect_model"]

# Beside the LRP methods, which check their own plan (LrpMethod.check_plan).
_RULE_FAMILIES = {"deeplift_revealcancel": "RevealCancel"}


# Operators whose output is a probability (or its log): a classifier exported with its head.
_HEAD_ADVICE = {
    "Softmax": "its values are probabilities, which the default target (logit) reads as they are; "
    "--target prob or logodds would take a softmax of them again",
    "Sigmoid": "its values are probabilities, which the default target (logit) reads as they are; "
    "--target prob or logodds would take a sigmoid or softmax of them again",
    "ZipMap": "the class probabilities it held, read as a (rows, classes) tensor; the default target "
    "reads them as they are; --target prob or logodds would take a softmax of them again",
    "LogSoftmax": "its values are log-probabilities; --target prob reads the probabilities (a softmax "
    "of log-probabilities gives them back)",
}


@dataclass
class ModelCheck:
    format: str
    inputs: list[dict[str, object]] = field(default_factory=list)
    outputs: list[dict[str, object]] = field(default_factory=list)
    opsets: dict[str, int] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)  # name -> "runs: ..." | "not applicable: ..."
    explained: str = ""
    explained_output: str = ""  # the output the audit explains (workers/models/onnx_outputs.py)
    embedding_tensor: str = ""
    fixed_batch: int | None = None
    output_head: str = ""  # the op making the explained output when it gives probabilities (Softmax...)
    rebatched: bool = False  # a fixed batch of 1 that the graph lets us widen (checked on two rows)
    rows_coupled_by: str | None = None  # an operator that couples a batch's rows: one row per call
    command: str = ""
    layout: str = ""  # how the default players cut the explained input (a channels-last image, a volume)

    def runnable(self) -> list[str]:
        return [m for m, why in self.methods.items() if why.startswith("runs")]

    def text(self) -> str:
        lines = [f"format: {self.format}"]
        if self.opsets:
            lines.append("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in self.opsets.items()))
        lines.append("inputs:")
        for i in self.inputs:
            axis = i["batch_axis"]
            where = f"batch axis {axis}" if axis is not None else "no batch axis (held as given)"
            mark = "  <- explained" if i["name"] == self.explained else ""
            lines.append(f"  {i['name']}: {i['dtype']} {i['shape']}, {where}{mark}")
        if self.rows_coupled_by:
            lines.append(
                f"  rows of a batch are coupled: {self.rows_coupled_by}; evaluated one row per model call "
                "(an audit of 2^n sub-inputs costs 2^n calls per sample)"
            )
        elif self.rebatched:
            lines.append(
                "  fixed batch size 1, but the graph computes row by row (checked): re-batched, many rows per call"
            )
        elif self.fixed_batch is not None:
            lines.append(
                f"  fixed batch size {self.fixed_batch}: evaluated {self.fixed_batch} row(s) per model call "
                "(an audit of 2^n sub-inputs costs 2^n calls per sample)"
            )
            lines.append(
                "  export with a dynamic batch to audit many rows per call: from torch, an example of two "
                'rows and dynamic_shapes={0: torch.export.Dim("batch")} on each batched input'
            )
        if self.embedding_tensor:
            lines.append(f"  gradients on token ids are taken at '{self.embedding_tensor}'")
        lines.append("outputs:")
        for o in self.outputs:
            mark = "  <- explained" if o["name"] == self.explained_output and len(self.outputs) > 1 else ""
            lines.append(f"  {o['name']}: {o['dtype']} {o['shape']}{mark}")
        if self.output_head:
            lines.append(
                f"  {self.explained_output} comes out of a {self.output_head}: {_HEAD_ADVICE[self.output_head]}"
            )
        if self.layout:
            lines.append(f"players by default: {self.layout}")
        lines.append("methods:")
        width = max(len(m) for m in self.methods)
        for name, why in self.methods.items():
            lines.append(f"  {name.ljust(width)}  {why}")
        lines.append(f"audit it with:\n  {self.command}")
        return "\n".join(lines)


def _shape(dims: tuple[object, ...] | None) -> str:
    if dims is None:
        return "(unknown)"
    parts = ["?" if d is None else str(d) for d in dims]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _methods(model: ModelAdapter, check: ModelCheck) -> None:
    """Each method's applicability, judged one by one as the audit judges it."""
    from workers.methods._embedding import graph_model
    from workers.methods._fx_plan import family_plan

    for name in ALL_METHODS:
        method = get_method(name)
        caps = method.capabilities
        needs = " (needs --background)" if caps.baseline == "distribution" else ""
        if not caps.gradients and not caps.hooks:
            check.methods[name] = f"runs: forward passes only{needs}"
            continue
        try:
            with judged_alone(name):
                hookable = graph_model(model)
                if isinstance(method, LrpMethod):  # rows one at a time where the batch is fixed at 1
                    method.check_plan(hookable.torch_hookable(name, row_by_row=True))
                elif name in _RULE_FAMILIES:
                    family_plan(hookable.torch_hookable(name), name, _RULE_FAMILIES[name])
                elif name == "grad_cam":
                    from workers.methods.grad_cam import conv_layers

                    if not conv_layers(hookable.torch_hookable(name, row_by_row=True)):
                        raise NotApplicable(name, "the model has no convolution layer")
                elif caps.hooks:
                    hookable.torch_hookable(name)
                else:
                    hookable.torch_differentiable()
            where = f" at '{check.embedding_tensor}'" if check.embedding_tensor else ""
            implementation = method.described_implementation(model)
            through = f"; {implementation}" if implementation else ""
            check.methods[name] = f"runs: torch graph{where}{needs}{through}"
        except NotApplicable as exc:
            check.methods[name] = f"not applicable: {exc.reason}"


def _example_rows(graph: OnnxGraph, explained: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Made-up values for re-batching's check, which compares the model with itself: one row of the
    explained input and one sample of every input, ids 0 or 1 (valid in any vocabulary and as a
    mask), floats standard normal."""
    import numpy as np

    rng = np.random.default_rng(0)
    given = {}
    for spec in graph.inputs:
        shape = [d if isinstance(d, int) else 1 for d in spec.dims or ()]
        given[spec.name] = (rng.integers(0, 2, shape) if spec.integer else rng.standard_normal(shape)).astype(
            spec.dtype
        )
    return given[explained][:1], given


def _onnx(data: bytes, path: str) -> ModelCheck:
    import hashlib

    import numpy as np

    from workers.models import resolve_device
    from workers.models.named import _ORT_DTYPES, NamedOnnxModel, OnnxGraph, batch_axis
    from workers.models.onnx_outputs import explained_output

    graph = OnnxGraph(data, hashlib.sha256(data).hexdigest(), resolve_device("cpu"))
    check = ModelCheck("onnx", opsets={o.domain: o.version for o in graph.proto.opset_import})
    floats = [i for i in graph.inputs if not i.integer and i.dims]
    explained = (floats or [i for i in graph.inputs if i.dims] or list(graph.inputs))[0]
    check.explained = explained.name
    check.fixed_batch = explained.fixed_batch
    check.rows_coupled_by = graph.rows_coupled_by
    declared = graph  # the shapes as the user exported them, whatever is widened below
    if explained.fixed_batch == 1:
        from workers.inputs import rebatched_graph

        widened = rebatched_graph(graph, explained.name, *_example_rows(graph, explained.name))
        if widened is not graph:
            check.rebatched = True
            graph, explained = widened, widened.input(explained.name)
    for spec in graph.inputs:
        axis = batch_axis(spec, explained)
        dims = declared.input(spec.name).dims
        check.inputs.append(
            {"name": spec.name, "dtype": str(spec.dtype), "shape": _shape(dims), "batch_axis": axis}
        )
    types = {o.name: o for o in declared.session.get_outputs()}
    for name in graph.outputs:
        arg = types[name]
        dims = tuple(d if isinstance(d, (int, str)) and d != "" else None for d in arg.shape)
        check.outputs.append(
            {"name": name, "dtype": str(_ORT_DTYPES.get(arg.type, arg.type)), "shape": _shape(dims)}
        )
    check.explained_output = explained_output(graph.proto)
    producer = {out: node.op_type for node in graph.proto.graph.node for out in node.output}
    if producer.get(check.explained_output) in _HEAD_ADVICE:
        check.output_head = producer[check.explained_output]
    if check.explained_output in graph.unzipped:
        check.output_head = "ZipMap"
    # Example held values (zeros, one sample) to bind the graph the way an audit binds it.
    fixed = {}
    for spec in graph.inputs:
        if spec.name == explained.name:
            continue
        dims = spec.dims or ()
        fixed[spec.name] = np.zeros([d if isinstance(d, int) else 1 for d in dims], spec.dtype)
    model = NamedOnnxModel(graph, explained.name, fixed)
    if explained.integer:
        from workers.methods._embedding import attach_embedding

        ids = np.zeros([1, *[d or 1 for d in explained.sample_shape or ()]], np.float32)
        try:
            attach_embedding(model, "", ids)
            check.embedding_tensor = getattr(model.embedding, "tensor", "")
        except XauditError as exc:
            model.no_embedding = f"and the graph gives no float tensor to take gradients at ({exc})"
    _methods(model, check)
    inputs = " ".join(
        f"--input {i['name']}={i['name']}.npy" for i in check.inputs
    ) if len(check.inputs) > 1 else "--input inputs.npy"  # fmt: skip
    explain = f" --explain {explained.name}" if len(check.inputs) > 1 else ""
    players = _players_option(explained.integer, explained.sample_shape)
    check.command = f"xaudit audit --model {path} {inputs}{explain}{players} --methods all --out report.json"
    check.layout = _default_layout(explained.sample_shape)
    return check


def _default_layout(sample_shape: tuple[int | None, ...] | None) -> str:
    """Where the default grid falls on an input whose axes are not the plain (C, H, W) case: a
    channels-last image or a volume (xaudit.contract.layout); "" otherwise or for a symbolic shape."""
    shape = tuple(d for d in sample_shape or () if isinstance(d, int))
    if not shape or len(shape) != len(sample_shape or ()):
        return ""
    spec = auto_players(shape)
    if spec == "grid:2x2x2":
        where = "channels last" if channels_last(shape) else "channels first"
        said = f"{spec}, blocks over the volume's depth, height and width ({where})"
        if not channels_last(shape) and shape[1] in (1, 3) and shape[0] != shape[1]:
            # (N, C, H, W) reads as a volume (C, D, H, W), but its second axis looks like an image's
            # channels: a stack of tiles or frames, which a multiple-instance model takes.
            said += (
                f"; if its first axis holds {shape[0]} separate images (tiles, frames), "
                f"give each its player: --players windows:{shape[0]}:axis=0"
            )
        return said
    if spec == "grid:3x3" and channels_last(shape):
        return f"{spec}, patches over height and width, the channels last (axis {len(shape)})"
    return ""


def _players_option(integer: bool, sample_shape: tuple[int | None, ...] | None) -> str:
    """The suggested command's --players: tokens for token ids; for a signal or sequence with no
    default players (workers.players.auto_players), 8 windows over its last axis (an exact game of
    256 coalitions); none where the default applies or the shape is not known."""
    if integer:
        return " --players tokens"
    shape = tuple(d for d in sample_shape or () if isinstance(d, int))
    if not shape or len(shape) != len(sample_shape or ()):  # no shape, or a symbolic axis
        return ""
    return "" if auto_players(shape) is not None else f" --players windows:{min(8, shape[-1])}"


def _torchscript(data: bytes, path: str) -> ModelCheck:
    from workers.models import load_model
    from workers.models.torchscript_model import IDS_NO_GRADIENTS, IDS_NO_HOOKS, TorchScriptModel

    model = load_model(data, "torchscript", "cpu")
    assert isinstance(model, TorchScriptModel)
    # A module declares no input types; one whose input indexes an embedding takes token ids, and
    # the audit will find so from the input (TorchScriptModel.check_sample).
    ids = model.input_feeds_embedding()
    check = ModelCheck("torchscript", explained="input")
    check.inputs.append(
        {
            "name": "input",
            "dtype": "int64" if ids else "float32",
            "shape": "(not declared; token ids: it indexes aten::embedding)" if ids else "(not declared)",
            "batch_axis": 0,
        }
    )
    check.outputs.append({"name": "output", "dtype": "float32", "shape": "(not declared)"})
    for name in ALL_METHODS:
        caps = get_method(name).capabilities
        needs = " (needs --background)" if caps.baseline == "distribution" else ""
        if ids and caps.hooks:  # worded as the audit words it (TorchScriptModel)
            check.methods[name] = (
                f"not applicable: needs a hookable graph and the TorchScript model {IDS_NO_HOOKS}"
            )
        elif ids and caps.gradients:
            check.methods[name] = f"not applicable: {IDS_NO_GRADIENTS}"
        elif caps.hooks:
            check.methods[name] = (
                "decided at audit time: needs a hookable graph, made by exporting the scripted module "
                f"to ONNX with the given input{needs}"
            )
        elif caps.gradients:  # TorchScript declares no input type: ids are found with the input
            check.methods[name] = (
                f"runs: the scripted module's autograd, on float inputs (integer token ids: not "
                f"applicable, decided at audit time){needs}"
            )
        else:
            check.methods[name] = f"runs: forward passes only{needs}"
    del model
    players = _players_option(ids, None)
    check.command = f"xaudit audit --model {path} --input inputs.npy{players} --methods all --out report.json"
    return check


def inspect_model(data: bytes, path: str = "MODEL") -> ModelCheck:
    """Everything ``xaudit inspect`` prints, for untrusted model bytes (run it where loading is safe)."""
    from xaudit.contract.onnx_checks import detect_format

    return _torchscript(data, path) if detect_format(data) == "torchscript" else _onnx(data, path)
