"""LRP on a vision transformer: layer norms, attention heads and GELU (docs/science.md 5.8).

The rules are those of Ali et al. 2022: a layer norm's scale 1 / std, an attention head's softmax
weights and GELU's erf factor are held constant, so relevance passes through the centring, the
product of the weights with the values, and the activation, while the query-key branch gets none;
Linear and Conv layers keep their method's rule. The exporters write the Linear layers on the
token axis as MatMul + Add, the class token as a Concat with a constant and the position
embeddings as an Add of one.

The reference is Zennit's own hooks on a twin of the model in which each of those operations is a
module Zennit can hook: the held norm, the attention product (weights set before the call) and the
residual sums (stacked, as Zennit's ResNet canonizer writes them) get Zennit's Norm (LRP-0), GELU
with its factor detached gets Pass; relevance travels between them as Zennit's hooks pass it. On a
bias-free twin relevance adds up to the explained score, which keeping any of the three
nonlinearities' gradients breaks."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from zennit.core import Hook
from zennit.rules import Norm, Pass

from tests.models import to_onnx
from tests.unit.methods._zennit_reference import assert_equals_zennit, lrp_cases, zennit_relevance
from workers.methods import AttributionContext, get_method
from workers.methods import _modified_backward as modified_backward
from workers.methods._fx_plan import held_constant
from workers.methods._lrp_rules import LayerRule
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

SHAPE = (3, 8, 8)
X = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(7))


class _Held(nn.Module):
    """One input, a function set before each call: an operation of the reference twin that a Zennit
    rule can hook."""

    def __init__(self) -> None:
        super().__init__()
        self.fn = lambda x: x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class _RMSNorm(nn.Module):
    """RMS normalisation as transformers' Llama writes it (torch.rsqrt; the legacy exporter writes
    it Div(1, Sqrt), the dynamo exporter Reciprocal(Sqrt))."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.5 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _norm_layer(dim: int, bias: bool, rms: bool) -> nn.Module:
    return _RMSNorm(dim) if rms else nn.LayerNorm(dim, bias=bias)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """T5's and GPT-2's GELU (the tanh approximation), as transformers' NewGELUActivation writes it:
    the legacy exporter writes 0.5 * x times the factor, the scaled x a separate product."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _Block(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int,
        bias: bool,
        flat_heads: bool = False,
        rms: bool = False,
        glu: str = "",
        talking_heads: str = "",
    ) -> None:
        super().__init__()
        self.heads, self.flat_heads = heads, flat_heads
        # Talking heads: the logits and the softmax weights mixed across heads by a Linear each between
        # two permutes (CaiT, "linear"), or by a 1x1 convolution each (EfficientFormerV2, "conv")
        self.talking_heads = talking_heads
        mixers = {"linear": lambda: nn.Linear(heads, heads), "conv": lambda: nn.Conv2d(heads, heads, 1)}
        make = mixers.get(talking_heads)
        self.talk = nn.ModuleList([make(), make()]) if make else None
        self.ln1, self.ln2 = _norm_layer(dim, bias, rms), _norm_layer(dim, bias, rms)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=bias), nn.Linear(dim, dim, bias=bias)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim, bias=bias), nn.Linear(2 * dim, dim, bias=bias)
        # a gated linear unit (Llama's SwiGLU, "silu"; GeGLU, "gelu"): fc1(x) * act(gate(x))
        self.glu = {"silu": nn.functional.silu, "gelu": nn.functional.gelu, "gelu_tanh": _gelu_tanh}.get(glu)
        self.gate = nn.Linear(dim, 2 * dim, bias=bias) if glu else None
        self.gelu = nn.GELU()
        self.held = nn.ModuleDict({k: _Held() for k in ("ln1", "ln2", "attend", "sum1", "sum2", "gelu")})

    def forward(self, x: torch.Tensor, twin: bool) -> torch.Tensor:
        rows, tokens, dim = x.shape
        h = self._norm(self.ln1, x, "ln1", twin)
        qkv = self.qkv(h).reshape(rows, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        logits = q @ k.transpose(-2, -1) / math.sqrt(dim // self.heads)
        logits = self._talk(0, logits)
        weights = self._talk(1, torch.softmax(logits, -1))
        if self.flat_heads:  # DeBERTa's layout: rows and heads as one batch axis, weights reshaped by
            # their own size (the legacy exporter reads it with a Shape of the softmax)
            weights = weights.reshape(-1, weights.size(-2), weights.size(-1))
            v = v.reshape(rows * self.heads, tokens, dim // self.heads)
        if twin:
            held = weights.detach()
            self.held["attend"].fn = lambda values: held @ values
            attended = self.held["attend"](v)
        else:
            attended = weights @ v
        if self.flat_heads:
            attended = attended.reshape(rows, self.heads, tokens, dim // self.heads)
        x = self._sum(x, self.proj(attended.transpose(1, 2).reshape(rows, tokens, dim)), "sum1", twin)
        normed = self._norm(self.ln2, x, "ln2", twin)
        h = self.fc1(normed)
        if self.glu is not None and self.gate is not None:
            activated = self.glu(self.gate(normed))
            if twin:  # the gate held: the product hands fc1's output all of its relevance
                held_gate = activated.detach()
                self.held["gelu"].fn = lambda z: z * held_gate
                h = self.held["gelu"](h)
            else:
                h = h * activated
        elif twin:
            gate = (0.5 * (1 + torch.erf(h / math.sqrt(2)))).detach()
            self.held["gelu"].fn = lambda z: z * gate
            h = self.held["gelu"](h)
        else:
            h = self.gelu(h)
        return self._sum(x, self.fc2(h), "sum2", twin)

    def _talk(self, i: int, scores: torch.Tensor) -> torch.Tensor:
        if self.talk is None:
            return scores
        if self.talking_heads == "conv":
            return self.talk[i](scores)
        return self.talk[i](scores.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def _norm(self, norm: nn.LayerNorm, x: torch.Tensor, name: str, twin: bool) -> torch.Tensor:
        if not twin:
            return norm(x)
        self.held[name].fn = lambda z: _held_layer_norm(norm, z)
        return self.held[name](x)

    def _sum(self, a: torch.Tensor, b: torch.Tensor, name: str, twin: bool) -> torch.Tensor:
        if not twin:
            return a + b
        self.held[name].fn = lambda stacked: stacked.sum(-1)
        return self.held[name](torch.stack([a, b], -1))


def _held_layer_norm(norm: nn.Module, z: torch.Tensor) -> torch.Tensor:
    if isinstance(norm, _RMSNorm):  # no centring: held, a diagonal layer
        return z / torch.sqrt(z.detach().pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight
    centred = z - z.mean(-1, keepdim=True)
    std = torch.sqrt(centred.detach().pow(2).mean(-1, keepdim=True) + norm.eps)
    out = centred / std * norm.weight
    return out if norm.bias is None else out + norm.bias


class _TinyViT(nn.Module):
    """A vision transformer (torchvision's layout: pre-norm blocks, class token or mean pooling), 4
    patches of 4x4; ``twin``: the reference's forward."""

    def __init__(
        self,
        bias: bool = True,
        class_token: bool = True,
        depth: int = 2,
        dim: int = 16,
        flat_heads: bool = False,
        rms: bool = False,
        glu: str = "",
        talking_heads: str = "",
    ) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.twin = False
        self.patch = nn.Conv2d(3, dim, 4, 4, bias=bias)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.5) if class_token else None
        self.pos = nn.Parameter(torch.randn(1, 4 + class_token, dim) * 0.5) if bias else None
        self.blocks = nn.ModuleList(
            [_Block(dim, 2, bias, flat_heads, rms, glu, talking_heads) for _ in range(depth)]
        )
        self.ln, self.head = _norm_layer(dim, bias, rms), nn.Linear(dim, 3, bias=bias)
        self.held = nn.ModuleDict({k: _Held() for k in ("pos", "ln", "pool")})

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.patch(image).flatten(2).transpose(1, 2)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        if self.pos is not None and self.twin:
            self.held["pos"].fn = lambda z, pos=self.pos: z + pos
            x = self.held["pos"](x)
        elif self.pos is not None:
            x = x + self.pos
        for block in self.blocks:
            x = block(x, self.twin)
        if self.twin:
            self.held["ln"].fn = lambda z: _held_layer_norm(self.ln, z)
            x = self.held["ln"](x)
        else:
            x = self.ln(x)
        if self.cls is not None:
            return self.head(x[:, 0])
        if self.twin:
            self.held["pool"].fn = lambda z: z.mean(1)
            return self.head(self.held["pool"](x))
        return self.head(x.mean(1))


