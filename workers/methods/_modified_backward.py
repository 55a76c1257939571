"""LRP and Deep Taylor as one forward and one backward pass over the fx plan (docs/science.md 5.8).

Each Linear/Conv/pooling layer on the output's path is replaced by its rule's modified output
(:mod:`workers.methods._lrp_rules`): the same value, the rule's gradient. ReLU, reshapes and
max-pooling keep their gradient, as they do under Zennit. One ``torch.autograd.grad`` then gives a
modified gradient ``g`` with relevance ``x * g``: Zennit's result without its per-layer hooks,
re-run forwards and nested backward passes.

A ReLU6 passes relevance through unchanged (Zennit's ``Pass``, which its composites give every
activation): with ``g = R / value`` on both sides, its backward multiplies by ``relu6(z) / z``. That
is the ReLU's gradient wherever the unit does not saturate; where it does (z > 6) the gradient
would drop the relevance the layer above handed the unit.

Multiplicative gates are held constant (docs/science.md 5.8): a sigmoid gate's value is taken
without its gradient, so the product ``a * g`` hands ``a`` all of its relevance and the gate's
branch none; SiLU and Hardswish, ``z`` times a gate of ``z``, pass relevance as ReLU6 does.

Transformers (Ali et al. 2022): a layer norm is evaluated with its scale 1 / std held constant
(:func:`_held_norm`), an attention head's softmax weights are a gate of the values, and GELU and
tanh pass relevance as SiLU does; a MatMul with a constant matrix is a Linear layer, its Add's bias
folded in.

Residual sums and concatenations keep their gradient too: below the topmost rule layer the backward
quantity is ``g = R / value``, so a sum z = a + b hands a and b the relevance ``a * g`` and ``b * g``,
shares a / z and b / z of z's (the proportional rule, Zennit's Norm on the Sum its ResNet canonizer
inserts), and relevance reaching one value along two paths adds up (docs/science.md 5.8).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import fx, nn

from workers.methods._base import AttributionContext, in_row_chunks
from workers.methods._fx_plan import (
    ACTIVATIONS,
    ConstantMatMul,
    Plan,
    Step,
    above_top,
    below_output,
    evaluate,
    family_plan,
    folded_layer,
    folds_into,
    is_difference,
    is_elementwise,
    is_self_gated,
    layer_norm_parts,
    norm_centres,
    relayed_factor,
)
from workers.methods._lrp_rules import Epsilon, LayerRule, ZBox, stabilize
from workers.methods._passes import rows_per_pass
from workers.methods._reroute import rerouted
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

__all__ = [
    "RelevanceGraph",
    "Rules",
    "lrp_plan",
    "lrp_relevance",
    "output_path",
]

# The rule of the i-th Linear/Conv layer in execution order (Zennit's composite's index).
Rules = Callable[[int], LayerRule]
_NORM = Epsilon(1e-6)  # average pooling: LRP-0 with Zennit's stabiliser (its Norm rule)
# What this pass has rules for and Zennit's (the fallback for a z-beta layer not at the input) has not.
_ZENNIT_LACKS = {
    "gate": "gates (SiLU, squeeze-and-excitation)",
    "gated": "gates (SiLU, squeeze-and-excitation)",
    "head": "the output's Softmax or Sigmoid",
    "scale": "batch norms",
    "norm": "layer and instance normalisation",
    "factor": "constant factors",
    "bias": "constant shifts and concatenations",
    "folded": "constant shifts and concatenations",
    "branch": "attention and GELU gates",
}
_PASS_SIGN = ("relu", "shape", "move", "maxpool", "avgpool", "gated")  # x >= 0 in, x >= 0 out


def output_path(plan: Plan) -> list[Step]:
    """The steps the output's relevance reaches, in execution order (merges have several sources; a
    gate's branch is not on it)."""
    by_node = {step.node: step for step in plan.steps}
    needed, stack = set(), [plan.output]
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            step = by_node[node]
            stack.extend(step.sources or ([step.source] if step.source is not None else []))
    return [step for step in plan.steps if step.node in needed]


