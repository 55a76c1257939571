"""Tiny multi-input models built, trained briefly and exported to ONNX here (no model hubs).

- ``image_tabular``: an image (1, 8, 8) and 4 clinical variables -> 2 logits (conv + MLP, concat).
- ``recurrent``: a signal (1, 16) and a GRU state (1, 8) -> one probability (a scalar output).
- ``negation_classifier``: a one-layer transformer over token ids (6,) and an attention mask (6,)
  trained on "good" vs "not good" sentences (opset 17, LayerNorm and Softmax inside).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from workers.prepare import Prepared

__all__ = [
    "NEGATION_VOCAB",
    "export",
    "image_tabular",
    "negation_classifier",
    "negation_sentences",
    "recurrent",
    "tiny_token_job",
]


def export(
    module: nn.Module,
    examples: Sequence[torch.Tensor],
    names: Sequence[str],
    outputs: Sequence[str] = ("logits",),
    opset: int = 17,
) -> bytes:
    """ONNX bytes with a dynamic batch axis on every input and output."""
    buffer = io.BytesIO()
    axes = {n: {0: "batch"} for n in (*names, *outputs)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), tuple(examples), buffer, dynamo=False, opset_version=opset,
            input_names=list(names), output_names=list(outputs), dynamic_axes=axes,
        )  # fmt: skip
    return buffer.getvalue()


class ImageTabular(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.tab = nn.Linear(4, 6)
        self.head = nn.Linear(12 + 6, 2)

    def forward(self, image: torch.Tensor, clinical: torch.Tensor) -> torch.Tensor:
        a = self.pool(torch.relu(self.conv(image))).flatten(1)
        b = torch.relu(self.tab(clinical))
        return self.head(torch.cat([a, b], dim=1))


def image_tabular(seed: int = 0) -> tuple[bytes, nn.Module]:
    torch.manual_seed(seed)
    model = ImageTabular().eval()
    return export(model, (torch.rand(2, 1, 8, 8), torch.rand(2, 4)), ("image", "clinical")), model


class Recurrent(nn.Module):
    """Windows of a signal through a GRU cell from a given state; a probability out."""

    def __init__(self, window: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.window = window
        self.cell = nn.GRUCell(window, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, signal: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        h = state
        for t in range(signal.shape[-1] // self.window):
            h = self.cell(signal[:, 0, t * self.window : (t + 1) * self.window], h)
        return torch.sigmoid(self.out(h))[:, 0]


def recurrent(seed: int = 0) -> tuple[bytes, nn.Module]:
    torch.manual_seed(seed)
    model = Recurrent().eval()
    data = export(model, (torch.rand(2, 1, 16), torch.rand(2, 8)), ("signal", "state"), ("speech",))
    return data, model


NEGATION_VOCAB = ("<pad>", "the", "movie", "was", "not", "good", "bad", "great", "awful", "very")
_POSITIVE = ("good", "great")
_NEGATIVE = ("bad", "awful")


def negation_sentences(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (count, 6) of "the movie was [not|very] ADJ" and labels: positive iff the adjective
    is positive XOR "not" precedes it."""
    ids, labels = [], []
    index = {w: i for i, w in enumerate(NEGATION_VOCAB)}
    for _ in range(count):
        adjective = str(rng.choice(_POSITIVE + _NEGATIVE))
        modifier = str(rng.choice(["not", "very", "<pad>"]))
        words = ["the", "movie", "was", modifier, adjective]
        positive = (adjective in _POSITIVE) != (modifier == "not")
        ids.append([index[w] for w in words] + [0])
        labels.append(int(positive))
    return np.asarray(ids, dtype=np.int64), np.asarray(labels, dtype=np.int64)


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, positions: int = 6, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(positions, dim) * 0.1)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 32), nn.GELU(), nn.Linear(32, dim))
        self.cls = nn.Linear(dim, 2)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position
        scores = self.q(x) @ self.k(x).transpose(1, 2) / x.shape[-1] ** 0.5
        scores = scores + (1.0 - mask[:, None, :].float()) * -1e4
        x = self.norm(x + torch.softmax(scores, dim=-1) @ self.v(x))
        x = x + self.ff(x)
        weights = mask.float()[:, :, None]
        return self.cls((x * weights).sum(1) / weights.sum(1))


def negation_classifier(seed: int = 0, epochs: int = 150) -> tuple[bytes, nn.Module, float]:
    """The trained classifier's ONNX bytes, module and training accuracy (full batch, Adam)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    ids, labels = negation_sentences(rng, 256)
    model = TinyTransformer(len(NEGATION_VOCAB))
    x, y = torch.from_numpy(ids), torch.from_numpy(labels)
    mask = (x != 0).long()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(x, mask), y)
        loss.backward()
        optimiser.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x, mask).argmax(1) == y).float().mean())
    data = export(model, (x[:2], mask[:2]), ("ids", "mask"))
    return data, model, accuracy


def tiny_token_job() -> Prepared:
    """An untrained TinyTransformer (embedding width 16) over one sentence of 6 token ids, prepared
    with every token a player: a token model whose calls and passes tests can count."""
    from workers.prepare import prepare
    from xaudit.contract.spec import JobSpec

    torch.manual_seed(0)
    ids = torch.randint(1, 12, (1, 6))
    mask = torch.ones(1, 6, dtype=torch.int64)
    data = export(TinyTransformer(12), (ids, mask), ("ids", "mask"))
    spec = JobSpec(players="tokens", explain="ids", baseline="token:0", device="cpu")
    return prepare(spec, data, None, {"inputs": ids.numpy(), "input:mask": mask.numpy()})
