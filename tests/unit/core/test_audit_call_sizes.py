"""The audit's calls of sub-inputs are shared among the passes a row costs (workers/audit/subinputs.py):
a call of Integrated Gradients at 64 steps holds 1/64 of Gradient x Input's rows, so that progress and
a cancellation check come as often (at 224x224 a call ran over ten minutes before). Stochastic methods
keep their calls: the cut seeds their noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workers.audit.subinputs as subinputs
from tests.models import relu_cnn, to_onnx
from tests.unit.core.conftest import prepared
from workers.interactions import subsets_up_to
from workers.methods import get_method

GRADIENT_X_INPUT_CALLS = [100, 100, 56]  # 256 sub-inputs of one sample, 100 per call


def _counted_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sub-inputs of each audit call on the host from now on."""
    calls: list[int] = []
    per_player = subinputs._HostSubInputs.per_player

    def counted(self, method, ctx, bits, inputs, *rest):  # type: ignore[no-untyped-def]
        calls.append(len(bits) * len(inputs))
        return per_player(self, method, ctx, bits, inputs, *rest)

    monkeypatch.setattr(subinputs._HostSubInputs, "per_player", counted)
    return calls


def _calls(
    name: str, params: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[int], np.ndarray]:
    """The sub-inputs of each call of ``name`` over two samples of 8 players, and its attributions."""
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(8))
    prep = prepared(to_onnx(relu_cnn(1), x), x.numpy(), players="grid:2x4", methods=(name,))
    method = get_method(name)
    bound = method.bind(method.params_from(params), prep.inputs, (prep.baselines,))
    calls = _counted_calls(monkeypatch)
    out = subinputs.attribute_sub_inputs(
        method,
        prep.model,
        prep.players,
        prep.target,
        bound,
        0,
        prep.inputs,
        prep.baselines,
        np.array([2, 0]),
        subsets_up_to(prep.players.n, prep.players.n),
    )
    return calls, out.per_player


def test_calls_of_a_method_of_many_passes_hold_fewer_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subinputs, "_MAX_ELEMENTS_PER_CALL", 64 * 100)
    assert _calls("gradient_x_input", {}, monkeypatch)[0] == GRADIENT_X_INPUT_CALLS * 2
    assert get_method("integrated_gradients").passes_per_row({"steps": 4}) == 4
    calls, cut = _calls("integrated_gradients", {"steps": 4}, monkeypatch)
    assert calls == ([25] * 10 + [6]) * 2
    monkeypatch.setattr(subinputs, "_MAX_ELEMENTS_PER_CALL", 2**30)
    calls, whole = _calls("integrated_gradients", {"steps": 4}, monkeypatch)
    assert calls == [512]
    np.testing.assert_allclose(cut, whole, rtol=1e-6, atol=1e-7)  # deterministic: the cut changes nothing


def test_expected_gradients_counts_its_nodes_per_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subinputs, "_MAX_ELEMENTS_PER_CALL", 64 * 100)
    method = get_method("expected_gradients")
    assert method.passes_per_row(method.params_from({"steps": 5})) == 5
    assert _calls("expected_gradients", {"steps": 5}, monkeypatch)[0] == ([20] * 12 + [16]) * 2


def test_a_stochastic_method_keeps_its_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subinputs, "_MAX_ELEMENTS_PER_CALL", 64 * 100)
    assert get_method("smoothgrad").passes_per_row({"samples": 8}) == 8
    assert _calls("smoothgrad", {"samples": 8}, monkeypatch)[0] == GRADIENT_X_INPUT_CALLS * 2


def test_a_token_models_calls_count_its_embedding_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradient methods on token ids run at the embedding output: a row is 6 x 16 floats there, not
    6 ids. Counted as ids, a BERT of width 256 at 128 tokens took calls of 1,024 sub-inputs, and
    Integrated Gradients at 64 steps some 20 minutes per call without progress."""
    from tests.unit.multi_input.models import tiny_token_job
    from workers.methods._embedding import attributed_elements

    prep = tiny_token_job()
    gradients, occlusion = get_method("gradient_x_input"), get_method("occlusion_1")
    assert attributed_elements(gradients, prep.model, prep.inputs) == 6 * 16
    assert attributed_elements(occlusion, prep.model, prep.inputs) == 6
    monkeypatch.setattr(subinputs, "_MAX_ELEMENTS_PER_CALL", 6 * 16 * 10)
    calls = _counted_calls(monkeypatch)
    subsets = subsets_up_to(6, 6)
    for method in (gradients, occlusion):
        subinputs.attribute_sub_inputs(
            method, prep.model, prep.players, prep.target, {}, 0, prep.inputs, prep.baselines,
            prep.classes, subsets,
        )  # fmt: skip
    assert calls == [10] * 6 + [4] + [64]  # ids count for Occlusion: 960 ids hold all 64