class RelevanceGraph:
    """The plan with each rule layer's modified output; ``None`` from :meth:`build` where a rule
    cannot be written this way (a z-beta layer whose input is no view of the model's input)."""

    def __init__(
        self,
        plan: Plan,
        layers: dict[fx.Node, tuple[Any, LayerRule, bool, bool]],
        path: list[Step],
        views: dict[fx.Node, bool],
        split_at: fx.Node | None = None,
    ) -> None:
        self.plan = plan
        self.layers = layers  # node -> (module, rule, top, nonneg)
        # A sum or concatenation that receives the output's relevance (MONAI's residual units end a
        # U-Net with conv(x) + conv1x1(x)): relevance there divided by its value is the modified
        # gradient every layer below takes, and a sum's gradient hands each summand its share z_i / z
        # (the proportional rule), a concatenation's each part its own slice. None: the topmost
        # rule layer receives the relevance itself.
        self.split_at = split_at
        # The layers that read the input, each by its view of it (z-beta's layers: a recurrent layer
        # reads it at every step). Where a view is moved (transposed, padded, cropped, a time step)
        # or scaled and shifted elementwise (a normalization), not just reshaped, the bounds there
        # are the input's bounds carried along (_bounds), and a rule's leaf's relevance goes back to
        # the input by the moves' gradient, unchanged through the scalings (docs/science.md 5.8).
        self.input_layers = {s.node: s.source for s in path if s.kind == "affine" and s.source in views}
        self.moved_sources = {source for source in self.input_layers.values() if views.get(source)}
        sources = set(self.input_layers.values())
        single = next(iter(sources)) if len(sources) == 1 else None
        self.moved_input = single if single in self.moved_sources else None
        # Scalings and shifts of the input on its one way to the first layer (a normalization baked
        # into the model): relevance is taken at the first layer's input, as where the normalization
        # is preprocessing, and goes back to each raw value unchanged (not x times the gradient:
        # x / (x - mean) of it, unbounded near the mean).
        chain = _input_chain(plan, path, views, self.moved_input)
        self.scalings = {s.node for s in path if s.node in chain and is_elementwise(s)}
        self._bounds_at: dict[tuple[Any, ...], dict[fx.Node, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.has_rules = bool(layers) or split_at is not None  # relevance is value times g
        # a batch norm or a bias folded into the layer before (on the path only: a gate's branch
        # keeps its own layers, and with them its norms and biases)
        self.folded = {
            step.node
            for step in path
            if step.kind == "folded" or (step.kind == "scale" and folds_into(plan, step))
        }
        # ReLU6, SiLU and Hardswish pass relevance through; a gate is taken as a constant. A batch
        # norm not folded keeps its gradient: the epsilon rule on it as a diagonal layer (Zennit's
        # Norm), its shift absorbing a share. Passing relevance through unchanged (Zennit's default
        # Pass) hands the layer below relevance of the norm's output over its own: LeViT's attention
        # scores then grew to 1e7 where a pre-norm activation was near 0 and the shift was not.
        # A quantize-dequantize pair passes it too; between the output and the top layer it passes
        # the output's relevance, its own value, on as it comes (the top layer divides it by its z).
        above = {step.node for step in above_top(plan)}
        self.passes = {
            step.node: step.module
            for step in plan.steps
            if step.kind == "clip"
            or (step.kind == "quantize" and step.node not in above)
            or (step.kind == "gated" and is_self_gated(step.module))
        }
        self.relayed_steps = {
            step.node: step.module for step in plan.steps if step.kind == "quantize" and step.node in above
        }
        self.gates = {step.node for step in plan.steps if step.kind == "gate"}
        # a positive number the output is multiplied by after the top layer or merge: relevance passes
        relayed = {step.node: relayed_factor(plan, step) for step in above_top(plan)}
        self.relayed = {node: factor for node, factor in relayed.items() if factor is not None}
        self.norms = {step.node: step.module for step in plan.steps if step.kind == "norm"}

    @classmethod
    def build(cls, plan: Plan, rules: Rules) -> RelevanceGraph | None:
        """The pass, or None where the first layer's rule needs the input and that layer is not at
        the input (Zennit's hooks then write it: :func:`lrp_plan`)."""
        path = output_path(plan)
        views = _input_views(path)
        if rules(0).needs_input_layer and not _first_layer_at_input(plan, path, views):
            return None
        # the rules' index counts the layers relevance passes (a gate's branch has none); a rule for
        # the input (z-beta) goes to every layer that reads it, as Deep Taylor's input domain asks
        index = {s.node: i for i, s in enumerate(s for s in path if s.kind == "affine")}
        input_rule = rules(0) if rules(0).needs_input_layer else None
        # a batch norm right after a layer is folded into it; the norm itself then passes values on
        norms = {s.source: s.module for s in path if s.kind == "scale" and folds_into(plan, s)}
        nonneg: set[fx.Node] = set()
        layers: dict[fx.Node, tuple[Any, LayerRule, bool, bool]] = {}
        for step in path:
            if step.kind in ACTIVATIONS or (
                step.kind in _PASS_SIGN and step.source in nonneg and not step.signed
            ):
                nonneg.add(step.node)
            if (
                step.kind == "merge"
                and all(source in nonneg for source in step.sources)
                and not is_difference(step)
            ):
                nonneg.add(step.node)
            if step.kind in ("affine", "avgpool"):
                rule = rules(index[step.node]) if step.kind == "affine" else _NORM
                if step.kind == "affine" and input_rule is not None and step.source in views:
                    rule = input_rule
                if rule.needs_input_layer and step.source not in views:  # its extra leaf: the input only
                    return None
                norm = norms.get(step.node)
                module = step.module
                if norm is not None:
                    assert module is not None
                    module = folded_layer(module, norm)
                layers[step.node] = (module, rule, False, step.source in nonneg)
        top = below_output(plan.steps, plan.output)
        if top.kind == "merge":  # relevance is split there: the pass divides it by the merge's value
            return cls(plan, layers, path, views, split_at=top.node)
        if layers:  # the topmost rule layer receives relevance, not the modified gradient
            assert top.node in layers
            module, rule, _, sign = layers[top.node]
            layers[top.node] = (module, rule, True, sign)
        return cls(plan, layers, path, views)

    def relevance(self, x: torch.Tensor, target: Target, classes: torch.Tensor) -> torch.Tensor:
        """Input relevance for rows ``x``, seeded (as in Zennit) by the one-hot target score."""
        leaves: list[torch.Tensor] = []
        leaf_sources: list[fx.Node | None] = []  # the input view each leaf sits at
        moved = self.moved_input
        input_rule = next((spec[1] for node, spec in self.layers.items() if node in self.input_layers), None)
        bounds = self._bounds(x, input_rule) if input_rule is not None and self.moved_sources else {}

        def ruled(node: fx.Node, module: Any, rule: LayerRule, top: bool, sign: bool) -> Any:
            source = self.input_layers.get(node)
            at = bounds.get(source) if source is not None else None

            def call(a: torch.Tensor) -> torch.Tensor:
                count = len(leaves)
                out = rule.modified(module, a, top, sign, leaves, at)
                leaf_sources.extend([source] * (len(leaves) - count))
                return out

            return call

        replace: dict[fx.Node, Any] = {node: ruled(node, *spec) for node, spec in self.layers.items()}
        replace.update({node: partial(_passed, module) for node, module in self.passes.items()})
        replace.update({node: _unchanged for node in self.folded})
        replace.update({node: partial(_held_norm, module) for node, module in self.norms.items()})
        replace.update({node: partial(_relayed, factor) for node, factor in self.relayed.items()})
        replace.update({node: partial(_relayed_step, module) for node, module in self.relayed_steps.items()})
        start = x = x.detach()
        if self.scalings:  # relevance is taken at the first layer's input
            assert moved is not None
            with torch.no_grad():
                start = evaluate(self.plan, x, until=moved)[moved]
            replace[moved] = partial(_given, start)  # its value, a leaf of the graph
        start.requires_grad_(True)
        env = evaluate(self.plan, x, replace, held=self.gates)
        out = env[self.plan.output]
        if self.split_at is not None:
            merged = env[self.split_at]
            merged.register_hook(partial(_over_value, stabilize(merged.detach(), 1e-6)))
        scores = out.reshape(out.shape[0], -1)
        if target.kind != "logit":  # the softmax is crossed by its gradient, as under Zennit
            scores = target.transform(scores)
        seed = torch.zeros_like(scores).scatter_(1, classes[:, None], 1.0) * scores.detach()
        # z-beta's bound terms: relevance at the reshaped input, or taken back from a moved view
        carried = [start is x and source in self.moved_sources for source in leaf_sources]
        grads = torch.autograd.grad(scores, [start, *leaves], seed, retain_graph=any(carried))
        relevance = start.detach() * grads[0] if self.has_rules else grads[0]
        for extra, back in zip(grads[1:], carried, strict=True):
            if not back:
                relevance = relevance + extra.reshape(relevance.shape)
        if any(carried):
            views = [
                env[source] for source, back in zip(leaf_sources, carried, strict=True) if back and source
            ]
            extras = [extra for extra, back in zip(grads[1:], carried, strict=True) if back]
            relevance = relevance + torch.autograd.grad(views, x, extras)[0]
        if start is not x:
            relevance = self._moved_back(x, relevance)
        return relevance.detach()

    def _bounds(self, x: torch.Tensor, rule: LayerRule) -> dict[fx.Node, tuple[torch.Tensor, torch.Tensor]]:
        """z-beta's bounds at each moved view of the input a layer reads, (1, *its shape): the
        input's constant bounds carried through the moves, scalings and shifts on the way, the
        smaller and the larger of the two at each position (a negative scale swaps them); 0 where a
        zero pad adds positions, which hold no input. Once per input shape; none for a rule without
        bounds."""
        if not isinstance(rule, ZBox):
            return {}
        key = (tuple(x.shape[1:]), x.dtype, x.device, rule)
        if key not in self._bounds_at:
            last = [step.node for step in self.plan.steps if step.node in self.moved_sources][-1]
            with torch.no_grad():  # all rows: a graph may be exported for a fixed batch
                ends = [
                    evaluate(self.plan, torch.full_like(x, bound), until=last)
                    for bound in (rule.low, rule.high)
                ]
            self._bounds_at[key] = {
                source: (
                    torch.minimum(ends[0][source][:1], ends[1][source][:1]),
                    torch.maximum(ends[0][source][:1], ends[1][source][:1]),
                )
                for source in self.moved_sources
            }
        return self._bounds_at[key]

    def _moved_back(self, x: torch.Tensor, relevance: torch.Tensor) -> torch.Tensor:
        """Relevance at the first layer's input taken back to ``x``: by the moves' gradient, each
        value's to where it came from, and unchanged through the elementwise scalings and shifts (a
        normalization only re-expresses each value)."""
        assert self.moved_input is not None
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            identity = dict.fromkeys(self.scalings, _unchanged)
            carried = evaluate(self.plan, x, identity, until=self.moved_input)[self.moved_input]
            (back,) = torch.autograd.grad(carried, x, relevance)
        return back


def _input_chain(
    plan: Plan, path: list[Step], views: dict[fx.Node, bool], moved: fx.Node | None
) -> set[fx.Node]:
    """The view nodes from the input to ``moved`` where they are its only way: each read by the next
    alone (reads of its shape aside). Empty where the input or a view of it also goes elsewhere."""
    if moved is None:
        return set()
    static = {step.node for step in plan.steps if step.kind == "static"}
    way = _way_in(path, moved)
    if any(len([user for user in step.node.users if user not in static]) != 1 for step in way[1:]):
        return set()
    return {step.node for step in way}


def _way_in(path: list[Step], view: fx.Node) -> list[Step]:
    """The steps from the input view ``view`` back to the input, following their sources."""
    by_node = {step.node: step for step in path}
    way = [by_node[view]]
    while way[-1].source is not None:
        way.append(by_node[way[-1].source])
    return way


def _first_layer(path: list[Step]) -> Step | None:
    """The first Linear/Conv layer on the output's path, if any."""
    return next((step for step in path if step.kind == "affine"), None)


def _first_layer_at_input(plan: Plan, path: list[Step], views: dict[fx.Node, bool]) -> bool:
    """Whether the first Linear/Conv layer on the output's path takes the input (reshaped, moved, or
    scaled on its one way there), or there is none: where a rule's extra leaf (z-beta's bound
    terms) can sit. A normalization whose output also goes elsewhere is not such a way: its
    relevance could not be taken back through it alone."""
    first = _first_layer(path)
    if first is None or first.source is None:
        return True
    if first.source not in views:
        return False
    scaled = any(is_elementwise(step) for step in _way_in(path, first.source))
    return not scaled or bool(_input_chain(plan, path, views, first.source))


def _input_views(path: list[Step]) -> dict[fx.Node, bool]:
    """The input and its views: reshapes, moves (transpositions, zero or copying pads, crops: Keras'
    ZeroPadding2D before a ResNet's first convolution) and elementwise scalings and shifts (a
    normalization baked into the model), where a rule's extra leaf (z-beta's bounds) can sit; each
    with whether a move or a scaling is on its way from the input (its relevance then goes back by
    more than a reshape)."""
    views: dict[fx.Node, bool] = {}
    for step in path:
        if step.kind == "input":
            views[step.node] = False
        elif (step.kind in ("shape", "move") or is_elementwise(step)) and step.source in views:
            views[step.node] = views[step.source] or step.kind != "shape"
    return views


def lrp_plan(graph: Any, method: str, first_needs_input: bool) -> Plan:
    """The LRP plan of ``graph`` (:func:`family_plan`); NotApplicable also where the first layer's
    rule needs the input itself (z-beta, ``first_needs_input``) and that layer's input is not the
    model's: only Zennit's hooks write that rule, and Zennit has no rule for some of the plan's
    operators (its fallback, :mod:`workers.methods._zennit`, would take their gradient). `xaudit
    inspect` asks the same."""
    plan = family_plan(graph, method, "LRP")
    if not first_needs_input:
        return plan
    path = output_path(plan)
    if _first_layer_at_input(plan, path, _input_views(path)):
        return plan
    lacking = {_ZENNIT_LACKS[s.kind] for s in plan.steps if s.kind in _ZENNIT_LACKS}
    if any(isinstance(s.module, ConstantMatMul) for s in plan.steps):
        lacking.add("products with a constant matrix (Linear layers on 3-d inputs)")
    if lacking:
        raise NotApplicable(
            method,
            "its first layer's z-beta rule needs the input itself, which only Zennit's hooks "
            f"can apply, and Zennit has no rule here for {' or '.join(sorted(lacking))}",
        )
    return plan


def _passed(activation: Any, z: torch.Tensor) -> torch.Tensor:
    """``activation(z)``, relevance passed through unchanged: the backward quantity (relevance /
    value) times ``activation(z) / z`` (for ``z`` times a gate of ``z``, the gate), 0 at z = 0,
    where the relevance is 0 either way."""
    y: torch.Tensor = activation(z)
    with torch.no_grad():
        scale = torch.where(z != 0, y / z, torch.zeros_like(z))
    return rerouted(y, z, scale)


def _unchanged(z: torch.Tensor) -> torch.Tensor:
    return z


def _given(value: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return value


def _relayed(factor: float, z: torch.Tensor) -> torch.Tensor:
    """``factor * z``, the relevance above the top layer passed on unchanged (gradient 1)."""
    return rerouted(z * factor, z, torch.ones_like(z))


def _relayed_step(activation: Any, z: torch.Tensor) -> torch.Tensor:
    """``activation(z)``, the relevance above the top layer passed on unchanged (gradient 1)."""
    return rerouted(activation(z), z, torch.ones_like(z))


def _over_value(value: torch.Tensor, relevance: torch.Tensor) -> torch.Tensor:
    return relevance / value


def _held_norm(norm: Any, z: torch.Tensor) -> torch.Tensor:
    """A layer (or instance) normalisation with its scale 1 / std held constant (the LN rule of Ali et
    al. 2022): the centring ``z - mean(z)`` keeps its gradient, so relevance passes as through a linear
    layer whose shift (the norm's bias) absorbs its share. An RMS normalisation does not centre: held,
    it is a diagonal layer, and relevance passes through it unchanged, as through a local response
    norm (AlexNet's, GoogLeNet's) with its divisor held constant."""
    if isinstance(norm, nn.LocalResponseNorm):
        return z / _response_divisor(norm, z).detach()
    axes, epsilon, weight, bias = layer_norm_parts(norm, z.ndim)
    centred = z - z.mean(axes, keepdim=True) if norm_centres(norm) else z
    with torch.no_grad():
        scale = torch.rsqrt(centred.square().mean(axes, keepdim=True) + epsilon)
    y = centred * scale
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def _response_divisor(norm: nn.LocalResponseNorm, z: torch.Tensor) -> torch.Tensor:
    """(k + alpha * the mean of z^2 over the ``size`` channels around each) ^ beta, the divisor of
    ``torch.nn.functional.local_response_norm`` (computed as it computes it)."""
    squares = z.square().unsqueeze(1)
    padding = (norm.size // 2, (norm.size - 1) // 2)
    flat = squares.reshape(len(z), 1, z.shape[1], z.shape[2] if z.ndim > 2 else 1, -1)
    flat = torch.nn.functional.pad(flat, (0, 0, 0, 0, *padding))
    mean = torch.nn.functional.avg_pool3d(flat, (norm.size, 1, 1), stride=1).reshape(z.shape)
    return mean.mul(norm.alpha).add(norm.k).pow(norm.beta)


def lrp_relevance(
    ctx: AttributionContext, method: str, rules: Rules, inputs: torch.Tensor, classes: torch.Tensor
) -> torch.Tensor:
    """Input relevance (k, *shape) float32 for the target class of each row; Zennit where the plan
    has a rule this pass cannot write (the result is the same, only slower; Zennit refuses merges).
    Rows are independent here, so a graph exported with a fixed batch of 1 runs one row per pass."""
    graph = ctx.model.torch_hookable(method, row_by_row=True)
    # Zennit would silently use the gradient at other operators
    plan = lrp_plan(graph, method, rules(0).needs_input_layer)
    modified = RelevanceGraph.build(plan, rules)
    if modified is None:
        from workers.methods._zennit import lrp_relevance as zennit_relevance

        return zennit_relevance(ctx, method, lambda i, _: rules(i).zennit(), inputs, classes)

    def relevance(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return modified.relevance(x, ctx.target, c)

    with torch.enable_grad():
        rows = ctx.model.hook_batch or rows_per_pass(inputs, graph)
        return in_row_chunks(rows, relevance, classes, inputs, exact=ctx.model.hook_batch is not None)
