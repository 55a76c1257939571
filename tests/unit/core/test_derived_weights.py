"""An audit keeps one method's derived weights at a time (workers.methods.release_derived): LRP's
stacked blocks and RevealCancel's float64 plans, kept together for the model's life, held 3.1 GB
beside VGG11's 0.5 GB of weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workers.methods._lrp_rules as lrp_rules
import workers.methods.deeplift_revealcancel as revealcancel
from tests.models import CNN_SHAPE, relu_cnn, to_onnx
from workers.audit import run_audit
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

METHODS = ("lrp_alpha_beta", "deeplift_revealcancel", "deep_taylor")


def _audit(monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list[int]]:
    """The report, and how many layers held LRP's derived blocks each time RevealCancel planned."""
    seen: list[int] = []
    planned = revealcancel._plan

    def plan(*args: object) -> object:
        seen.append(len(lrp_rules._DERIVED))
        return planned(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(revealcancel, "_plan", plan)
    x = np.random.default_rng(3).random((2, *CNN_SHAPE), dtype=np.float32)
    data = to_onnx(relu_cnn(seed=5), torch.from_numpy(x[:1]))
    spec = JobSpec(players="grid:2x2", methods=METHODS, device="cpu")
    return run_audit(prepare(spec, data, "onnx", {"inputs": x})).report, seen


def test_each_method_runs_without_the_weights_the_one_before_derived(monkeypatch: pytest.MonkeyPatch) -> None:
    report, seen = _audit(monkeypatch)
    assert seen and set(seen) == {0}  # alpha-beta ran before RevealCancel, in the maps and the audit
    assert len(lrp_rules._DERIVED) == 0 and len(revealcancel._PLANS) == 0  # and none is left after
    assert {m["name"]: m["verdict"] for m in report["methods"]}.keys() == set(METHODS)
    assert all(m["verdict"] != "not_applicable" for m in report["methods"])


def test_without_the_release_they_pile_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: with the release made a no-op, RevealCancel finds alpha-beta's."""
    monkeypatch.setattr(lrp_rules, "release_derived", lambda: None)
    _, seen = _audit(monkeypatch)
    assert seen and min(seen) > 0
    lrp_rules._DERIVED.clear()
