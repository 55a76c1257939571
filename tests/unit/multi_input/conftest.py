"""Tiny multi-input models, built and exported once per session."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unit.multi_input.models import image_tabular, negation_classifier, recurrent


@pytest.fixture(scope="session")
def image_tabular_model() -> tuple[bytes, torch.nn.Module]:
    return image_tabular()


@pytest.fixture(scope="session")
def recurrent_model() -> tuple[bytes, torch.nn.Module]:
    return recurrent()


@pytest.fixture(scope="session")
def negation_model() -> tuple[bytes, torch.nn.Module]:
    data, module, accuracy = negation_classifier(epochs=40)
    assert accuracy == 1.0, f"the negation classifier did not learn its task (accuracy {accuracy})"
    return data, module


@pytest.fixture()
def image_tabular_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.random((2, 1, 8, 8), dtype=np.float32), rng.random((2, 4), dtype=np.float32)
