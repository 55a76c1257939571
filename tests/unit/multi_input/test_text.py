"""The text acceptance: a transformer trained on negation, audited over its tokens.

"the movie was not good" is negative only because "not" and "good" act together: the game shows a
positive interaction I({not, good}) on the logit of the predicted class; Occlusion-1 hands that
effect to both words (over-allocation), Integrated Gradients at the embedding output splits it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.cli.main import main
from tests.unit.multi_input.models import NEGATION_VOCAB
from workers.audit import run_audit
from workers.audit.schema import validate_report
from workers.explain import explain
from workers.inputs import input_key
from workers.methods._embedding import find_embedding
from workers.models.named import OnnxGraph
from workers.prepare import prepare
from workers.tokens import token_names
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import FOURTEEN_METHODS, JobSpec

Model = tuple[bytes, torch.nn.Module]
_IDS = {w: i for i, w in enumerate(NEGATION_VOCAB)}


def _sentence(*words: str) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([[_IDS[w] for w in words] + [0] * (6 - len(words))], dtype=np.int64)
    return ids, (ids != 0).astype(np.int64)


def test_embedding_lookup_is_found_in_the_graph(negation_model: Model) -> None:
    graph = OnnxGraph(negation_model[0], "sha", torch.device("cpu"))
    name = find_embedding(graph.proto, "ids")
    assert any(n.op_type == "Gather" and n.output[0] == name for n in graph.proto.graph.node)
    ids, mask = _sentence("the", "movie", "was", "not", "good")
    spec = JobSpec(players="tokens", explain="ids", baseline="token:0", device="cpu", embedding_tensor="nope")
    with pytest.raises(InvalidInput, match="'nope' is not a tensor the model computes"):
        prepare(spec, negation_model[0], None, {"inputs": ids, input_key("mask"): mask})
    with pytest.raises(InvalidInput, match="use token:ID"):
        prepare(
            JobSpec(players="tokens", explain="ids", baseline="mean", device="cpu"),
            negation_model[0], None, {"inputs": ids, input_key("mask"): mask},
        )  # fmt: skip


def test_negation_interaction_and_verdicts(negation_model: Model) -> None:
    data, module = negation_model
    ids, mask = _sentence("the", "movie", "was", "not", "good")
    with torch.no_grad():
        assert (
            int(module(torch.from_numpy(ids), torch.from_numpy(mask)).argmax()) == 0
        )  # "not good": negative
    rng = np.random.default_rng(3)
    background = rng.integers(1, len(NEGATION_VOCAB), size=(2, 6)).astype(np.float32)
    spec = JobSpec(
        players="tokens", explain="ids", baseline="token:0", device="cpu", methods=FOURTEEN_METHODS
    )
    tensors = {"inputs": ids, input_key("mask"): mask, "background": background}
    report = run_audit(prepare(spec, data, None, tensors)).report
    game = report["game"]
    pair = next(t for t in game["top_interactions"] if t["members"] == [3, 4])
    assert pair["mean_effect"] > 0.5 * max(abs(t["mean_effect"]) for t in game["top_interactions"])
    methods = {m["name"]: m for m in report["methods"]}
    assert set(methods) == set(FOURTEEN_METHODS)
    for name, entry in methods.items():
        assert entry["verdict"] in ("reliable", "unreliable", "not_applicable"), name
        if entry["verdict"] == "not_applicable":
            assert entry["reason"], name
    assert "complete_allocation" in methods["occlusion_1"]["failing_criteria"]
    assert methods["integrated_gradients"]["verdict"] == "reliable"
    assert methods["shapley_value"]["verdict"] == "reliable"
    assert methods["gradient_x_input"]["verdict"] == "unreliable"


def test_token_names_are_the_shared_words() -> None:
    vocab = list(NEGATION_VOCAB)
    same = np.array([[1, 2, 4, 5], [1, 2, 4, 6]])
    assert token_names(same, vocab) == ("the", "movie", "not", "t3")
    assert token_names(np.array([[1, 1, 0]]), vocab) == ("the#0", "the#1", "<pad>")


def test_cli_report_names_players_by_their_words(
    negation_model: Model, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids, mask = _sentence("the", "movie", "was", "not", "good")
    (tmp_path / "m.onnx").write_bytes(negation_model[0])
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", mask)
    (tmp_path / "vocab.txt").write_text("\n".join(NEGATION_VOCAB) + "\n")
    out = tmp_path / "report.json"
    job = ["audit", "--model", str(tmp_path / "m.onnx"), "--device", "cpu", "--players", "tokens"]
    job += ["--input", f"ids={tmp_path / 'ids.npy'}", "--input", f"mask={tmp_path / 'mask.npy'}"]
    job += [
        "--explain",
        "ids",
        "--baseline",
        "token:0",
        "--methods",
        "integrated_gradients",
        "--out",
        str(out),
    ]
    assert main([*job, "--vocab", str(tmp_path / "vocab.txt")]) == 0
    report = json.loads(out.read_bytes())
    validate_report(report)
    names = [p["name"] for p in report["game"]["players"]]
    assert names == ["the", "movie", "was", "not", "good", "<pad>"]
    assert report["game"]["top_interactions"][0]["set"] == ["not", "good"]
    inputs = report["inputs"]
    assert inputs["explained"] == "ids" and [h["name"] for h in inputs["held"]] == ["mask"]
    assert inputs["embedding_tensor"]
    capsys.readouterr()
    assert main([*job, "--vocab", str(tmp_path / "missing.txt")]) == 2
    assert "vocabulary file not found" in capsys.readouterr().err


def test_gradient_methods_on_tokens_are_complete_at_the_embedding(negation_model: Model) -> None:
    ids, mask = _sentence("the", "movie", "was", "not", "good")
    methods = ("integrated_gradients", "deeplift_rescale", "occlusion_1")
    spec = JobSpec(
        kind="attribution", players="tokens", explain="ids", baseline="token:0", device="cpu", methods=methods
    )
    prep = prepare(spec, negation_model[0], None, {"inputs": ids, input_key("mask"): mask})
    result = explain(prep, methods)
    reference = prep.model.for_sample(0).predict(prep.baselines)[0, prep.classes[0]]
    for name in methods:
        assert result.attributions[name].shape == (1, 6), name
    ig = result.attributions["integrated_gradients"]
    np.testing.assert_allclose(ig.sum(), prep.target_values[0] - reference, rtol=1e-2)
    assert abs(ig[0, 5]) < 1e-6  # the trailing pad equals the reference: nothing to attribute


class _BagOfEmbeddings(torch.nn.Module):
    """ids -> embedding -> flatten -> Linear/ReLU/Linear: rule-based methods have a rule for every layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.hidden = torch.nn.Linear(24, 8)
        self.out = torch.nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embed(ids).flatten(1))))


