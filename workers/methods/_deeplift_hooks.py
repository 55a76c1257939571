"""Captum's DeepLift, hook for hook, with each distinct reference evaluated once instead of beside
every row.

Captum runs the rows and their references as one doubled batch, so that each nonlinearity it hooks
sees its input and its reference input in one call. Here one pass over the distinct reference rows
records every hooked module's input and output; the rows then run alone, through the hooks Captum
registers (``captum._utils.common._register_backward_hook``: a hook on the module's input tensor
replaces that tensor's whole gradient) and with Captum's rule for ReLU, ELU, LeakyReLU, Sigmoid,
Tanh, Softplus and Softmax, ``where(|dx| < eps, grad_input, grad_output * dy / dx)`` (Softmax's as
:class:`~workers.methods._captum_deeplift.RowwiseDeepLift` takes it), against the recorded values.
Everything else passes its gradient at the rows, as in Captum's doubled batch (rows do not meet in
an eval-mode graph). The same attributions as RowwiseDeepLift (tests/unit/methods/test_deeplift_hooks.py),
with a whole pass of rows where Captum fits half a pass beside their references, and one reference
row where the audit's sub-inputs of a sample share it. Captum's
max-pool rule needs both halves in one call: graphs with a MaxPool module stay on Captum, and so do
graphs that call a hooked module twice (Captum refuses them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workers.methods._base import at_references, distinct_references
from workers.methods._rescale_graph import EPS  # Captum's DeepLift eps, as xaudit's own pass takes it

__all__ = ["RULED", "ModuleCalledTwice", "ReferenceOnceDeepLift"]
# The modules Captum's DeepLift gives its nonlinear rule (captum.attr._core.deep_lift.SUPPORTED_NON_LINEAR;
# Softmax with RowwiseDeepLift's row-by-row rule, which is the same formula), by exact type as Captum
# keys them; its max-pool rule reads both halves of its doubled batch at once.
RULED = (nn.ReLU, nn.ELU, nn.LeakyReLU, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softmax)
_BOTH_HALVES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)


class ModuleCalledTwice(Exception):
    """A hooked module ran twice in one forward pass: Captum refuses such graphs, and says so."""


class ReferenceOnceDeepLift:
    """DeepLift attributions of ``model`` (a graph wrapped to give per-class target scores) for the
    hooked modules of ``graph`` (the graph inside it); :meth:`for_graph` gives None where Captum
    must run itself."""

    def __init__(self, model: nn.Module, hooked: list[nn.Module]) -> None:
        self.model = model
        self.hooked = hooked

    @staticmethod
    def covers(graph: nn.Module) -> bool:
        """Whether this pass can stand in for Captum on ``graph`` (no max-pool module)."""
        return not any(type(m) in _BOTH_HALVES for m in graph.modules())

    @classmethod
    def for_graph(cls, model: nn.Module, graph: nn.Module) -> ReferenceOnceDeepLift | None:
        if not cls.covers(graph):
            return None
        return cls(model, [m for m in graph.modules() if type(m) in RULED and not m._backward_hooks])

    def attributions(self, x: torch.Tensor, x0: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """(x - x0) times the multipliers of the target scores of ``classes`` (Captum's
        ``multiply_by_inputs=True``). Raises :class:`ModuleCalledTwice` before any backward pass."""
        refs, runs = distinct_references(x0)
        at_reference = self._reference_values(refs)

        def reference(module: nn.Module, which: int, like: torch.Tensor) -> torch.Tensor:
            return at_references(at_reference[module][which], like.shape, len(refs), runs, len(x))

        def rule(
            module: nn.Module,
            grad_input: torch.Tensor,
            grad_output: torch.Tensor,
            z: torch.Tensor,
            y: torch.Tensor,
        ) -> torch.Tensor:
            delta_in = z - reference(module, 0, z)
            delta_out = y - reference(module, 1, y)
            return torch.where(delta_in.abs() < EPS, grad_input, grad_output * delta_out / delta_in)

        x = x.detach().requires_grad_(True)
        handles = [h for m in self.hooked for h in _hooks(m, rule)]
        try:
            out = self.model(x)
            (grad,) = torch.autograd.grad(out.gather(1, classes[:, None]).sum(), x)
        finally:
            for handle in handles:
                handle.remove()
        return (x.detach() - x0) * grad

    def _reference_values(self, refs: torch.Tensor) -> dict[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
        """Each hooked module's input and output at the distinct references."""
        values: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}

        def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if module in values:
                raise ModuleCalledTwice
            values[module] = (inputs[0].detach(), output.detach())

        handles = [m.register_forward_hook(record) for m in self.hooked]
        try:
            with torch.no_grad():
                self.model(refs)
        finally:
            for handle in handles:
                handle.remove()
        return values


Rule = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _hooks(module: nn.Module, rule: Rule) -> list[Any]:
    """Captum's hooks on ``module``: its input's gradient (the whole of it, from every consumer of
    that tensor, as Captum's tensor hook sees it) replaced by ``rule``, given the module's output
    gradient and its input and output values."""
    state: dict[str, torch.Tensor] = {}

    def before(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor] | None:
        (z,) = inputs
        if not z.requires_grad:  # a constant's: no gradient to replace
            return None
        state["z"] = z.detach()

        def on_input_gradient(grad: torch.Tensor) -> torch.Tensor | None:
            if "grad_output" not in state:
                return None
            return rule(module, grad, state["grad_output"], state["z"], state["y"])

        z.register_hook(on_input_gradient)  # type: ignore[no-untyped-call]
        return (z.clone(),)  # the module works on a copy: the hook sees the tensor's whole gradient

    def after(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if not output.requires_grad:
            return
        state["y"] = output.detach()

        def on_output_gradient(grad: torch.Tensor) -> None:
            state["grad_output"] = grad

        output.register_hook(on_output_gradient)  # type: ignore[no-untyped-call]

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
