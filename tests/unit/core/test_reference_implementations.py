"""Our method implementations against the field's reference implementations (Captum)."""

from __future__ import annotations

import numpy as np
import torch
from captum.attr import DeepLiftShap, FeatureAblation
from captum.attr import IntegratedGradients as CaptumIG

from tests.models import relu_cnn, to_onnx
from workers.explain import method_context
from workers.methods import attribute, get_method
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

GEN = torch.Generator().manual_seed(11)
X = torch.randn(3, 1, 8, 8, generator=GEN)
BACKGROUND = torch.randn(4, 1, 8, 8, generator=GEN)
PREP = prepare(
    JobSpec(players="grid:2x4", device="cpu", baseline="constant:0.25"),
    to_onnx(relu_cnn(4), X),
    None,
    {"inputs": X.numpy(), "background": BACKGROUND.numpy()},
)
TARGET = torch.from_numpy(PREP.classes)


def _ours(name: str) -> np.ndarray:
    ctx = method_context(PREP, name)
    return attribute(get_method(name), ctx, PREP.inputs, PREP.baselines, PREP.classes, PREP.background)


def _graph() -> torch.nn.Module:
    return PREP.model.torch_hookable("reference")


def test_integrated_gradients_equals_captum() -> None:
    reference = CaptumIG(_graph()).attribute(
        X, baselines=torch.from_numpy(PREP.baselines), target=TARGET, n_steps=64, method="gausslegendre"
    )
    np.testing.assert_allclose(_ours("integrated_gradients"), reference.detach().numpy(), atol=1e-5)


def test_deepshap_equals_captum_deepliftshap() -> None:
    reference = DeepLiftShap(_graph()).attribute(X, baselines=BACKGROUND, target=TARGET)
    np.testing.assert_allclose(_ours("deepshap"), reference.detach().numpy(), atol=1e-5)


def test_occlusion_1_sums_per_player_to_captum_feature_ablation() -> None:
    mask = torch.from_numpy(PREP.players.labels)[None]
    reference = FeatureAblation(_graph()).attribute(
        X, baselines=torch.from_numpy(PREP.baselines), target=TARGET, feature_mask=mask
    )
    # Captum gives every element of a player the player's whole difference; we share it out.
    per_player_reference = (
        reference.detach()
        .numpy()
        .reshape(3, -1)[:, [np.argmax(PREP.players.labels.ravel() == i) for i in range(8)]]
    )
    np.testing.assert_allclose(
        PREP.players.sum_per_player(_ours("occlusion_1")), per_player_reference, atol=1e-5
    )
