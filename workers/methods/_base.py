"""What every attribution method shares: capabilities, the call context, the one signature."""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from workers.players import Players
from workers.subgames import SubInputGame
from workers.targets import Target

if TYPE_CHECKING:  # method metadata (the catalogue) loads no torch
    import torch

    from workers.models.base import ModelAdapter

__all__ = [
    "AttributionContext",
    "Capabilities",
    "Method",
    "TorchMethod",
    "at_references",
    "derived_seed",
    "distinct_references",
    "to_numpy",
    "to_tensor",
]

BaselineKind = Literal["none", "single", "distribution"]


@dataclass(frozen=True)
class Capabilities:
    gradients: bool  # needs a differentiable torch graph
    hooks: bool  # needs a hookable nn.Module graph (layer or rule-based)
    baseline: BaselineKind  # none: reference-free; distribution: averaged over a background set
    stochastic: bool  # result depends on the seed


@dataclass(frozen=True)
class AttributionContext:
    model: ModelAdapter
    players: Players
    target: Target
    params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0


class Method(ABC):
    """One attribution method. ``attribute`` is the same call for all of them.

    For distribution-baseline methods ``attribute`` is the single-baseline constituent (docs/science.md
    5.5); :func:`workers.methods.attribute` averages it over the background set.
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    defaults: ClassVar[Mapping[str, Any]] = {}
    # An integer parameter whose halving shows the method's discretisation error (e.g. quadrature
    # steps); the audit uses it to estimate the method's numerical noise floor.
    resolution: ClassVar[str | None] = None
    # The paper's theoretical expectation (Deng et al., Table 1): context for readers, never a verdict.
    paper_context: ClassVar[str] = ""

    def min_resolution(self, params: Mapping[str, Any]) -> int:
        """The smallest value of ``resolution`` this method accepts under ``params``."""
        return 1

    def bind(
        self, params: Mapping[str, Any], inputs: np.ndarray, references: tuple[np.ndarray, ...]
    ) -> dict[str, Any]:
        """Parameters fixed once per job from all of its inputs and references (the same for the
        maps and for every batch of sub-inputs the audit attributes). The default: as given."""
        return dict(params)

    @abstractmethod
    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        """Element attributions (k, *sample_shape) float32 for inputs (k, *sample_shape) with per-row
        references and target classes."""

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`attribute` on float32 tensors (classes: long) on the model's device, for the audit's
        device path (workers/audit/device_subinputs.py). Here through :meth:`attribute`, a round trip
        through the host; a :class:`TorchMethod` keeps its rows on the device."""
        out = self.attribute(ctx, to_numpy(inputs), to_numpy(baselines), classes.cpu().numpy())
        return to_tensor(out, inputs.device)

    def passes_per_row(self, params: Mapping[str, Any]) -> int:
        """Forward+backward passes of the model one row costs under (bound) ``params``: the audit
        cuts its calls by them, so that a call of Integrated Gradients takes about as long as one of
        Gradient x Input (workers.audit.subinputs)."""
        return 1

    def implementation(self, model: ModelAdapter) -> str | None:
        """Where the implementation that runs depends on ``model``'s graph (a library's in place of
        xaudit's own pass), which one, for the report: the verdict judges that implementation. None
        where there is only one."""
        return None

    def described_implementation(self, model: ModelAdapter) -> str | None:
        """:meth:`implementation`, and how the graph the method ran on stands in for ``model`` where
        it does not run it as given (for the report and ``xaudit inspect``)."""
        parts = [part for part in (self.implementation(model), self._graph_note(model)) if part]
        return "; ".join(parts) or None

    def _graph_note(self, model: ModelAdapter) -> str | None:
        return None  # the method runs the model itself

    def from_game(self, params: Mapping[str, Any], players: Players, game: SubInputGame) -> np.ndarray | None:
        """Per-player attributions (B, m, n) on every sub-input x_T of ``game``, read off the game's
        values where this method is a function of the game (v_T(U) = v(U ∩ T), see
        :mod:`workers.subgames`); None where it is not, and the audit runs the method on x_T."""
        return None

    def params(self, ctx: AttributionContext) -> dict[str, Any]:
        return self.params_from(ctx.params)

    def params_from(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``given``, checked against the method's declared parameters and
        bounds (xaudit.contract.params: the job spec checked them already; this keeps direct calls honest)."""
        from xaudit.contract.params import check_method_params

        merged = dict(self.defaults)
        merged.update(check_method_params(self.name, given))
        return merged


class TorchMethod(Method):
    """A method written in torch: :meth:`attribute_tensors` is the implementation, and
    :meth:`attribute` moves numpy rows to the model's device and back (no copy on the CPU)."""

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        import torch

        device = ctx.model.device
        c = torch.as_tensor(classes, dtype=torch.long, device=device)
        return to_numpy(
            self.attribute_tensors(ctx, to_tensor(inputs, device), to_tensor(baselines, device), c)
        )

    def _graph_note(self, model: ModelAdapter) -> str | None:
        from workers.methods._conversion_check import fake_quantized, upgraded_from
        from workers.methods._embedding import graph_model

        if model.info.format != "onnx":
            return None
        graph = graph_model(model)
        notes = []
        opset = upgraded_from(graph)
        if opset is not None:
            notes.append(
                f"on the model's graph upgraded from opset {opset} to 13 by onnx's version converter"
            )
        if fake_quantized(graph):
            notes.append(
                "on the quantized model's graph, each quantize-dequantize pair a fake quantization with its "
                "values: straight-through gradients; LRP passes relevance through it, DeepLIFT takes its "
                "rule there as at any nonlinearity (docs/science.md 5.9)"
            )
        return "; ".join(notes) or None

    @abstractmethod
    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor: ...


def derived_seed(seed: int, *parts: object) -> int:
    """A reproducible seed for a sub-task (a background sample, a repeat)."""
    return zlib.crc32(repr((seed, *parts)).encode()) & 0x7FFFFFFF


def to_tensor(array: np.ndarray, device: torch.device, requires_grad: bool = False) -> torch.Tensor:
    import torch

    from workers.models.base import owned_float32  # the package loads torch: not at import

    return torch.from_numpy(owned_float32(array)).to(device).requires_grad_(requires_grad)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def in_row_chunks(
    rows: int,
    fn: Callable[..., torch.Tensor],
    classes: torch.Tensor,
    *arrays: torch.Tensor,
    exact: bool = False,
) -> torch.Tensor:
    """``fn(classes, *arrays)`` over chunks of ``rows`` rows, joined: a one-pass method's memory bound
    per pass. The chunks are views; one chunk is returned as ``fn`` gave it. ``exact``: every chunk
    has ``rows`` rows (a graph exported with a fixed batch), the last one filled up with copies of its
    last row, whose results are dropped (rows are independent: the game evaluates such a model so)."""
    import torch

    from workers.models.base import filled_to

    out = []
    for start in range(0, len(classes), rows):
        chunk = [classes[start : start + rows], *(a[start : start + rows] for a in arrays)]
        kept = len(chunk[0])
        out.append(fn(*(filled_to(rows, part) for part in chunk))[:kept] if exact else fn(*chunk))
    return out[0] if len(out) == 1 else torch.cat(out)


def distinct_references(x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The references without consecutive repeats (the audit's sub-inputs of one sample share one),
    and each row's index into them: methods with a reference pass run it once per distinct row."""
    import torch

    flat = x0.reshape(len(x0), -1)
    new = torch.ones(len(x0), dtype=torch.bool, device=x0.device)
    new[1:] = (flat[1:] != flat[:-1]).any(1)
    return x0[new], torch.cumsum(new, 0) - 1


def at_references(
    value: torch.Tensor, shape: Sequence[int], refs: int, runs: torch.Tensor, rows: int
) -> torch.Tensor:
    """A tensor of the pass over the ``refs`` distinct references, for its counterpart of ``shape``
    in a pass of ``rows`` rows (``runs``: each row's reference), as the reference half of Captum's
    doubled batch would hold it: indexed by row, broadcast where one reference serves every row, and
    block by block where a graph folds several entries per row into its batch axis (Swin's attention
    windows, the tiles of a multiple-instance model), row-major. The batch axis is the one whose
    size differs between the two passes (the first, or the second of a (sequence, batch, features)
    layout, torch's default for its transformer layers)."""
    import torch

    if tuple(value.shape) == tuple(shape):
        if refs == rows and bool((runs == torch.arange(rows, device=runs.device)).all()):
            return value  # every row its own reference, in order (not a chunk whose runs start later)
        if refs == 1:
            return value  # one row, one reference; or a tensor without a batch axis
        axis = 0
    else:
        axis = next(a for a, (m, n) in enumerate(zip(value.shape, shape, strict=True)) if m != n)
    if value.shape[axis] == 1:
        return value  # broadcasts: one reference, one entry per row
    per_row = shape[axis] // rows
    if per_row * rows != shape[axis] or value.shape[axis] != refs * per_row:
        raise ValueError(
            f"a tensor's batch axis ({shape[axis]} entries for {rows} rows, {value.shape[axis]} for "
            f"{refs} references) is not a batch of rows"
        )
    front = value.movedim(axis, 0)
    blocks = front.reshape(refs, per_row, *front.shape[1:])
    if bool((runs == runs[0]).all()):  # one reference for these rows: its block, repeated
        spread = blocks[int(runs[0])]
        if per_row > 1:
            spread = spread.repeat(rows, *(1,) * (front.ndim - 1))
    else:
        spread = blocks[runs].reshape(shape[axis], *front.shape[1:])
    return spread.movedim(0, axis)
