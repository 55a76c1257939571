"""Attention written sequence first (torch's ``nn.MultiheadAttention``, inside ``nn.TransformerEncoder``
and torchvision's ViT and Swin) folds the batch into the heads' axis by Reshapes with no size of 1.
From a one-row export with the exporter's defaults, xaudit follows the rows through the graph to
place the batch in each (workers/models/batch_placement.py) and re-batches the model as its twin
exported with a dynamic batch. Before, such a model ran one row per call, DeepLIFT not applicable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from torch import nn

from tests.unit.models._default_exports import default_and_dynamic, rebatched_as_the_twin
from workers.models.batch_placement import one_row_tensors, shapes_keeping_rows
from xaudit.contract.spec import JobSpec

METHODS = ("integrated_gradients", "lrp_epsilon", "deeplift_rescale")
IMAGES = np.random.default_rng(3).standard_normal((3, 3, 8, 8)).astype(np.float32)


class _TextEncoder(nn.Module):
    """Token ids -> nn.Embedding -> nn.TransformerEncoder (2 layers) -> mean -> Linear, batch first
    or sequence first as a text or time-series classifier is built from torch's own layers."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(40, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        states = self.embed(ids)
        if self.batch_first:
            return self.out(self.encoder(states).mean(1))
        return self.out(self.encoder(states.transpose(0, 1)).transpose(0, 1).mean(1))


@pytest.mark.parametrize(("batch_first", "legacy"), [(True, False), (False, False), (False, True)])
def test_a_default_export_of_a_transformer_encoder_is_rebatched_as_its_dynamic_twin(
    batch_first: bool, legacy: bool, tmp_path: Path
) -> None:
    """The legacy exporter computes most shapes from the input's at run time, but writes the batch
    of 1 as a constant beside them: the walk compares each shape with its value at one row."""
    torch.manual_seed(5)
    ids = np.random.default_rng(6).integers(1, 40, (3, 6)).astype(np.int64)
    exports = default_and_dynamic(_TextEncoder(batch_first).eval(), ids, tmp_path, "ids", legacy)
    folds = [  # (6, 1, 16) -> (6, 2, 8): queries split into heads, no size of 1 to hold the batch
        n for n in onnx.load_from_string(exports["defaults"]).graph.node if n.op_type == "Reshape"
    ]
    assert folds
    spec = JobSpec(kind="attribution", players="tokens", baseline="token:0", device="cpu", methods=METHODS)
    rebatched_as_the_twin(exports, ids, spec, floor=1e-3)


def _torchvision_vit() -> nn.Module:
    from torchvision.models import VisionTransformer

    vit = VisionTransformer(
        image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3
    )
    nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zeros: a constant model
    return vit


def _torchvision_swin(version: int) -> nn.Module:
    from torchvision.models import swin_transformer as swin

    blocks = (
        {}
        if version == 1
        else {"block": swin.SwinTransformerBlockV2, "downsample_layer": swin.PatchMergingV2}
    )
    return swin.SwinTransformer([2, 2], 8, [2], [2], [2, 2], num_classes=3, **blocks)


@pytest.mark.parametrize("legacy", [False, True], ids=["dynamo", "legacy"])
@pytest.mark.parametrize(
    "build",
    [_torchvision_vit, lambda: _torchvision_swin(1), lambda: _torchvision_swin(2)],
    ids=["vit", "swin", "swin_v2"],
)
def test_default_exports_of_torchvisions_vit_and_swin_are_rebatched_as_their_dynamic_twins(
    build: object, legacy: bool, tmp_path: Path
) -> None:
    """vit_b_16, swin_t and swin_v2_t exported so ran one row per call; swin_v2's ``expand_as`` of its
    normalised queries to the (windows, heads, tokens, dim) of one image pinned the batch as well.
    The legacy exporter writes ViT's ``class_token.expand(1, -1, -1)`` as a computation from
    constants, and Swin's window partition to (1, H/w, w, W/w, w, C) from the input's sizes with a
    constant 1 for the batch."""
    torch.manual_seed(7)
    exports = default_and_dynamic(build().eval(), IMAGES, tmp_path, legacy=legacy)  # type: ignore[operator]
    spec = JobSpec(kind="attribution", players="grid:2x2", device="cpu", methods=METHODS)
    rebatched_as_the_twin(exports, IMAGES, spec, floor=1e-4)


def _kept(
    nodes: list[onnx.NodeProto], weight: tuple[int, int], shapes: dict[str, list[int]]
) -> dict[str, list[int]] | None:
    """The shapes the walk gives the graph ``nodes`` from x (1, 4, 6) to y, with a weight ``w`` and
    the constant shapes ``shapes``, to keep the rows."""
    rng = np.random.default_rng(8)
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[
            nh.from_array(rng.standard_normal(weight).astype(np.float32), "w"),
            *(nh.from_array(np.array(v, np.int64), k) for k, v in shapes.items()),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    alone = one_row_tensors(model)
    assert alone is not None
    kept = shapes_keeping_rows(model, "x", (), alone)
    return None if kept is None else {name: shape.tolist() for name, shape in kept.items()}


def test_a_place_that_a_later_node_refutes_is_undone_and_the_next_one_taken() -> None:
    """(1, 4, 6) turned to (4, 1, 6) and merged to (4, 6): the rows may go inside the 6, which the
    walk tries first (attention's heads are there), or inside the 4. At three rows the MatMul with
    the (6, 5) weight refutes the first, so the second stands; the unmerge then has a 1 of its own."""
    nodes = [
        oh.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        oh.make_node("Reshape", ["t", "merge"], ["merged"]),
        oh.make_node("MatMul", ["merged", "w"], ["m"]),
        oh.make_node("Reshape", ["m", "unmerge"], ["u"]),
        oh.make_node("Transpose", ["u"], ["y"], perm=[1, 0, 2]),
    ]
    assert _kept(nodes, (6, 5), {"merge": [4, 6], "unmerge": [4, 1, 5]}) == {
        "merged": [-1, 6],
        "u": [4, -1, 5],
    }


def test_no_place_is_given_where_every_one_is_refuted() -> None:
    """(1, 4, 6) folded to (4, 6) can hold the rows only inside the 4, which a weight contracts after
    a transpose: refuted at three rows, and nothing else to try, so the walk gives up."""
    nodes = [
        oh.make_node("Reshape", ["x", "fold"], ["folded"]),
        oh.make_node("Transpose", ["folded"], ["turned"], perm=[1, 0]),
        oh.make_node("MatMul", ["turned", "w"], ["m"]),
        oh.make_node("Reshape", ["m", "row"], ["y"]),
    ]
    assert _kept(nodes, (4, 5), {"fold": [4, 6], "row": [1, 30]}) is None
