"""torch's nn.LSTM as its exporters write it, one ``LSTM`` node, written out step by step for the
methods' graph (workers/models/recurrent_unroll.py): the same values as onnxruntime's operator, and the
LRP methods (before: refused by name) give the numbers of the same LSTM written out by hand in torch,
its gates held constant (Arras et al. 2017), Deep Taylor with z-beta at every step's input layer."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from tests.unit.methods._context import context
from workers.inspect_model import inspect_model
from workers.methods import get_method
from workers.models.recurrent_unroll import MAX_STEPS, unroll_recurrent

_STEPS, _FEATURES, _HIDDEN = 6, 4, 5
X = torch.randn(3, _STEPS, _FEATURES, generator=torch.Generator().manual_seed(1))


class _Lstm(nn.Module):
    """nn.LSTM over (batch, time, features), its last step's output to a Linear head; ``state``: a
    learnt initial state (not zeros)."""

    def __init__(self, bidirectional: bool = False, layers: int = 1, state: bool = False) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.lstm = nn.LSTM(_FEATURES, _HIDDEN, layers, batch_first=True, bidirectional=bidirectional)
        width = _HIDDEN * (2 if bidirectional else 1)
        self.head = nn.Linear(width, 3)
        shape = (layers * (2 if bidirectional else 1), 1, _HIDDEN)
        self.state = nn.ParameterList([torch.randn(shape), torch.randn(shape)] if state else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not len(self.state):
            out, _ = self.lstm(x)
        else:
            h0, c0 = (s.expand(-1, x.shape[0], -1).contiguous() for s in self.state)
            out, _ = self.lstm(x, (h0, c0))
        return self.head(out[:, -1])


class _WrittenOutLstm(nn.Module):
    """The same one-layer LSTM written out in torch (its gate order i, f, g, o)."""

    def __init__(self, lstm: _Lstm) -> None:
        super().__init__()
        rnn = lstm.lstm
        self.x = nn.Linear(_FEATURES, 4 * _HIDDEN)
        self.h = nn.Linear(_HIDDEN, 4 * _HIDDEN, bias=False)
        self.head = lstm.head
        with torch.no_grad():
            self.x.weight.copy_(rnn.weight_ih_l0)
            self.x.bias.copy_(rnn.bias_ih_l0 + rnn.bias_hh_l0)
            self.h.weight.copy_(rnn.weight_hh_l0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = _HIDDEN
        h = c = None
        for t in range(x.shape[1]):
            z = self.x(x[:, t]) if h is None else self.x(x[:, t]) + self.h(h)
            i, f, g, o = (z[:, k * size : (k + 1) * size] for k in range(4))
            update = torch.sigmoid(i) * torch.tanh(g)
            c = update if c is None else torch.sigmoid(f) * c + update
            h = torch.sigmoid(o) * torch.tanh(c)
        assert h is not None
        return self.head(h)


def _export(model: nn.Module, dynamo: bool) -> bytes:
    return to_onnx(model, X[:1], opset=18, dynamo=True) if dynamo else to_onnx(model, X[:1])


def test_a_long_sequence_stays_one_operator() -> None:
    """Written out, a sequence longer than MAX_STEPS would make a graph of thousands of nodes."""
    long = torch.randn(1, MAX_STEPS + 1, _FEATURES)
    model = onnx.load_from_string(to_onnx(_Lstm().eval(), long))
    assert unroll_recurrent(model) == 0
    assert "LSTM" in {node.op_type for node in model.graph.node}


class _Gru(nn.Module):
    def __init__(self, bidirectional: bool = False, layers: int = 1) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.gru = nn.GRU(_FEATURES, _HIDDEN, layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(_HIDDEN * (2 if bidirectional else 1), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class _WrittenOutGru(nn.Module):
    """The same one-layer GRU written out in torch (its gate order r, z, n), 1 - z as sigmoid(-z)."""

    def __init__(self, gru: _Gru, complement: bool = False) -> None:
        super().__init__()
        rnn, size = gru.gru, _HIDDEN
        self.complement = complement  # 1 - sigmoid(u), as Keras writes it, instead of sigmoid(-u)
        self.x = nn.Linear(_FEATURES, 3 * size)
        self.h = nn.Linear(size, 3 * size)
        self.head = gru.head
        with torch.no_grad():
            self.x.weight.copy_(rnn.weight_ih_l0)
            self.x.bias.copy_(rnn.bias_ih_l0)
            self.x.bias[: 2 * size] += rnn.bias_hh_l0[: 2 * size]
            self.h.weight.copy_(rnn.weight_hh_l0)
            self.h.bias.zero_()
            self.h.bias[2 * size :] = rnn.bias_hh_l0[2 * size :]
        self.state_bias = rnn.bias_hh_l0[2 * size :].detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = _HIDDEN
        h = None
        for t in range(x.shape[1]):
            z = self.x(x[:, t])
            if h is None:
                gates, recurrent = z[:, : 2 * size], self.state_bias
            else:
                state = self.h(h)
                gates, recurrent = z[:, : 2 * size] + state[:, : 2 * size], state[:, 2 * size :]
            reset, update = torch.sigmoid(gates[:, :size]), gates[:, size:]
            new = torch.tanh(z[:, 2 * size :] + reset * recurrent)
            kept = (1.0 - torch.sigmoid(update) if self.complement else torch.sigmoid(-update)) * new
            h = kept if h is None else kept + torch.sigmoid(update) * h
        assert h is not None
        return self.head(h)


_KINDS = {"LSTM": (_Lstm, _WrittenOutLstm), "GRU": (_Gru, _WrittenOutGru)}


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("LSTM", {}),
        ("LSTM", {"bidirectional": True}),
        ("LSTM", {"layers": 2}),
        ("LSTM", {"state": True}),
        ("GRU", {}),
        ("GRU", {"bidirectional": True}),
        ("GRU", {"layers": 2}),
    ],
)
def test_the_written_out_layer_has_the_operators_values(kind: str, options: dict, dynamo: bool) -> None:
    data = _export(_KINDS[kind][0](**options).eval(), dynamo)
    model = onnx.load_from_string(data)
    layers = sum(node.op_type == kind for node in model.graph.node)
    assert layers >= 1 and unroll_recurrent(model) == layers
    assert kind not in {node.op_type for node in model.graph.node}
    x = np.random.default_rng(3).normal(size=(4, _STEPS, _FEATURES)).astype(np.float32)
    name = model.graph.input[0].name
    run = lambda blob: ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {name: x})[0]  # noqa: E731
    np.testing.assert_allclose(run(model.SerializeToString()), run(data), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_the_lrp_methods_give_the_written_out_layers_numbers(name: str, kind: str, dynamo: bool) -> None:
    layer, written_out = _KINDS[kind]
    model = layer().eval()
    twin = written_out(model).eval()
    said = inspect_model(_export(model, dynamo)).methods[name]
    assert said.startswith("runs: torch graph; xaudit's LRP pass") and "sigmoid gates" in said, said
    classes = np.array([0, 2, 1])
    refs = np.zeros_like(X.numpy())
    params = {"low": -3.0, "high": 3.0} if name == "deep_taylor" else {}
    got = get_method(name).attribute(
        context(model, X, params=params, dynamo=dynamo), X.numpy(), refs, classes
    )
    want = get_method(name).attribute(context(twin, X, params=params), X.numpy(), refs, classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    assert np.abs(want).max() > 1e-3


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_one_minus_a_gate_is_a_gate(name: str) -> None:
    """Keras writes its GRU's h = z h + (1 - z) n with a Sub(1, sigmoid): the sigmoid's uses were a
    product and that Sub, so it was no gate and LRP refused the GRU. 1 - z is a gate too: the same
    relevance as with sigmoid(-u)."""
    gru = _Gru().eval()
    classes, refs = np.array([2, 1, 0]), np.zeros_like(X.numpy())
    params = {"low": -3.0, "high": 3.0} if name == "deep_taylor" else {}
    written = _WrittenOutGru(gru, complement=True).eval()
    said = get_method(name).implementation(context(written, X, params=params).model)
    assert said is not None and said.endswith("sigmoid gates"), said
    got = get_method(name).attribute(context(written, X, params=params), X.numpy(), refs, classes)
    twin = _WrittenOutGru(gru).eval()
    want = get_method(name).attribute(context(twin, X, params=params), X.numpy(), refs, classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
