"""An explicit interpreter of an onnx2torch fx graph for DeepLIFT RevealCancel.

The forward pass evaluates every node at the input and at the reference (float64), and the split
of each difference into positive and negative parts; the backward pass walks the nodes in reverse
and applies one rule per node kind (see :mod:`workers.methods._revealcancel_rules`). Node kinds
come from :func:`workers.methods._fx_plan.plan_graph`:

- affine (Linear, Conv) and avgpool (W >= 0): the split rule and its backward;
- relu: the RevealCancel multipliers, from the split of its input (an affine output, possibly
  through flatten/reshape; otherwise the elementwise sign split, where RevealCancel is Rescale);
- shape: pass splits and multipliers through;
- maxpool: the plain gradient at the input. This is *not* summation-to-delta: with a non-zero
  reference a max-pooling network's attributions need not add up to f(x) - f(x0), and the audit
  is meant to show it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import fx, nn

from workers.methods._fx_plan import Plan, Step, evaluate, plan_graph
from workers.methods._revealcancel_rules import (
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


class RevealCancelGraph:
    """A validated plan over ``graph``; :meth:`multipliers` runs it on one chunk of rows."""

    def __init__(self, graph: nn.Module, method: str) -> None:
        self.plan: Plan = plan_graph(graph, method, "RevealCancel")
        self.maps: dict[fx.Node, AffineMaps] = {}
        for step in self.plan.steps:
            if step.kind in ("affine", "avgpool"):
                assert step.module is not None
                self.maps[step.node] = affine_maps(step.module)
        self._full = {node: maps.full for node, maps in self.maps.items()}

    def _evaluate(self, x: torch.Tensor) -> dict[fx.Node, Any]:
        return evaluate(self.plan, x, self._full)

    def _evaluate_reference(self, x0: torch.Tensor) -> dict[fx.Node, Any]:
        """The forward pass at the references, once per distinct reference row (the audit's
        sub-inputs of one sample share one), expanded back to every row."""
        distinct, rows = torch.unique(x0.reshape(len(x0), -1), dim=0, return_inverse=True)
        if len(distinct) == len(x0):
            return self._evaluate(x0)
        env = self._evaluate(distinct.reshape(len(distinct), *x0.shape[1:]))
        for step in self.plan.steps:
            if step.kind != "static" and isinstance(env.get(step.node), torch.Tensor):
                env[step.node] = env[step.node][rows]
        return env

    def elements_per_row(self, sample_shape: tuple[int, ...], device: torch.device) -> int:
        """Float elements one row's forward pass holds (all node values at one point)."""
        env = self._evaluate(torch.zeros((1, *sample_shape), dtype=torch.float64, device=device))
        return sum(v.numel() for v in env.values() if isinstance(v, torch.Tensor) and v.is_floating_point())

    def _shape_apply(self, step: Step, env: dict[fx.Node, Any], value: torch.Tensor) -> torch.Tensor:
        """Run a shape node on ``value`` in place of its activation argument."""
        args = fx.node.map_arg(step.node.args, lambda n: value if n is step.source else env[n])
        kwargs = fx.node.map_arg(step.node.kwargs, lambda n: value if n is step.source else env[n])
        assert step.module is not None
        result: torch.Tensor = step.module(*args, **kwargs)
        return result

    def multipliers(self, x: torch.Tensor, x0: torch.Tensor, seed: SeedFn) -> torch.Tensor:
        """Input multipliers m (attributions are (x - x0) * m) for inputs ``x`` and references ``x0``
        (float64). ``seed(out, out0)`` gives the multipliers of the outputs, both shaped (k, -1)."""
        env, env0 = self._evaluate(x), self._evaluate_reference(x0)
        output = self.plan.output
        out = env[output]
        start = seed(out.reshape(len(x), -1), env0[output].reshape(len(x), -1))
        delta: dict[fx.Node, torch.Tensor] = {}
        split: dict[fx.Node, Split] = {}
        for step in self.plan.steps:
            if step.kind == "static":
                continue
            node = step.node
            delta[node] = env[node] - env0[node]
            if node in self.maps:
                assert step.source is not None
                split[node] = affine_split(self.maps[node], delta[step.source])
            elif step.kind == "shape":
                dp, dn = split[step.source]  # type: ignore[index]
                split[node] = (self._shape_apply(step, env, dp), self._shape_apply(step, env, dn))
            else:
                split[node] = sign_split(delta[node])

        pairs: dict[fx.Node, Pair] = {output: Pair.plain(start.reshape(out.shape))}
        m = torch.zeros_like(x)

        def give(node: fx.Node, pair: Pair) -> None:
            pairs[node] = pairs[node] + pair if node in pairs else pair

        for step in reversed(self.plan.steps):
            node = step.node
            if step.kind == "static" or node not in pairs:
                continue
            pair = pairs.pop(node)
            src = step.source
            if step.kind == "input":
                m = collapse(pair, delta[node])
            elif node in self.maps:
                assert src is not None
                give(src, Pair.plain(affine_backward(self.maps[node], delta[src], pair)))
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
