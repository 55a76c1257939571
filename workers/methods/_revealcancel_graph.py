"""An explicit interpreter of an onnx2torch fx graph for DeepLIFT RevealCancel.

The forward pass evaluates every node at the input and at the reference (float64), and the split
of each difference into positive and negative parts; the backward pass walks the nodes in reverse
and applies one rule per node kind (see :mod:`workers.methods._revealcancel_rules`).

Node kinds on the input's path ("activations"):
- affine: Linear, Conv1d/2d/3d, average pooling (W >= 0): the split rule and its backward;
- relu: the RevealCancel multipliers, from the split of its input (an affine output, possibly
  through flatten/reshape; otherwise the elementwise sign split, where RevealCancel is Rescale);
- shape: Flatten, Reshape, Identity, eval-mode Dropout: pass splits and multipliers through;
- maxpool: the plain gradient at the input. This is *not* summation-to-delta: with a non-zero
  reference a max-pooling network's attributions need not add up to f(x) - f(x0), and the audit
  is meant to show it.
Nodes that do not depend on the input (constants, shape arithmetic after ``Shape``) are "static".
Anything else on the input's path raises NotApplicable naming the operator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import fx, nn

from workers.errors import NotApplicable
from workers.methods._revealcancel_rules import (
    AFFINE_TYPES,
    AffineMaps,
    Pair,
    Split,
    affine_backward,
    affine_maps,
    affine_split,
    collapse,
    reveal_cancel,
    sign_split,
)

__all__ = ["RevealCancelGraph", "SeedFn"]

SeedFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Kind = Literal["input", "affine", "relu", "shape", "maxpool", "static"]

_SHAPE_NAMES = {"Flatten", "OnnxFlatten", "OnnxReshape", "Identity", "OnnxCopyIdentity", "Dropout"}
_AVG_NAMES = {"OnnxGlobalAveragePool", "OnnxGlobalAveragePoolWithKnownInputShape"}
_SHAPE_READERS = {"OnnxShape"}  # activation in, shape out: static
_MAXPOOL = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
SUPPORTED = "Linear, Conv, ReLU, Flatten, Reshape, MaxPool, AvgPool"


@dataclass(frozen=True)
class _Step:
    node: fx.Node
    kind: Kind
    module: nn.Module | None
    source: fx.Node | None  # the one activation argument
    maps: AffineMaps | None = None


def _leaves(arg: Any) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(arg, found.append)
    return found


class RevealCancelGraph:
    """A validated plan over ``graph``; :meth:`multipliers` runs it on one chunk of rows."""

    def __init__(self, graph: nn.Module, method: str) -> None:
        if not isinstance(graph, fx.GraphModule):
            raise NotApplicable(method, "needs a traced graph (torch.fx) of Linear/Conv/ReLU layers")
        self.graph = graph
        self.steps: list[_Step] = []
        self.output: fx.Node | None = None
        active: set[fx.Node] = set()
        for node in graph.graph.nodes:
            step = self._classify(node, active, method)
            if step is None:
                continue
            if step.kind != "static":
                active.add(node)
            self.steps.append(step)
        if self.output is None or self.output not in active:
            raise NotApplicable(method, "the model's output does not depend on its input")

    def _classify(self, node: fx.Node, active: set[fx.Node], method: str) -> _Step | None:
        if node.op == "output":
            leaves = _leaves(node.args[0])
            self.output = leaves[0] if leaves else None
            return None
        if node.op == "placeholder":
            if any(s.kind == "input" for s in self.steps):
                raise NotApplicable(method, "the model has more than one input")
            return _Step(node, "input", None, None)
        inputs = [a for a in _leaves((node.args, node.kwargs)) if a in active]
        module = self.graph.get_submodule(str(node.target)) if node.op == "call_module" else None
        name = _operator_name(node, module)
        # x.shape / x.size() / Shape read an activation but give the same value at x and x0.
        if not inputs or name in _SHAPE_READERS or node.target == "size" or node.target is getattr:
            return _Step(node, "static", module, None)
        if module is None or len(inputs) != 1:
            raise NotApplicable(
                method,
                f"operator {name} (node '{node.name}') has no RevealCancel rule; supported: {SUPPORTED}",
            )
        source = inputs[0]
        if isinstance(module, AFFINE_TYPES) or name in _AVG_NAMES:
            maps = (
                affine_maps(module) if isinstance(module, AFFINE_TYPES) else AffineMaps(module, module, None)
            )
            return _Step(node, "affine", module, source, maps)
        if isinstance(module, nn.ReLU):
            return _Step(node, "relu", module, source)
        if name in _SHAPE_NAMES:
            return _Step(node, "shape", module, source)
        if isinstance(module, _MAXPOOL):
            return _Step(node, "maxpool", module, source)
        raise NotApplicable(
            method, f"operator {name} (node '{node.name}') has no RevealCancel rule; supported: {SUPPORTED}"
        )

    def _evaluate(self, x: torch.Tensor) -> dict[fx.Node, Any]:
        env: dict[fx.Node, Any] = {}
        for step in self.steps:
            node = step.node
            if step.kind == "input":
                env[node] = x
            elif step.kind == "affine":
                assert step.maps is not None and step.source is not None
                env[node] = step.maps.full(env[step.source])
            elif node.op == "get_attr":
                env[node] = _fetch(self.graph, node)
            else:
                args = fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
                if node.op == "call_module":
                    env[node] = step.module(*args, **kwargs)  # type: ignore[misc]
                elif node.op == "call_function":
                    env[node] = node.target(*args, **kwargs)  # type: ignore[operator]
                else:  # call_method
                    env[node] = getattr(args[0], str(node.target))(*args[1:], **kwargs)
        return env

    def elements_per_row(self, sample_shape: tuple[int, ...], device: torch.device) -> int:
        """Float elements one row's forward pass holds (all node values at one point)."""
        env = self._evaluate(torch.zeros((1, *sample_shape), dtype=torch.float64, device=device))
        return sum(v.numel() for v in env.values() if isinstance(v, torch.Tensor) and v.is_floating_point())

    def _shape_apply(self, step: _Step, env: dict[fx.Node, Any], value: torch.Tensor) -> torch.Tensor:
        """Run a shape node on ``value`` in place of its activation argument."""
        args = fx.node.map_arg(step.node.args, lambda n: value if n is step.source else env[n])
        kwargs = fx.node.map_arg(step.node.kwargs, lambda n: value if n is step.source else env[n])
        assert step.module is not None
        result: torch.Tensor = step.module(*args, **kwargs)
        return result

    def multipliers(self, x: torch.Tensor, x0: torch.Tensor, seed: SeedFn) -> torch.Tensor:
        """Input multipliers m (attributions are (x - x0) * m) for inputs ``x`` and references ``x0``
        (float64). ``seed(out, out0)`` gives the multipliers of the outputs, both shaped (k, -1)."""
        env, env0 = self._evaluate(x), self._evaluate(x0)
        assert self.output is not None
        out = env[self.output]
        start = seed(out.reshape(len(x), -1), env0[self.output].reshape(len(x), -1))
        delta: dict[fx.Node, torch.Tensor] = {}
        split: dict[fx.Node, Split] = {}
        for step in self.steps:
            if step.kind == "static":
                continue
            node = step.node
            delta[node] = env[node] - env0[node]
            if step.kind == "affine":
                assert step.maps is not None and step.source is not None
                split[node] = affine_split(step.maps, delta[step.source])
            elif step.kind == "shape":
                dp, dn = split[step.source]  # type: ignore[index]
                split[node] = (self._shape_apply(step, env, dp), self._shape_apply(step, env, dn))
            else:
                split[node] = sign_split(delta[node])

        pairs: dict[fx.Node, Pair] = {self.output: Pair.plain(start.reshape(out.shape))}
        m = torch.zeros_like(x)

        def give(node: fx.Node, pair: Pair) -> None:
            pairs[node] = pairs[node] + pair if node in pairs else pair

        for step in reversed(self.steps):
            node = step.node
            if step.kind == "static" or node not in pairs:
                continue
            pair = pairs.pop(node)
            src = step.source
            if step.kind == "input":
                m = collapse(pair, delta[node])
            elif step.kind == "affine":
                assert step.maps is not None and src is not None
                give(src, Pair.plain(affine_backward(step.maps, delta[src], pair)))
            elif step.kind == "relu":
                assert src is not None
                m_pos, m_neg = reveal_cancel(torch.relu, env0[src], env[src], split[src])
                d = collapse(pair, delta[node])
                give(src, Pair(d * m_pos, d * m_neg))
            elif step.kind == "shape":
                assert src is not None
                shape = env[src].shape
                give(src, pair.map(partial(torch.reshape, shape=shape)))
            else:  # maxpool: the gradient at x
                assert src is not None and step.module is not None
                u = env[src].detach().requires_grad_(True)
                with torch.enable_grad():
                    (grad,) = torch.autograd.grad(step.module(u), u, collapse(pair, delta[node]))
                give(src, Pair.plain(grad))
        return m


def _operator_name(node: fx.Node, module: nn.Module | None) -> str:
    if module is None:
        return str(getattr(node.target, "__name__", node.target))
    op = getattr(module, "math_op_function", None)  # onnx2torch's Add/Sub/Mul/Div share one class
    return f"{type(module).__name__}[{op.__name__}]" if op is not None else type(module).__name__


def _fetch(graph: fx.GraphModule, node: fx.Node) -> Any:
    value: Any = graph
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value
