"""Expected Gradients' default quadrature follows the background's size (docs/science.md 5.5)."""

from __future__ import annotations

import numpy as np
import pytest

from workers.audit.plan import method_cost
from workers.methods import get_method
from xaudit.contract.params import expected_gradients_steps


@pytest.mark.parametrize(("references", "steps"), [(1, 64), (2, 32), (3, 22), (8, 8), (16, 8), (64, 8)])
def test_nodes_per_reference(references: int, steps: int) -> None:
    assert expected_gradients_steps(references) == steps
    x = np.zeros((1, 4), dtype=np.float32)
    background = np.zeros((references, 4), dtype=np.float32)
    bound = get_method("expected_gradients").bind({}, x, (x, background))
    assert bound["steps"] == steps
    # the plan costs what the audit will run: steps per reference, times the references
    assert (
        method_cost("expected_gradients", {}, 4, references, 4).backward_per_sub_input == steps * references
    )


def test_given_steps_and_the_exact_reference_limit() -> None:
    x = np.zeros((1, 4), dtype=np.float32)
    method = get_method("expected_gradients")
    assert method.bind({"steps": 5}, x, (x, np.zeros((2, 4), np.float32)))["steps"] == 5
    # beyond 64 background samples the job averages a seeded 64 of them
    assert method.bind({}, x, (x, np.zeros((500, 4), np.float32)))["steps"] == 8
