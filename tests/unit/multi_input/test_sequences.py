"""Sequence players (windows:K, tokens), token references, named and scalar output targets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from workers.audit import run_audit
from workers.inputs import input_key
from workers.players import parse_players
from workers.prepare import prepare
from workers.references import make_baselines
from workers.targets import parse_target
from workers.tokens import check_token_baselines
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec

Model = tuple[bytes, torch.nn.Module]


def test_windows_split_the_last_axis_into_named_ranges() -> None:
    players = parse_players("windows:3", (2, 10))
    assert players.names == ("[0:3)", "[3:7)", "[7:10)")
    assert players.labels.shape == (2, 10)
    assert (players.labels[0] == players.labels[1]).all()  # every channel goes with its window
    assert players.sizes.tolist() == [6, 8, 6]
    with pytest.raises(InvalidInput, match="between 1 and"):
        parse_players("windows:11", (2, 10))
    with pytest.raises(InvalidInput, match="windows:K"):
        parse_players("windows:x", (10,))


@pytest.mark.parametrize("axis", [0, -2])
def test_windows_over_the_time_of_a_time_by_features_sequence(axis: int) -> None:
    players = parse_players(f"windows:3:axis={axis}", (10, 2))
    assert players.names == ("[0:3)", "[3:7)", "[7:10)")
    np.testing.assert_array_equal(players.labels, parse_players("windows:3", (2, 10)).labels.T)
    with pytest.raises(InvalidInput, match="axis 0's length 10"):
        parse_players(f"windows:11:axis={axis}", (10, 2))
    with pytest.raises(InvalidInput, match="not an axis"):
        parse_players("windows:2:axis=2", (10, 2))
    with pytest.raises(InvalidInput, match="windows:K:axis=A"):
        parse_players("windows:2:axes=0", (10, 2))


def test_tokens_are_one_player_per_position() -> None:
    players = parse_players("tokens", (5,))
    assert players.n == 5 and players.labels.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(InvalidInput, match=r"shape \(positions,\)"):
        parse_players("tokens", (2, 5))


def test_token_reference_replaces_ids_and_blends_are_refused() -> None:
    ids = np.array([[3.0, 7.0, 9.0]], dtype=np.float32)
    assert make_baselines("token:1", ids).tolist() == [[1.0, 1.0, 1.0]]
    with pytest.raises(InvalidInput, match="integer ID"):
        make_baselines("token:x", ids)
    check_token_baselines("token:1", make_baselines("token:1", ids))
    with pytest.raises(InvalidInput, match="use token:ID"):
        check_token_baselines("mean", make_baselines("mean", ids))


def test_named_output_targets_parse() -> None:
    target = parse_target("output:speech[0]")
    assert (target.output, target.fixed_class) == ("speech", 0)
    assert parse_target("output:logits").fixed_class == 0
    for bad in ("output:", "output:x[a]", "output:x[-1]"):
        with pytest.raises(InvalidInput):
            parse_target(bad)


def _recurrent_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    return rng.normal(size=(2, 1, 16)).astype(np.float32), rng.normal(size=(2, 8)).astype(np.float32)


def test_scalar_output_is_the_target_as_is(recurrent_model: Model) -> None:
    data, module = recurrent_model
    signal, state = _recurrent_inputs()
    tensors = {"inputs": signal, input_key("state"): state}
    spec = JobSpec(players="windows:4", explain="signal", device="cpu")
    prep = prepare(spec, data, None, tensors)
    with torch.no_grad():
        expected = module(torch.from_numpy(signal), torch.from_numpy(state)).numpy()
    np.testing.assert_allclose(prep.target_values, expected, rtol=1e-5)
    named = prepare(
        JobSpec(players="windows:4", explain="signal", device="cpu", target="output:speech[0]"),
        data,
        None,
        tensors,
    )
    np.testing.assert_allclose(named.target_values, expected, rtol=1e-5)
    with pytest.raises(InvalidInput, match="no output 'prob'"):
        prepare(
            JobSpec(players="windows:4", explain="signal", device="cpu", target="output:prob"),
            data,
            None,
            tensors,
        )


def test_recurrent_audit_over_windows_with_a_held_state(recurrent_model: Model) -> None:
    signal, state = _recurrent_inputs()
    methods = ("integrated_gradients", "shapley_value", "occlusion_patch", "lrp_epsilon", "deeplift_rescale")
    spec = JobSpec(players="windows:4", explain="signal", device="cpu", methods=methods)
    prep = prepare(spec, recurrent_model[0], None, {"inputs": signal, input_key("state"): state})
    report = run_audit(prep).report
    assert [p["name"] for p in report["game"]["players"]] == ["[0:4)", "[4:8)", "[8:12)", "[12:16)"]
    verdicts = {m["name"]: m for m in report["methods"]}
    assert verdicts["integrated_gradients"]["verdict"] == "reliable"
    assert verdicts["shapley_value"]["verdict"] == "reliable"
    assert "unrelated_allocation" in verdicts["occlusion_patch"]["failing_criteria"]
    assert verdicts["lrp_epsilon"]["verdict"] == "not_applicable" and verdicts["lrp_epsilon"]["reason"]
    # the state is held per sample: the implementation is read off the first sample's bound graph
    assert verdicts["deeplift_rescale"]["implementation"].startswith("Captum's DeepLift"), verdicts[
        "deeplift_rescale"
    ]


class _Bag(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(10, 3), torch.nn.Linear(18, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(ids)).flatten(1))


def test_skipped_token_positions_are_pinned_in_one_player_without_effect() -> None:
    from tests.unit.multi_input.models import export
    from workers.game import play

    torch.manual_seed(2)
    data = export(_Bag().eval(), (torch.randint(0, 10, (2, 6)),), ("ids",))
    ids = np.array([[7, 2, 3, 4, 5, 8], [7, 3, 3, 1, 9, 8]])
    background = np.array([[1, 1, 1, 1, 1, 1]], dtype=np.float32)
    spec = JobSpec(players="tokens:skip=0,-1", baseline="token:0", device="cpu")
    prep = prepare(spec, data, None, {"inputs": ids, "background": background})
    assert prep.players.names == ("t1", "t2", "t3", "t4", "[t0,t5]")
    assert prep.players.labels.tolist() == [4, 0, 1, 2, 3, 4]
    assert (prep.baselines[:, [0, 5]] == ids[:, [0, 5]]).all() and (prep.baselines[:, 1:5] == 0).all()
    assert prep.background is not None and prep.background[0].tolist() == [7, 1, 1, 1, 1, 8]
    game = play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes)
    with_special = (game.subsets.astype(np.int64) >> 4) & 1 == 1
    assert np.abs(game.interactions[:, with_special]).max() < 1e-5
    assert np.abs(game.interactions[:, ~with_special]).max() > 1e-2
    methods = ("integrated_gradients", "shapley_value")
    report = run_audit(prepare(replace(spec, methods=methods), data, None, {"inputs": ids})).report
    assert [m["verdict"] for m in report["methods"]] == ["reliable", "reliable"]
    for bad in ("tokens:skip=9", "tokens:skip=a", "tokens:keep=1", "tokens:skip=0,1,2,3,4,5"):
        with pytest.raises(InvalidInput):
            parse_players(bad, (6,))
    mixed = np.array([[7, 2, 3], [6, 2, 3]])
    with pytest.raises(InvalidInput, match="different ids across samples"):
        from workers.tokens import pin_skipped

        pin_skipped("tokens:skip=0", mixed.astype(np.float32), np.zeros((2, 3), np.float32), np.zeros((1, 3)))
