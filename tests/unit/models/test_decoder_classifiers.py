"""transformers' decoder classifiers (Llama: RMS norms, rotary positions, grouped-query attention,
SwiGLU MLPs; pooled at the last non-padding token) exported with each exporter's defaults from one
row: re-batched (workers/models/row_indices.py), and LRP runs through every block
(workers/models/norm_fusion.py, the Expand of the keys and values as data movement, the SwiGLU
gate held: docs/science.md 5.8), with the same relevance from both exporters. Before, the model ran
one row per call and LRP, DeepLIFT and DeepSHAP were not applicable."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tests.unit.models._default_exports import Logits, inlined, prepared_tokens
from workers.explain import explain

IDS = np.random.default_rng(5).integers(1, 100, (2, 8)).astype(np.int64)
MASK = np.ones((2, 8), np.int64)
METHODS = ("lrp_epsilon", "lrp_alpha_beta", "integrated_gradients")


@pytest.fixture(scope="module")
def llama_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, pad_token_id=0, num_labels=3, max_position_embeddings=64, use_cache=False,
    )  # fmt: skip
    module = Logits(transformers.LlamaForSequenceClassification(config).eval())
    folder = tmp_path_factory.mktemp("llama")
    example = (torch.from_numpy(IDS[:1]), torch.from_numpy(MASK[:1]))
    names = ["input_ids", "attention_mask"]
    found = {}
    for kind in ("legacy", "dynamo"):
        path = folder / f"{kind}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "legacy":
                torch.onnx.export(
                    module, example, str(path), dynamo=False, opset_version=17, input_names=names
                )
            else:
                torch.onnx.export(module, example, str(path), dynamo=True, input_names=names)
        found[kind] = inlined(path)
    return found


def test_a_default_llama_export_is_rebatched_and_lrp_runs_through_its_blocks(
    llama_exports: dict[str, bytes],
) -> None:
    got = {}
    for kind, data in llama_exports.items():
        prep = prepared_tokens(data, IDS, MASK, METHODS, baseline="token:5")
        assert prep.model.explained.fixed_batch is None, kind  # re-batched: many rows per call
        got[kind] = explain(prep, METHODS).attributions
    for name in METHODS:
        assert np.isfinite(got["legacy"][name]).all() and np.abs(got["legacy"][name]).max() > 1e-3, name
        np.testing.assert_allclose(
            got["dynamo"][name], got["legacy"][name], rtol=1e-3, atol=1e-5, err_msg=name
        )