def test_rule_methods_run_at_the_embedding_of_a_one_input_token_model() -> None:
    from tests.unit.multi_input.models import export

    torch.manual_seed(0)
    data = export(_BagOfEmbeddings().eval(), (torch.randint(0, 10, (2, 6)),), ("ids",))
    ids = np.array([[1, 2, 3, 4, 5, 6], [3, 3, 2, 0, 9, 8]])
    spec = JobSpec(players="tokens", baseline="token:0", device="cpu", methods=FOURTEEN_METHODS)
    report = run_audit(prepare(spec, data, None, {"inputs": ids, "background": ids[::-1]})).report
    verdicts = {m["name"]: m["verdict"] for m in report["methods"]}
    assert [n for n, v in verdicts.items() if v == "not_applicable"] == ["grad_cam"]
    for name in ("integrated_gradients", "deeplift_rescale", "deeplift_revealcancel", "shapley_value"):
        assert verdicts[name] == "reliable", name
    assert verdicts["occlusion_1"] == "unreliable"


def test_named_embedding_tensor_matches_the_one_found() -> None:
    from tests.unit.multi_input.models import export

    torch.manual_seed(1)
    data = export(_BagOfEmbeddings().eval(), (torch.randint(0, 10, (2, 6)),), ("ids",))
    ids = np.array([[1, 2, 3, 4, 5, 6]])
    name = find_embedding(OnnxGraph(data, "sha", torch.device("cpu")).proto, "ids")
    maps = []
    for tensor in ("", name):
        spec = JobSpec(
            kind="attribution", players="tokens", baseline="token:0", device="cpu", embedding_tensor=tensor
        )
        prep = prepare(spec, data, None, {"inputs": ids})
        maps.append(explain(prep, ("gradient_x_input",)).attributions["gradient_x_input"])
    np.testing.assert_array_equal(maps[0], maps[1])
    assert np.abs(maps[0]).sum() > 0
