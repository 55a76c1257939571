"""DeepLIFT RevealCancel on the shipped digits CNN against attributions frozen from the float64
implementation (tests/assets/revealcancel/README.md): a faster rewrite must not change the result."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from workers.interactions import subsets_up_to
from workers.methods import AttributionContext, get_method
from workers.models import load_model
from workers.players import parse_players, subset_bits
from workers.sub_inputs import masked_samples
from workers.targets import parse_target

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "assets" / "revealcancel" / "digits_golden.npz"
ASSETS = ROOT / "workers" / "assets"
TARGETS = ("predicted", "prob")
REFERENCES = ("zeros", "background")


@cache
def golden_cases() -> dict[str, tuple[AttributionContext, np.ndarray, np.ndarray, np.ndarray]]:
    """The audit's own layout: sub-inputs x_T of two digits (every 11th grid:2x4 subset), each
    sample's rows sharing its reference, for logit and probability targets."""
    model = load_model((ASSETS / "digits_cnn.onnx").read_bytes(), "onnx", "cpu")
    inputs = np.load(ASSETS / "digits_inputs.npy")[:2]
    background = np.load(ASSETS / "digits_background.npy")[:2]
    players = parse_players("grid:2x4", inputs.shape[1:])
    subsets = subsets_up_to(players.n, players.n)[::11]
    cases = {}
    for spec in TARGETS:
        target = parse_target(spec)
        classes = target.resolve_classes(model.predict(inputs))
        for name in REFERENCES:
            refs = np.zeros_like(inputs) if name == "zeros" else background
            batch = masked_samples(subset_bits(subsets, players.n), inputs[:2], refs[:2], players)
            ctx = AttributionContext(model, players, target, {}, 0)
            cases[f"{spec}_{name}"] = (
                ctx,
                batch,
                np.repeat(refs, len(subsets), axis=0),
                np.repeat(classes, len(subsets)),
            )
    return cases


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("reference", REFERENCES)
def test_digits_attributions_are_unchanged(spec: str, reference: str) -> None:
    key = f"{spec}_{reference}"
    ctx, batch, refs, classes = golden_cases()[key]
    got = get_method("deeplift_revealcancel").attribute(ctx, batch, refs, classes)
    want = np.load(GOLDEN)[key]
    assert got.shape == want.shape
    # Per element, relative to the attributions' scale (an element that is nearly zero carries
    # rounding of its larger neighbours' terms).
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
