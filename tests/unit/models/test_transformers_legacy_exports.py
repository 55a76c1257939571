"""transformers' text classifiers from the legacy exporter, as teams still export them.

RoBERTa: its position ids are a running count (CumSum) of its non-padding tokens, written without
CumSum's ``reverse`` attribute. onnx2torch read the missing attribute as 1 and counted from the
end, so the methods' graph computed other logits than the model (-1.29, -0.55, 1.68 became 0.30,
-0.73, 0.19 here) and every gradient method explained another function; Integrated Gradients failed
its own completeness by 23% of the output change.

GPT-2: shape inference leaves its token embeddings' batch axis unnamed, so the graph after the
lookup held the ids and the mask (which pick the last token) with one row while the embeddings came
in many, and every gradient method failed ("index 8 is out of bounds for dimension 0 with size 8")."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _legacy_export(module: torch.nn.Module) -> tuple[bytes, dict[str, np.ndarray], np.ndarray]:
    ids = torch.randint(2, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.int64)
    buffer = io.BytesIO()
    names = ["input_ids", "attention_mask"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (ids, {"attention_mask": mask}), buffer, dynamo=False, opset_version=17, input_names=names,
            output_names=["logits"], dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names}, "logits": {0: "batch"}},
        )  # fmt: skip
    with torch.no_grad():
        logits = module(ids[:1], attention_mask=mask[:1]).logits.numpy()
    return buffer.getvalue(), {"inputs": ids[:1].numpy(), "input:attention_mask": mask[:1].numpy()}, logits


def _classifier(family: str, **options: object) -> torch.nn.Module:
    """transformers' ``{family}ForSequenceClassification`` from its config (random weights)."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(vocab_size=100, num_labels=3, **options)
    return getattr(transformers, f"{family}ForSequenceClassification")(config).eval()


def _roberta() -> torch.nn.Module:
    return _classifier(
        "Roberta", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=70, pad_token_id=1, initializer_range=0.3,
    )  # fmt: skip


def _gpt2() -> torch.nn.Module:
    return _classifier(
        "GPT2",
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        pad_token_id=0,
        use_cache=False,
        initializer_range=0.3,
    )


@pytest.mark.parametrize("build", [_roberta, _gpt2], ids=["roberta", "gpt2"])
def test_the_methods_graph_computes_the_models_logits_and_integrated_gradients_completes(build) -> None:
    data, tensors, logits = _legacy_export(build())
    spec = JobSpec(
        players="tokens",
        baseline="token:5",  # not a pad id: GPT-2 picks its last token by the ids it holds
        explain="input_ids",
        methods=("integrated_gradients",),
        device="cpu",
    )
    prep = prepare(spec, data, None, tensors)
    np.testing.assert_allclose(prep.full_outputs, logits, rtol=1e-4, atol=1e-5)  # onnxruntime
    view = prep.model.for_sample(0).embedding
    at_x = np.repeat(view.embeddings(prep.inputs), 3, axis=0)  # many rows, as every method passes them
    graph = view.head.torch_differentiable()
    got = graph(torch.from_numpy(at_x)).detach().numpy()
    np.testing.assert_allclose(got, np.repeat(logits, 3, axis=0), rtol=1e-4, atol=1e-5)
    # Integrated Gradients on that graph adds up to the model's own change, as on the dynamo export.
    from workers.methods import get_method
    from workers.methods._base import AttributionContext
    from workers.methods._embedding import run_method

    method = get_method("integrated_gradients")
    params = method.bind(method.params_from({"steps": 64}), prep.inputs, (prep.baselines, None))
    ctx = AttributionContext(prep.model.for_sample(0), prep.players, prep.target, params, 0)
    attributions = run_method(method, ctx, prep.inputs, prep.baselines, prep.classes)
    change = prep.full_outputs[0, prep.classes[0]] - prep.model.predict(prep.baselines)[0, prep.classes[0]]
    assert abs(attributions.sum() - change) < 1e-3 * max(1.0, abs(change))


def _modernbert() -> torch.nn.Module:
    return _classifier(
        "ModernBert", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0, global_attn_every_n_layers=1,
    )  # fmt: skip


def _lrp_epsilon(data: bytes, tensors: dict[str, np.ndarray]) -> np.ndarray:
    from workers.methods import get_method
    from workers.methods._base import AttributionContext
    from workers.methods._embedding import run_method

    spec = JobSpec(
        players="tokens", baseline="token:5", explain="input_ids", methods=("lrp_epsilon",), device="cpu"
    )
    prep = prepare(spec, data, None, tensors)
    method = get_method("lrp_epsilon")
    params = method.bind(method.params_from({}), prep.inputs, (prep.baselines, None))
    ctx = AttributionContext(prep.model.for_sample(0), prep.players, prep.target, params, 0)
    return run_method(method, ctx, prep.inputs, prep.baselines, prep.classes)


def test_lrp_holds_modernberts_attention_also_where_the_export_reads_the_queries_shape() -> None:
    """With dynamic axes the legacy exporter reads the rotated queries' shape (a Shape node) to reshape
    the attention's output; that read counted as a use of the queries outside the held attention
    weights' branch, so LRP planned the rotary embedding and refused its Neg. A shape is no use of a
    node's values: LRP gives the attributions of the static export."""
    module = _modernbert()
    data, tensors, _ = _legacy_export(module)
    ids, mask = (torch.from_numpy(tensors[name]) for name in ("inputs", "input:attention_mask"))
    static = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (ids, {"attention_mask": mask}), static, dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask"], output_names=["logits"],
        )  # fmt: skip
    got, want = _lrp_epsilon(data, tensors), _lrp_epsilon(static.getvalue(), tensors)
    assert np.abs(want).max() > 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
