"""An explicit interpreter of an onnx2torch fx graph for DeepLIFT RevealCancel.

The reference pass evaluates every node at the distinct reference rows (float64, see
:meth:`RevealCancelGraph.reference`). The difference pass propagates differences-from-reference
(float32) and, where a ReLU needs it, their split into positive and negative parts; the backward
pass walks the nodes in reverse and applies one rule per node kind (see
:mod:`workers.methods._revealcancel_rules`). Node kinds come from
:func:`workers.methods._fx_plan.plan_graph`:

- affine (Linear, Conv) and avgpool (W >= 0): the split rule and its backward;
- relu: the RevealCancel multipliers, from the split of its input (an affine output, possibly
  through reshapes, data movement and batch norms; otherwise the elementwise sign split, where
  RevealCancel is Rescale); clip (ReLU6): the same rule, which is linear in the nonlinearity, for
  relu(z) - relu(z - 6); gated (SiLU, Hardswish) and quantize (a quantized model's
  quantize-dequantize pair, a staircase) the rule from the function's values at its four points
  (float64 plans);
- shape: pass differences, splits and multipliers through;
- merge (a sum or concatenation of activations, e.g. a residual connection): a sum is one linear
  layer whose terms are the summands' own terms (an affine summand's split, any other summand's
  difference split by its sign), which is how DeepLIFT's linear rule treats ``W a + x`` written as
  one layer; a concatenation concatenates the parts' differences and splits and hands each part
  its slice of the multipliers (DeepLIFT's reference implementation);
- move (Transpose, Slice, Split and its parts: ShuffleNet's channel shuffle and split): data
  movement moves differences, splits and multipliers alike; the multipliers go back by the move's
  adjoint (its gradient: each value's multiplier to where the value came from, none to what a
  slice dropped). Graphs with merges or moves run as a float64 plan throughout (differences in
  float64, the rest multiplied in float32: :func:`affine_maps`): the float32 rounding checks
  below are written for chains;
- scale (an eval-mode batch norm, s x + b): differences, parts and multipliers scaled by s, the
  parts and multipliers swapped where s < 0 (DeepLIFT's reference implementation; the same as
  folding s into the layers before it); factor (times or divided by a constant, elementwise: Keras
  writes a batch norm it cannot fold, and its Normalization layer, as Sub, Mul, Add, Div) the same
  with that constant's values, and bias (a constant shift) passes differences, parts and
  multipliers unchanged (summed back over any axis the constant broadcast them along);
- maxpool: the plain gradient at the input (a tied window's to its first maximum, as torch's
  kernels and Captum route it), at the input's values at x taken from the activation before it,
  so that units a ReLU turns off at x are exact zeros and float32 and float64 plans see the same
  ties (:meth:`RevealCancelGraph._value_at_x`). This is *not* summation-to-delta: with a non-zero
  reference a max-pooling network's attributions need not add up to f(x) - f(x0), and the audit
  is meant to show it.

Everything per graph (the plan, weights in both dtypes, which nodes need a split) is prepared once
in the constructor; a chunk of rows costs only tensor operations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import fx, nn

from workers.methods._base import at_references
from workers.methods._fx_plan import (
    ACTIVATIONS,
    BoundPReLU,
    Plan,
    Step,
    elementwise,
    evaluate,
    family_plan,
    merge_parts,
    run_node,
    scale_and_shift,
    without_head,
)
from workers.methods._revealcancel_maps import AffineMaps, affine_maps, dense_maps
from workers.methods._revealcancel_rules import (
    Pair,
    Reveal,
    Split,
    affine_backward,
    affine_split,
    collapse,
    reveal_cancel,
    reveal_cancel_clipped,
    reveal_cancel_smooth,
    scaled_pair,
    scaled_split,
    sign_split,
)
from workers.models.dense_conv import MIN_ROWS

__all__ = ["Reference", "RevealCancelGraph", "SeedFn"]

SeedFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Moved = Callable[[torch.Tensor], torch.Tensor]  # a move node's value as a function of a tensor's
# A float32 sum of n terms is off by at most about n * 2**-24 of the sum of their magnitudes (|W| |da|
# for an affine output); a ReLU difference closer to zero than twice that may have the wrong sign,
# and its row is redone in float64. Layers of unknown fan-in (pooling) use the largest tolerance.
_ROUNDING = 2**-23
_MAX_TOLERANCE = 1e-4
_SPLIT_SOURCES = ("affine", "avgpool")
# elementwise nonlinearities: the RevealCancel rule (a quantize-dequantize pair is one, a staircase)
_RULED = (*ACTIVATIONS, "gated", "quantize")
# The float32 rounding checks are written for chains of ReLUs; SiLU, Hardswish and the pairs take
# differences of their values (reveal_cancel_smooth).
_FLOAT64_KINDS = ("merge", "move", "gated", "quantize")
_CARRIERS = ("shape", "move", "scale", "factor", "bias")  # a split passes through them


def needs_float64(plan: Plan) -> bool:
    """A graph with sums, concatenations, data movement, SiLU, Hardswish or quantize-dequantize pairs
    runs in float64 (the module's docstring)."""
    return any(step.kind in _FLOAT64_KINDS for step in plan.steps)


@dataclass(frozen=True)
class Reference:
    """Node values at the distinct reference rows (float64), and each row's distinct reference."""

    values: dict[fx.Node, torch.Tensor]
    rows: torch.Tensor  # (k,) index into the distinct rows


def _through_carriers(steps: dict[fx.Node, Step], node: fx.Node | None) -> list[fx.Node]:
    """``node`` and the sources behind it through the nodes that carry a split along (shape, move
    and scale nodes), up to the first node that is none of them."""
    assert node is not None
    chain = [node]
    while steps[chain[-1]].kind in _CARRIERS:
        source = steps[chain[-1]].source
        assert source is not None
        chain.append(source)
    return chain


class RevealCancelGraph:
    """A validated plan over ``graph``; :meth:`reference` then :meth:`multipliers` per chunk of rows."""

    def __init__(self, graph: nn.Module, method: str, dtype: torch.dtype) -> None:
        # A Softmax/Sigmoid output is left to the target's seed (deeplift_revealcancel.target_seed)
        self.plan, self.head = without_head(family_plan(graph, method, "RevealCancel"))
        self.dtype = dtype
        if needs_float64(self.plan) and dtype != torch.float64:
            raise ValueError("a graph with sums, concatenations or data movement runs in float64")
        self._steps = steps = {step.node: step for step in self.plan.steps}
        self._input = next(step.node for step in self.plan.steps if step.kind == "input")
        self.maps: dict[fx.Node, AffineMaps] = {}
        self._exact: dict[fx.Node, Any] = {}
        self._scales: dict[fx.Node, torch.Tensor] = {}  # a scale node's s, (C,)
        for step in self.plan.steps:
            if step.kind in _SPLIT_SOURCES:
                assert step.module is not None
                self.maps[step.node] = affine_maps(step.module, dtype)
                exact = (
                    self.maps[step.node]
                    if dtype == torch.float64
                    else affine_maps(step.module, torch.float64)
                )
                self._exact[step.node] = exact.full  # one float64 copy of the weights, not two (VGG11: 1 GB)
            elif step.kind == "scale":
                assert step.module is not None
                scale, shift = scale_and_shift(step.module)
                self._scales[step.node] = scale.to(dtype)
                self._exact[step.node] = partial(_scaled, scale.double(), shift.double())
            elif step.kind == "gated" and isinstance(step.module, BoundPReLU):  # its slope in float64
                self._exact[step.node] = step.module
        # Nodes whose split a ReLU reads (an affine output, possibly through shape, move and scale
        # nodes): only they pay for the second (|W| |da|) pass and hand non-plain multipliers back.
        self.split_nodes: set[fx.Node] = set()
        # Nodes whose difference's sign routes multipliers back (the inputs of split affine nodes and
        # of sign-split ReLUs). Only ReLUs among them are checked for a sign float32 cannot resolve:
        # the input's is exact, and an average pooling read directly by a split layer is not checked.
        self.sign_read: set[fx.Node] = set()
        for step in self.plan.steps:
            if step.kind in _RULED:
                self._needs_split(steps, step.source)
        self._per_row: dict[tuple[tuple[int, ...], torch.device], int] = {}
        self._dense: dict[tuple[fx.Node, torch.Size], AffineMaps] = {}
        self._tolerance = {
            node: min(_MAX_TOLERANCE, _ROUNDING * maps.fan_in) if maps.fan_in else _MAX_TOLERANCE
            for node, maps in self.maps.items()
        }

    def _needs_split(self, steps: dict[fx.Node, Step], node: fx.Node | None) -> None:
        """A ReLU (or a merge a ReLU reads) reads the split of ``node``: mark the affine outputs
        behind it (through shapes and merges) that make one, and the differences whose sign splits."""
        chain = _through_carriers(steps, node)
        end = steps[chain[-1]]
        if end.kind in _SPLIT_SOURCES:
            self.split_nodes.update(chain)
            self.sign_read.add(_through_carriers(steps, end.source)[-1])
        elif end.kind == "merge":
            self.split_nodes.update(chain)
            for part in end.sources:
                self._needs_split(steps, part)
        else:
            self.sign_read.add(chain[-1])

    def reference(self, x0: torch.Tensor, rows: torch.Tensor) -> Reference:
        """The forward pass at the distinct references ``x0`` (float64: one row per sample, so it
        costs next to nothing and gives the ReLUs correctly rounded reference points)."""
        return Reference(evaluate(self.plan, x0.to(torch.float64), self._exact), rows)

    def elements_per_row(self, sample_shape: tuple[int, ...], device: torch.device) -> int:
        """Float elements one row's forward pass holds (all node values at one point)."""
        key = (sample_shape, device)
        if key not in self._per_row:
            x = torch.zeros((1, *sample_shape), dtype=torch.float64, device=device)
            env = evaluate(self.plan, x, self._exact)
            self._per_row[key] = sum(
                v.numel() for v in env.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
            )
        return self._per_row[key]

    def multipliers(
        self, dx: torch.Tensor, ref: Reference, seed: SeedFn
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Input multipliers m (attributions are dx * m) for differences ``dx`` (in ``dtype``) from the
        references ``ref`` (``ref.rows`` one per row of dx). ``seed(out, out0)`` gives the multipliers
        of the outputs, all three shaped (k, -1). Below float64, also the rows (k,) bool whose
        result rounding may have changed (:func:`ambiguous_rows`); None in float64."""
        refs = len(ref.values[self._input])
        below = self.dtype != torch.float64
        shaky = torch.zeros(len(dx), dtype=torch.bool, device=dx.device) if below else None

        def at_rows(
            node: fx.Node, like: torch.Tensor | None = None, dtype: torch.dtype = self.dtype
        ) -> torch.Tensor:
            """``node`` at the rows' references, for a tensor shaped like ``like`` (by default
            ``node``'s difference): the distinct rows cast, then spread."""
            shape = (delta[node] if like is None else like).shape
            return at_references(ref.values[node].to(dtype), shape, refs, ref.rows, len(dx))

        delta: dict[fx.Node, Any] = {}
        # parts, the affine node that made them (None: a merge of several)
        split: dict[fx.Node, tuple[Split, fx.Node | None]] = {}
        reveal: dict[fx.Node, Reveal] = {}
        at_x: dict[fx.Node, torch.Tensor] = {}  # max-pooling inputs at x
        factors: dict[fx.Node, torch.Tensor] = {}  # factor nodes' constants, for the backward pass too
        for step in self.plan.steps:
            node, src = step.node, step.source
            if step.kind == "input":
                delta[node] = dx
            elif step.kind in _SPLIT_SOURCES:
                assert src is not None
                maps = self._maps_at(node, delta[src])
                if node in self.split_nodes:
                    split[node] = (affine_split(maps, delta[src]), node)
                    delta[node] = split[node][0].total
                else:
                    delta[node] = maps.linear(delta[src])
            elif step.kind == "gate":
                continue  # a SiLU's sigmoid: the product's rule takes the SiLU whole
            elif step.kind in _RULED:
                assert src is not None
                if src in split:
                    parts, made_by = split[src]
                    resolve = shaky is not None and node in self.sign_read
                    tolerance = self._tolerance[made_by] if resolve and made_by is not None else None
                else:  # the sign split of a difference that is exact or checked where it was made
                    parts, tolerance = sign_split(delta[src]), None
                if step.kind == "relu":
                    reveal[node] = reveal_cancel(at_rows(src), parts, tolerance)
                elif step.kind in ("gated", "quantize"):  # SiLU, Hardswish, pairs (float64 plans)
                    reveal[node] = reveal_cancel_smooth(at_rows(src), parts, elementwise(step))
                else:
                    assert isinstance(step.module, nn.Hardtanh)  # ReLU6, or a clamp to [0, c]
                    cap = float(step.module.max_val)
                    reveal[node] = reveal_cancel_clipped(at_rows(src), parts, cap, tolerance)
                delta[node] = reveal[node].delta
                unresolved = reveal[node].unresolved
                if shaky is not None and unresolved is not None:
                    shaky |= unresolved
            elif step.kind == "maxpool":
                assert src is not None and step.module is not None
                at_x[src] = self._value_at_x(src, at_rows, delta)
                pooled = step.module(at_x[src])
                delta[node] = pooled - at_rows(node, pooled)
            elif step.kind == "merge":
                delta[node] = run_node(self.plan, step, delta.__getitem__)
                if node in self.split_nodes:
                    split[node] = (self._merged_split(step, split, delta), None)
            elif step.kind == "scale":  # s x + b: the shift has no difference
                assert src is not None
                scale = self._scale(node, delta[src])
                delta[node] = delta[src] * scale
                if src in split:
                    parts, made_by = split[src]
                    split[node] = (scaled_split(parts, scale), made_by)
            elif step.kind in ("factor", "bias"):  # c * d (d / c), d + c: the shift has no difference
                assert src is not None
                shape = (len(dx), *ref.values[node].shape[1:])
                if step.kind == "factor":
                    factors[node] = self._factor(step, delta)
                factor = factors.get(node)
                delta[node] = (delta[src] if factor is None else delta[src] * factor).expand(shape)
                if src in split:
                    parts, made_by = split[src]
                    parts = parts if factor is None else scaled_split(parts, factor)
                    split[node] = (parts.map(partial(torch.Tensor.expand, size=shape)), made_by)
            elif step.kind == "move":  # linear: differences and their parts move like values
                delta[node] = run_node(self.plan, step, delta.__getitem__)
                if not isinstance(delta[node], tuple | list):  # a Split's parts move one by one
                    origin, move = self._moved(step, delta)
                    if origin in split:
                        parts, made_by = split[origin]
                        split[node] = (parts.map(move), made_by)
            else:  # static and shape nodes: evaluated on the differences (same shapes as values)
                delta[node] = run_node(self.plan, step, delta.__getitem__)
                if step.kind == "shape" and src in split:
                    parts, made_by = split[src]
                    split[node] = (parts.map(partial(_substituted, self.plan, step, delta)), made_by)

        output = self.plan.output
        k = len(dx)
        out0 = at_rows(output, dtype=torch.float64).expand(delta[output].shape).reshape(k, -1)
        seeded = seed(out0 + delta[output].reshape(k, -1).to(torch.float64), out0)
        start = Pair(seeded.reshape(delta[output].shape).to(self.dtype))
        return self._backward(delta, reveal, at_x, factors, start), shaky

    def _backward(
        self,
        delta: dict[fx.Node, Any],
        reveal: dict[fx.Node, Reveal],
        at_x: dict[fx.Node, torch.Tensor],
        factors: dict[fx.Node, torch.Tensor],
        start: Pair,
    ) -> torch.Tensor:
        pairs: dict[fx.Node, Pair] = {self.plan.output: start}

        def give(node: fx.Node, pair: Pair) -> None:
            pairs[node] = pairs[node] + pair if node in pairs else pair

        for step in reversed(self.plan.steps):
            node, src = step.node, step.source
            if step.kind == "static" or node not in pairs:
                continue
            pair = pairs.pop(node)
            if step.kind == "input":
                return collapse(pair, delta[node])
            assert src is not None
            if step.kind in _SPLIT_SOURCES:
                give(src, Pair(affine_backward(self._maps_at(node, delta[src]), delta[src], pair)))
            elif step.kind in _RULED:
                d = collapse(pair, delta[node])
                rule = reveal.pop(node)  # its buffers become the source's multipliers
                give(src, Pair(rule.mean.mul_(d), rule.half_diff.mul_(d)))
            elif step.kind == "shape":
                give(src, pair.map(partial(torch.reshape, shape=delta[src].shape)))
            elif step.kind == "merge":
                for part, share in _merge_shares(step, pair, delta):
                    give(part, share)
            elif step.kind == "scale":
                give(src, scaled_pair(pair, self._scale(node, delta[src])))
            elif step.kind in ("factor", "bias"):
                back = scaled_pair(pair, factors[node]) if node in factors else pair
                give(src, back.map(partial(_summed_to, shape=delta[src].shape)))
            elif step.kind == "move":
                origin, move = self._moved(step, delta)
                give(origin, pair.map(partial(_adjoint, move, delta[origin])))
            else:  # maxpool: the gradient at x
                assert step.module is not None
                u = at_x[src].detach().requires_grad_(True)
                with torch.enable_grad():
                    (grad,) = torch.autograd.grad(step.module(u), u, collapse(pair, delta[node]))
                give(src, Pair(grad))
        return torch.zeros_like(delta[self._input])  # no path reached the input

    def _value_at_x(
        self, node: fx.Node, at_rows: Callable[..., torch.Tensor], delta: dict[fx.Node, Any]
    ) -> torch.Tensor:
        """A max pooling's input at x. Behind a ReLU or clip (through reshapes and data movement:
        Keras pools between Transposes), that activation of the pre-activation at x, moved as the
        graph moves it: a unit off at x is then an exact zero in float32 and float64 plans alike,
        where reference plus difference leaves rounding that would break the ties among them."""
        moves: list[Step] = []
        step = self._steps[node]
        while step.kind in ("shape", "move") and step.source is not None:
            if not isinstance(delta[step.source], torch.Tensor):  # a part of a Split's tuple
                break
            moves.append(step)
            step = self._steps[step.source]
        if step.kind not in ACTIVATIONS or step.source is None:
            return at_rows(node) + delta[node]
        z = at_rows(step.source) + delta[step.source]
        value = torch.relu(z) if step.kind == "relu" else elementwise(step)(z)  # as the Rescale pass
        for move in reversed(moves):
            value = _substituted(self.plan, move, delta, value)
        return value

    def _maps_at(self, node: fx.Node, like: torch.Tensor) -> AffineMaps:
        """The maps of ``node`` for inputs shaped like ``like``: dense products where cheaper."""
        if len(like) < MIN_ROWS:  # a dense product costs its whole matrix per row
            return self.maps[node]
        key = (node, like.shape[1:])
        if key not in self._dense:
            self._dense[key] = dense_maps(self.maps[node], like)
        return self._dense[key]

    def _merged_split(
        self, step: Step, split: dict[fx.Node, tuple[Split, fx.Node | None]], delta: dict[fx.Node, Any]
    ) -> Split:
        """The split of a merge: the module applied to its parts' splits field by field (an affine
        part's own split, any other part's difference split by its sign)."""
        parts = {part: split[part][0] if part in split else sign_split(delta[part]) for part in step.sources}

        def field(name: str) -> torch.Tensor:
            values = {part: getattr(parts[part], name) for part in parts}
            result: torch.Tensor = run_node(self.plan, step, values.__getitem__)
            return result

        return Split(field("pos"), field("neg"), field("total"), field("spread"))

    def _scale(self, node: fx.Node, like: torch.Tensor) -> torch.Tensor:
        """A scale node's s shaped to multiply ``like`` (batch, channels, ...) channel by channel."""
        return _per_channel(self._scales[node], like)

    def _factor(self, step: Step, delta: dict[fx.Node, Any]) -> torch.Tensor:
        """A factor node's constant c (1 / c for a division), broadcast as the node broadcasts it."""
        assert step.source is not None
        one = torch.ones(
            (1, *delta[step.source].shape[1:]), dtype=self.dtype, device=delta[step.source].device
        )
        factor: torch.Tensor = _substituted(self.plan, step, delta, one)
        return factor

    def _moved(self, step: Step, env: dict[fx.Node, Any]) -> tuple[fx.Node, Moved]:
        """The tensor a move node's value comes from, and the move as a function of that tensor
        (through a Split's tuple of parts to the tensor it split)."""
        assert step.source is not None
        move = partial(_substituted, self.plan, step, env)
        if isinstance(env[step.source], tuple | list):
            origin, inner = self._moved(self._steps[step.source], env)
            return origin, lambda value: move(inner(value))
        return step.source, move


def _substituted(plan: Plan, step: Step, env: dict[fx.Node, Any], value: Any) -> Any:
    """Run ``step``'s node on ``value`` in place of its activation argument (the rest from ``env``)."""
    return run_node(plan, step, lambda n: value if n is step.source else env[n])


def _per_channel(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-channel ``values`` (C,) shaped to broadcast over ``like`` (batch, channels, ...)."""
    return values.view(-1, *[1] * (like.dim() - 2)).to(like.device)


def _scaled(scale: torch.Tensor, shift: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A batch norm's s x + b, channel by channel (the reference pass's float64 copy)."""
    return value * _per_channel(scale, value) + _per_channel(shift, value)


def _adjoint(move: Moved, like: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """The multipliers of a move's output taken back to its input (shaped like ``like``): the move's
    gradient, the same at every point because a move is linear."""
    with torch.enable_grad():
        at = torch.zeros_like(like).requires_grad_(True)
        (back,) = torch.autograd.grad(move(at), at, multipliers)
    return back


def _merge_shares(step: Step, pair: Pair, delta: dict[fx.Node, Any]) -> list[tuple[fx.Node, Pair]]:
    """Each part of a merge with its multipliers: the whole pair for a summand (summed over any axis
    it was broadcast along), its slice for a part of a concatenation."""
    parts, axis = merge_parts(step)
    if axis is None:
        return [(part, pair.map(partial(_summed_to, shape=delta[part].shape))) for part in parts]
    sizes = [delta[part].shape[axis] for part in parts]
    slices = zip(*(torch.split(t, sizes, dim=axis) for t in _pair_fields(pair)), strict=True)
    return [(part, _pair_of(fields, pair)) for part, fields in zip(parts, slices, strict=True)]


def _summed_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return t.sum_to_size(shape)


def _pair_fields(pair: Pair) -> list[torch.Tensor]:
    return [pair.mean] if pair.half_diff is None else [pair.mean, pair.half_diff]


def _pair_of(fields: tuple[torch.Tensor, ...], like: Pair) -> Pair:
    return Pair(fields[0]) if like.half_diff is None else Pair(fields[0], fields[1])