def _context(model: nn.Module, params: dict, dynamo: bool = False) -> AttributionContext:
    # from a two-row example the dynamo exporter keeps a transformer's batch axis symbolic
    data = to_onnx(model, X[:2], opset=18 if dynamo else 17, dynamo=dynamo)
    loaded = load_model(data, "onnx", "cpu")
    loaded.check_sample(X.numpy())
    return AttributionContext(loaded, parse_players("grid:2x2", SHAPE), Target(), params)


def _zennit(model: _TinyViT, rules: list[LayerRule], x: torch.Tensor, classes: np.ndarray) -> np.ndarray:
    """Zennit's relevance on the twin: our rules' hooks on the Conv/Linear layers in execution order
    (the query and key outputs of each qkv layer get no relevance: no gradient reaches them), Norm on
    the held operations, Pass on GELU. The pass under test takes the held operations' exact gradient
    (LRP-0 without a stabiliser), so Norm's stabiliser is made negligible here: at Zennit's 1e-6 a
    few near-zero sums shift up to 1% of a pixel's relevance."""
    twin = copy.deepcopy(model)
    twin.twin = True
    layers = [twin.patch]
    for block in twin.blocks:
        layers += [block.qkv, block.proj, block.fc1, block.fc2]
    layers.append(twin.head)
    hooks = {id(layer): rule for layer, rule in zip(layers, rules, strict=True)}
    gelus = {id(block.held["gelu"]) for block in twin.blocks}

    def mapping(ctx: dict, name: str, module: nn.Module) -> Hook | None:
        if id(module) in hooks:
            return hooks[id(module)].zennit()
        if isinstance(module, _Held):
            return Pass() if id(module) in gelus else Norm(stabilizer=1e-12)
        return None

    return zennit_relevance(twin, mapping, x, classes)


