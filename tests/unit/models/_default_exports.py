"""Models exported from one row with the dynamo exporter's defaults, beside twins exported with a
dynamic batch, and the check that xaudit re-batches the first into the second (test_pinned_shapes.py,
test_sequence_first_attention.py); transformers' text classifiers as those tests export and prepare
them (tests/unit/multi_input/test_fixed_batch_inputs.py, test_decoder_classifiers.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from workers.explain import explain
from workers.prepare import Prepared, prepare
from xaudit.contract.spec import JobSpec


def inlined(path: Path) -> bytes:
    proto = onnx.load(str(path))  # reads model.onnx.data beside it
    return proto.SerializeToString()


def default_and_dynamic(
    module: nn.Module, rows: np.ndarray, folder: Path, name: str = "x", legacy: bool = False
) -> dict[str, bytes]:
    """``module`` exported from one row with the exporter's defaults, and from two rows with a
    dynamic batch (the twin), its one input named ``name``: by the dynamo exporter, or with
    ``legacy`` by the TorchScript-based one at opset 17 (its ``dynamic_axes`` on input and output)."""
    found = {}
    for kind in ("defaults", "dynamic"):
        path = str(folder / f"{kind}.onnx")
        example = (torch.from_numpy(rows[:1] if kind == "defaults" else rows[:2]),)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if legacy:
                axes = {name: {0: "batch"}, "y": {0: "batch"}} if kind == "dynamic" else None
                torch.onnx.export(
                    module, example, path, dynamo=False, opset_version=17, input_names=[name],
                    output_names=["y"], dynamic_axes=axes,
                )  # fmt: skip
            else:
                dynamic = {name: {0: torch.export.Dim("batch")}} if kind == "dynamic" else None
                torch.onnx.export(
                    module, example, path, dynamo=True, input_names=[name], dynamic_shapes=dynamic
                )
        found[kind] = inlined(folder / f"{kind}.onnx")
    return found


def rebatched_as_the_twin(exports: dict[str, bytes], inputs: np.ndarray, spec: JobSpec, floor: float) -> None:
    """The default export is re-batched, and its outputs and attributions (``spec.methods``, each
    larger than ``floor`` somewhere) are the dynamic twin's."""
    pinned, twin = (prepare(spec, exports[k], None, {"inputs": inputs}) for k in ("defaults", "dynamic"))
    assert pinned.model.explained.fixed_batch is None  # re-batched: many rows per call
    np.testing.assert_allclose(pinned.full_outputs, twin.full_outputs, rtol=1e-5, atol=1e-6)
    got, want = (explain(p, spec.methods).attributions for p in (pinned, twin))
    for name in spec.methods:
        assert np.abs(want[name]).max() > floor, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


class Logits(nn.Module):
    """A transformers classifier called on ids and a mask, its logits out (the exporters take a
    tensor, not the model's output object)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def prepared_tokens(
    data: bytes, ids: np.ndarray, mask: np.ndarray, methods: tuple[str, ...], baseline: str
) -> Prepared:
    """A text classifier's job prepared as xaudit prepares it: its ``input_ids`` explained token by
    token at ``baseline``, its ``attention_mask`` held per sample."""
    spec = JobSpec(
        kind="attribution",
        players="tokens",
        explain="input_ids",
        baseline=baseline,
        device="cpu",
        methods=methods,
    )
    return prepare(spec, data, None, {"inputs": ids, "input:attention_mask": mask})