LAYERS = 10  # the patch layer, four per block, the head
CASES = lrp_cases(LAYERS)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_transformer_equals_zennit_with_held_norms_and_attention(name: str, dynamo: bool) -> None:
    model = _TinyViT().eval()
    ctx = _context(model, CASES[name][0], dynamo)
    assert_equals_zennit(name, ctx, X, lambda rules, classes: _zennit(model, rules, X, classes), LAYERS, 1e-4)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rms_norms_are_held_as_layer_norms_are(name: str, dynamo: bool) -> None:
    """Llama's, Mistral's and T5's RMS normalisation, which both exporters write out as Pow,
    ReduceMean, Add, Sqrt and a reciprocal (workers/models/norm_fusion.py): its scale held, as a
    layer norm's (before, every LRP method refused the Pow)."""
    model = _TinyViT(rms=True).eval()
    ctx = _context(model, CASES[name][0], dynamo)
    assert_equals_zennit(name, ctx, X, lambda rules, classes: _zennit(model, rules, X, classes), LAYERS, 1e-4)
    assert "RMS norms' scales" in held_constant(ctx.model.torch_hookable(name), name)


@pytest.mark.parametrize("glu", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gated_linear_units_hold_their_gate(name: str, dynamo: bool, glu: str) -> None:
    """Llama's, Mistral's and Qwen's MLP is ``down(up(x) * silu(gate(x)))`` (SwiGLU; GeGLU with GELU,
    T5 v1.1's with its tanh-approximated GELU):
    the activated gate is held like the other gates, so the product hands ``up``'s output all of its
    relevance and the gate's branch none (before, every LRP method refused the product)."""
    model = _TinyViT(rms=True, glu=glu).eval()
    ctx = _context(model, CASES[name][0], dynamo)
    assert_equals_zennit(name, ctx, X, lambda rules, classes: _zennit(model, rules, X, classes), LAYERS, 1e-4)
    assert "GLU gates" in held_constant(ctx.model.torch_hookable(name), name)


class _SwiGlu(nn.Module):
    """An MLP's SwiGLU, ``down(up * silu(gate))``: with one Linear for both halves, split in two
    (timm's EVA-02 and GluMlp, ``fc1(x).chunk(2, -1)``), or, its twin, a Linear for each."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.fused = fused
        both, self.down = nn.Linear(12, 16), nn.Linear(8, 3)
        if fused:
            self.both = both
        else:
            self.up, self.gate = nn.Linear(12, 8), nn.Linear(12, 8)
            with torch.no_grad():
                for part, rows in ((self.up, slice(0, 8)), (self.gate, slice(8, 16))):
                    part.weight.copy_(both.weight[rows])
                    part.bias.copy_(both.bias[rows])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        up, gate = self.both(x).chunk(2, -1) if self.fused else (self.up(x), self.gate(x))
        return self.down(up * nn.functional.silu(gate))


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_gated_unit_split_from_one_linear_holds_its_gate_too(name: str, dynamo: bool) -> None:
    """The exporters write the SiLU of a split's first half as ``x * sigmoid(x)``, and the torch
    conversion read the half once for each of its two uses: two nodes, so the product's ``x`` and the
    sigmoid's were not the same value, no gated unit was found, and LRP refused EVA-02's MLP."""
    x = X.reshape(len(X), -1)[:, :12]
    fused, twin = (_SwiGlu(fused).eval() for fused in (True, False))
    contexts = [
        AttributionContext(
            load_model(to_onnx(m, x[:2], opset=18 if dynamo else 17, dynamo=dynamo), "onnx", "cpu"),
            parse_players("features", (12,)), Target(), CASES[name][0],
        )
        for m in (fused, twin)
    ]  # fmt: skip
    classes = np.array([0, 1, 2, 0])
    got, want = (
        get_method(name).attribute(c, x.numpy(), np.zeros_like(x.numpy()), classes) for c in contexts
    )
    assert np.abs(want).max() > 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert "GLU gates" in held_constant(contexts[0].model.torch_hookable(name), name)


@pytest.mark.parametrize("mixer", ["linear", "conv"])
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_talking_heads_mix_held_attention_weights(name: str, dynamo: bool, mixer: str) -> None:
    """CaiT mixes its attention logits and its softmax weights across heads (a Linear each, between
    two permutes), EfficientFormerV2 with a 1x1 convolution each: the mixed weights are a function
    of the query-key branch alone, held as the weights are, so relevance passes by their product
    with the values only (before, every LRP method refused the query-key product). Mixed weights
    can be negative: the product is signed."""
    model = _TinyViT(talking_heads=mixer).eval()
    ctx = _context(model, CASES[name][0], dynamo)
    assert_equals_zennit(name, ctx, X, lambda rules, classes: _zennit(model, rules, X, classes), LAYERS, 1e-4)
    # the report names the mixed weights as attention weights (not as a GLU's signed gate)
    held = held_constant(ctx.model.torch_hookable(name), name)
    assert held.endswith(": layer norms' scales, attention weights, GELU's factor"), held


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_attention_weights_reshaped_before_the_values_are_held_too(name: str) -> None:
    """DeBERTa (transformers' DebertaV2) multiplies its softmax weights with the values over one axis
    of rows and heads: a Reshape between the softmax and the product, which used to hide the
    weights from the gate rule (LRP refused the MatMul of the query-key branch)."""
    model = _TinyViT(flat_heads=True).eval()
    ctx = _context(model, CASES[name][0])
    assert_equals_zennit(name, ctx, X, lambda rules, classes: _zennit(model, rules, X, classes), LAYERS, 1e-4)


def _explained(ctx: AttributionContext, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = ctx.model.predict(x)
    classes = scores.argmax(1)
    return classes, scores[np.arange(len(x)), classes]


@pytest.mark.parametrize("name", sorted(CASES))
def test_relevance_adds_up_to_the_score_without_biases(name: str) -> None:
    ctx = _context(_TinyViT(bias=False, class_token=False).eval(), CASES[name][0])
    x = X.numpy()
    classes, explained = _explained(ctx, x)
    relevance = get_method(name).attribute(ctx, x, np.zeros_like(x), classes)
    # LRP-epsilon's stabiliser absorbs a little at near-zero sums (2e-4 of a score here)
    rtol = 1e-4 if name == "lrp_alpha_beta" else 1e-3
    np.testing.assert_allclose(relevance.reshape(len(x), -1).sum(1), explained, rtol=rtol)


def test_keeping_the_softmax_or_norm_gradient_breaks_conservation(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _context(_TinyViT(bias=False, class_token=False).eval(), {})
    x = X.numpy()
    classes, explained = _explained(ctx, x)
    evaluate = modified_backward.evaluate
    # the gradient product rule at the attention and GELU products (their factors not held)
    monkeypatch.setattr(
        modified_backward, "evaluate", lambda plan, x, replace, held: evaluate(plan, x, replace)
    )
    gates = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
    monkeypatch.undo()
    # the layer norms' own gradient (their scale not held)
    monkeypatch.setattr(modified_backward, "_held_norm", lambda norm, z: norm(z))
    norms = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
    for broken in (gates, norms):
        assert np.abs(broken.reshape(len(x), -1).sum(1) - explained).max() > 1e-2 * np.abs(explained).max()


def test_vit_class_token_and_position_embedding_absorb_relevance() -> None:
    """Relevance handed to the class token (a constant) and to the position embeddings stays there,
    as a bias's does: with them, less than the score reaches the input."""
    ctx = _context(_TinyViT().eval(), {})
    x = X.numpy()
    classes, explained = _explained(ctx, x)
    relevance = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
    assert np.isfinite(relevance).all() and np.abs(relevance).max() > 1e-3
    assert not np.allclose(relevance.reshape(len(x), -1).sum(1), explained, rtol=1e-2)


@pytest.mark.parametrize("dynamo", [False, True])
def test_the_report_says_what_the_pass_holds_constant(dynamo: bool) -> None:
    said = get_method("lrp_alpha_beta").implementation(_context(_TinyViT().eval(), {}, dynamo).model)
    assert said is not None and said.endswith("layer norms' scales, attention weights, GELU's factor"), said


class _ShiftedOutput(nn.Module):
    """A head whose logits are scaled or shifted by a constant after the last layer (``none``: not)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.body, self.fc, self.how = nn.Linear(192, 8), nn.Linear(8, 3), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.fc(torch.relu(self.body(x.flatten(1))))
        if self.how == "shift":
            return logits + torch.tensor([0.5, -1.0, 2.0])
        if self.how == "halved":
            return logits / 2.0
        return logits * {"factor": 2.0, "negative": -2.0}[self.how] if self.how != "none" else logits


@pytest.mark.parametrize(
    ("how", "words"), [("negative", "the constant factor"), ("shift", "the constant shift")]
)
def test_a_constant_after_the_last_layer_is_refused(how: str, words: str) -> None:
    """The last layer receives the output's relevance itself: a shift after it would not be
    absorbed, and a negative factor would turn the relevance it passes on against the layer's own
    output."""
    ctx = _context(_ShiftedOutput(how).eval(), {})
    x = X.numpy()
    with pytest.raises(NotApplicable, match=f"{words} '.*' comes after the last Linear/Conv layer"):
        get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), np.zeros(len(x), dtype=np.int64))


@pytest.mark.parametrize("how", ["factor", "halved"])
@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_a_positive_factor_after_the_last_layer_passes_the_relevance_on(how: str, name: str) -> None:
    """A distilled model's output is the mean of its two heads, (head(x) + head_dist(x)) / 2: the
    relevance of c z is that of z, scaled with it, so it passes unchanged to the layer below, which
    gives the numbers of the same model with c folded into that layer (LeViT's and DeiT's heads were
    refused before)."""
    model = _ShiftedOutput(how).eval()
    folded = _ShiftedOutput(how).eval()
    folded.how = "none"
    factor = 2.0 if how == "factor" else 0.5
    with torch.no_grad():
        folded.fc.weight.mul_(factor)
        folded.fc.bias.mul_(factor)
    x, classes = X.numpy(), np.array([0, 2, 1, 0][: len(X)])
    params = {"epsilon": 1e-9} if name == "lrp_epsilon" else {}
    got = get_method(name).attribute(_context(model, params), x, np.zeros_like(x), classes)
    want = get_method(name).attribute(_context(folded, params), x, np.zeros_like(x), classes)
    # alpha-beta's stabiliser (1e-6) does not scale with the layer: differences of 1e-4 of the largest
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert np.abs(want).max() > 1e-3


@pytest.mark.parametrize(
    ("activation", "words"),
    [(nn.SiLU(), "the activation"), (nn.Tanh(), "the activation"), (nn.ReLU6(), "the clipped activation")],
)
def test_an_activation_on_the_logits_is_refused(activation: nn.Module, words: str) -> None:
    """Such an activation's rule passes relevance on as a share of its value; the output's relevance
    is none, and the last layer would receive y^2 / z for y. ReLU on the logits still runs, and
    relevance there adds up to the score (bias-free, stabiliser negligible)."""
    x = X.numpy()
    classes = np.zeros(len(x), dtype=np.int64)
    for head in (activation, nn.ReLU()):
        torch.manual_seed(3)
        model = nn.Sequential(
            nn.Flatten(), nn.Linear(192, 8, bias=False), nn.ReLU(), nn.Linear(8, 3, bias=False)
        )
        model.append(head)
        ctx = _context(model.eval(), {"epsilon": 1e-9})
        if isinstance(head, nn.ReLU):
            relevance = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
            score = model(X)[:, 0].detach().numpy()
            np.testing.assert_allclose(relevance.reshape(len(x), -1).sum(1), score, rtol=1e-4, atol=1e-6)
            continue
        with pytest.raises(NotApplicable, match=f"{words} '.*' comes after the last Linear/Conv layer"):
            get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)


class _Attention(nn.Module):
    """One attention product over 4 tokens of 48 features: softmax weights, or log-softmax scores
    (negative, not weights) in the same place."""

    def __init__(self, log: bool) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.qk, self.v, self.head, self.log = nn.Linear(48, 48), nn.Linear(48, 48), nn.Linear(192, 3), log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, 4, 48)
        scores = self.qk(tokens) @ tokens.transpose(1, 2)
        weights = torch.log_softmax(scores, -1) if self.log else torch.softmax(scores, -1)
        return self.head(torch.relu(weights @ self.v(tokens)).flatten(1))


def test_a_log_softmax_is_not_taken_for_attention_weights() -> None:
    """Opset 11's Softmax and LogSoftmax convert to one module (onnx2torch's OnnxSoftmaxV1V11, with
    ``is_log``). Only softmax weights lie in [0, 1] and can be held as a gate (the AH rule); the
    product of log-softmax scores with the values is then a product of two activations, refused."""
    x = X.numpy()
    classes = np.zeros(len(x), dtype=np.int64)
    for log in (False, True):
        data = to_onnx(_Attention(log).eval(), X[:2], opset=11)
        ctx = AttributionContext(
            load_model(data, "onnx", "cpu"), parse_players("grid:2x2", SHAPE), Target(), {}
        )
        if not log:
            assert np.isfinite(get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)).all()
            continue
        with pytest.raises(NotApplicable, match=r"operator OnnxMatMul .* has no LRP rule"):
            get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)


def test_a_transformers_linear_layers_are_read_without_a_warning() -> None:
    """The Linear view of a MatMul with a constant matrix (``ConstantMatMul``) printed nn.Linear's
    "Initializing zero-element tensors is a no-op" on the user's terminal for every BERT audited."""
    import warnings

    ctx = _context(_TinyViT().eval(), CASES["lrp_epsilon"][0])
    x = X.numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=UserWarning, module=r"onnx2torch")  # as the CLI does
        relevance = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), _explained(ctx, x)[0])
    assert np.isfinite(relevance).all()
