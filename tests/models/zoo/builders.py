"""The model zoo: models as third parties export them, built here with random weights (no downloads).

Each builder returns a :class:`ZooModel`: the model file written to a directory (ONNX with its side
files, or TorchScript), the input files an audit needs, what ``xaudit inspect`` must find, and a
reference forward pass to compare against. Sizes are tiny on purpose (32x32 images, short
sequences): the zoo checks that real exporters' graphs get in, not accuracy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from torch import nn

__all__ = [
    "CUSTOM",
    "DYNAMO_ARCHS",
    "IMAGE_ARCHS",
    "LIGHT_ARCHS",
    "ZooModel",
    "export_image_model",
    "image_model",
]

IMAGE = (3, 32, 32)


@dataclass
class ZooModel:
    model: Path
    inputs: dict[str, np.ndarray]  # name -> array as the model wants it ("" for a one-input model)
    explain: str = ""
    batch_axes: dict[str, int | None] = field(default_factory=dict)  # what inspect must find
    expected: np.ndarray | None = None  # the first output for ``inputs``, from torch
    players: str = "grid:2x2"
    extra: tuple[str, ...] = ()

    def cli_args(self, folder: Path) -> list[str]:
        args = ["--model", str(self.model)]
        for name, array in self.inputs.items():
            path = folder / f"{name or 'input'}.npy"
            np.save(path, array)
            args += ["--input", f"{name}={path}" if name else str(path)]
        if self.explain:
            args += ["--explain", self.explain]
        return [*args, "--players", self.players, *self.extra]


def _seeded(module: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(
                torch.randn(p.shape, generator=gen)
                * (0.5 / max(1, p[0].numel()) ** 0.5 if p.dim() > 1 else 0.1)
            )
    return module.eval()


# -- torchvision classification models ---------------------------------------------------------


def _random_head(model: nn.Module) -> nn.Module:
    # torchvision zero-initialises ViT's classification head: the output would ignore the input and
    # every attribution would be trivially zero.
    head = model.heads.head
    nn.init.normal_(head.weight, std=0.05)
    nn.init.normal_(head.bias, std=0.05)
    return model


def _vit() -> nn.Module:
    import torchvision

    # The real vit_b_16 (12 layers, width 768, 86M parameters) at 32x32: patch 16 gives 2x2 patches
    # plus the class token.
    return _random_head(torchvision.models.vit_b_16(weights=None, image_size=32, num_classes=10))


def _vit_tiny() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    # Not vit_b_16: its class, patch size and ONNX operators at 2 layers, width 32 (42k parameters).
    return _random_head(
        VisionTransformer(
            image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
        )
    )


def _tv(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(num_classes=10)

    return build


IMAGE_ARCHS: dict[str, Callable[[], nn.Module]] = {
    "resnet18": _tv("resnet18"),
    "mobilenet_v2": _tv("mobilenet_v2"),  # ReLU6 (Clip 0..6) in LRP and RevealCancel
    "mobilenet_v3_small": _tv("mobilenet_v3_small"),
    "efficientnet_b0": _tv("efficientnet_b0"),
    "densenet121": _tv("densenet121"),
    "shufflenet_v2_x0_5": _tv("shufflenet_v2_x0_5"),  # dynamo: Split with num_outputs (opset 18)
    "swin_t": _tv("swin_t"),  # LayerNorm over symbolic sizes; dynamo: Pad-19, ScatterND-18
    "swin_v2_t": _tv("swin_v2_t"),  # legacy: F.normalize's clamp as Clip(x, eps, "")
    "vit_b_16": _vit,
}
# Lighter stand-ins for checks where the operators matter, not the size (CI's opset 18-21 checks).
LIGHT_ARCHS: dict[str, Callable[[], nn.Module]] = {"vit_tiny": _vit_tiny}
# timm's architectures (random weights): TF-style "same" padding, which the dynamo exporter folds into
# asymmetric Conv pads; HRNet's Resize-18 upsampling; ResNeSt's split attention summed by a ReduceSum.
TIMM_ARCHS = ("tf_efficientnet_b0", "hrnet_w18_small", "resnest14d")


def _timm(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        model: nn.Module = timm.create_model(name, pretrained=False, num_classes=10)
        return model

    return build


# Architectures the legacy exporter cannot export at 32x32: VGG's adaptive pool to 7x7 on a 1x1 map
# ("output size that are not factor of input size"); the dynamo exporter writes it as a GatherND.
DYNAMO_ARCHS: dict[str, Callable[[], nn.Module]] = {"vgg11_bn": _tv("vgg11_bn")}


def _monai(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import monai.networks.nets as nets

        shape = {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "channels": (8, 16, 32)}
        if name == "UNet":  # instance norms (no affine part), PReLU, a residual sum as the output
            return nets.UNet(**shape, strides=(2, 2), num_res_units=2)
        return nets.AttentionUnet(**shape, strides=(2, 2))  # batch norms after ConvTranspose, sigmoid gates

    return build


def _smp_unet() -> nn.Module:
    import segmentation_models_pytorch as smp

    model: nn.Module = smp.Unet("resnet18", encoder_weights=None, in_channels=3, classes=2)
    return model


# Segmentation models as medical-imaging teams build them (random weights, no download): MONAI's U-Nets
# upsample with transposed convolutions, segmentation_models_pytorch's with a nearest Resize sized at
# run time. Their outputs are maps; the audit's "predicted" target is the largest logit of the map.
SEGMENTATION_ARCHS: dict[str, Callable[[], nn.Module]] = {
    "monai_unet": _monai("UNet"),
    "monai_attention_unet": _monai("AttentionUnet"),
    "smp_unet": _smp_unet,
}


def _calibrate_batch_norms(model: nn.Module) -> None:
    """Batch norms take their running statistics from random images. With torchvision's random
    initialisation and eval-mode batch norms (mean 0, variance 1), activations shrink through
    mobilenet's and efficientnet's many depthwise layers at 32x32 until the outputs are 1e-10 and
    1e-14: every attribution ~0 and every verdict vacuous. Calibrated, every layer keeps unit scale
    as in a trained network."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the calibration batch
    model.train()
    with torch.no_grad():
        model(torch.randn(16, *IMAGE, generator=torch.Generator().manual_seed(12)))
    for norm in norms:
        norm.momentum = 0.1


def image_model(arch: str) -> nn.Module:
    torch.manual_seed(0)
    builders = {
        **IMAGE_ARCHS,
        **LIGHT_ARCHS,
        **DYNAMO_ARCHS,
        **SEGMENTATION_ARCHS,
        **{name: _timm(name) for name in TIMM_ARCHS},
    }
    model = builders[arch]()
    _calibrate_batch_norms(model)
    return model.eval()


def export_image_model(module: nn.Module, folder: Path, exporter: str, opset: int = 18) -> ZooModel:
    """``exporter``: ``dynamo`` (torch.onnx.export's default: model.onnx + model.onnx.data, the
    batch as ``Dim("batch")``), ``dynamo_auto`` (the same with ``Dim.AUTO``), ``dynamo_batch2``
    (``Dim("batch")`` from an example of two rows, which keeps ViT's batch dynamic),
    ``dynamo_defaults`` (no ``dynamic_shapes``: ``torch.onnx.export(model, (x,), path)``), ``legacy``
    (TorchScript-based exporter at ``opset``) or ``torchscript``. From this batch-1 example the
    dynamo exporter pins ViT's batch to 1 either way: ``Dim("batch")`` declares the input
    ``(1, 3, 32, 32)``; ``Dim.AUTO`` declares it ``(s77, 3, 32, 32)`` while its outputs and a
    Reshape inside keep 1 (torch 2.14); the CNNs keep a dynamic batch."""
    folder.mkdir(parents=True, exist_ok=True)
    x = torch.randn(1, *IMAGE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = module(x).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            path = folder / "model.pt"
            # check_trace off: ViT's traced graph names differ run to run (same computation).
            torch.jit.save(torch.jit.trace(module, x, check_trace=False), str(path))
        elif exporter in ("dynamo", "dynamo_auto", "dynamo_batch2"):
            path = folder / "model.onnx"
            batch = torch.export.Dim.AUTO if exporter == "dynamo_auto" else torch.export.Dim("batch")
            example = torch.cat([x, x.flip(0) * 0.5]) if exporter == "dynamo_batch2" else x
            torch.onnx.export(
                module, (example,), str(path), dynamo=True, input_names=["input"],
                dynamic_shapes=({0: batch},), external_data=True, verbose=False,
            )  # fmt: skip
        elif exporter == "dynamo_defaults":  # no dynamic axes: the batch of 1 written into the graph
            path = folder / "model.onnx"
            torch.onnx.export(module, (x,), str(path), dynamo=True, input_names=["input"], verbose=False)
        else:
            path = folder / "model.onnx"
            torch.onnx.export(
                module, (x,), str(path), dynamo=False, opset_version=opset, input_names=["input"],
                output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            )  # fmt: skip
    return ZooModel(path, {"": x.numpy()}, batch_axes={"input": 0}, expected=expected)


# -- models with several inputs, token inputs, fixed batches, older exporters ------------------


class _SpeechLike(nn.Module):
    """audio (N, 64), recurrent state (2, N, 16) with the batch on axis 1, sample rate as a scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 16, num_layers=2)
        self.head = nn.Linear(16, 3)

    def forward(
        self, audio: torch.Tensor, state: torch.Tensor, sr: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = audio * (sr.float() / 16000.0)
        seq = scaled.reshape(audio.shape[0], 4, 16).transpose(0, 1)
        out, (h, _) = self.lstm(seq, (state, torch.zeros_like(state)))
        return self.head(out[-1]), h


def speech_lstm(folder: Path) -> ZooModel:
    folder.mkdir(parents=True, exist_ok=True)
    module = _seeded(_SpeechLike(), 3)
    gen = torch.Generator().manual_seed(2)
    audio, state, sr = (
        torch.randn(1, 64, generator=gen),
        torch.randn(2, 1, 16, generator=gen),
        torch.tensor(16000),
    )
    with torch.no_grad():
        expected = module(audio, state, sr)[0].numpy()
    path = folder / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (audio, state, sr), str(path), dynamo=False, opset_version=17,
            input_names=["audio", "state", "sr"], output_names=["output", "stateN"],
            dynamic_axes={"audio": {0: "batch"}, "state": {1: "batch"}, "output": {0: "batch"}, "stateN": {1: "batch"}},
        )  # fmt: skip
    inputs = {"audio": audio.numpy(), "state": state.numpy(), "sr": np.array(16000, np.int64)}
    return ZooModel(
        path, inputs, "audio", {"audio": 0, "state": 1, "sr": None}, expected, players="windows:4"
    )


def fixed_batch_cnn(folder: Path) -> ZooModel:
    """A CNN exported without dynamic axes: input (1, 3, 32, 32), as many deployed models are."""
    folder.mkdir(parents=True, exist_ok=True)
    module = _seeded(
        nn.Sequential(
            nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
        ),
        4,
    )
    x = torch.randn(1, *IMAGE, generator=torch.Generator().manual_seed(5))
    both = torch.cat([x, -x])
    with torch.no_grad():
        expected = module(both).numpy()
    path = folder / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17, input_names=["image"])
    # Two samples through a model declared for one.
    return ZooModel(path, {"": both.numpy()}, batch_axes={"image": 0}, expected=expected)


def onehot_bytes(folder: Path, vocab: int = 16, length: int = 8, width: int = 6) -> ZooModel:
    """A JAX/TF-style byte classifier: int32 tokens, one-hot by Equal+Cast (no Gather), a Conv over
    the sequence and GlobalMaxPool, written with onnx.helper as those exporters write it."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(6)
    emb = rng.standard_normal((vocab, width)).astype(np.float32)
    conv = (rng.standard_normal((width, width, 3)) / 3).astype(np.float32)
    dense = rng.standard_normal((width, 2)).astype(np.float32)
    nodes = [
        oh.make_node("Unsqueeze", ["tokens", "axis2"], ["t3"], name="expand_dims"),
        oh.make_node("Equal", ["t3", "vocab_ids"], ["eq"], name="one_hot_eq"),
        oh.make_node("Cast", ["eq"], ["one_hot"], name="one_hot_cast", to=TensorProto.FLOAT),
        oh.make_node("MatMul", ["one_hot", "embedding"], ["e"], name="dense_embed"),
        oh.make_node("Transpose", ["e"], ["ncl"], name="to_ncl", perm=[0, 2, 1]),
        oh.make_node("Conv", ["ncl", "conv_w"], ["c"], name="conv1d", pads=[1, 1]),
        oh.make_node("Relu", ["c"], ["r"], name="relu"),
        oh.make_node("GlobalMaxPool", ["r"], ["p"], name="global_max_pool"),
        oh.make_node("Flatten", ["p"], ["f"], name="flatten"),
        oh.make_node("MatMul", ["f", "dense"], ["logits"], name="dense_out"),
    ]
    inits = [
        nh.from_array(np.array([2], np.int64), "axis2"),
        nh.from_array(np.arange(vocab, dtype=np.int32), "vocab_ids"),
        nh.from_array(emb, "embedding"),
        nh.from_array(conv, "conv_w"),
        nh.from_array(dense, "dense"),
    ]
    graph = oh.make_graph(
        nodes, "jax_bytes", [oh.make_tensor_value_info("tokens", TensorProto.INT32, ["N", length])],
        [oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2])], initializer=inits,
    )  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], producer_name="tf2onnx")
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, path)
    tokens = rng.integers(1, vocab, size=(1, length)).astype(np.int32)
    return ZooModel(
        path, {"tokens": tokens}, "", {"tokens": 0}, None, players="tokens", extra=("--baseline", "token:0")
    )


def paddle_style(folder: Path) -> ZooModel:
    """PaddlePaddle-style image classifier: opset 11, batch written as -1, weights in Constant nodes
    and listed as graph inputs, HardSigmoid, a softmax output."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((4, 3, 3, 3)) / 5).astype(np.float32)
    fc = rng.standard_normal((4, 5)).astype(np.float32)
    nodes = [
        oh.make_node("Constant", [], ["conv1_weights"], value=nh.from_array(w, "w")),
        oh.make_node(
            "Conv", ["image", "conv1_weights", "conv1_bias"], ["c"], name="conv1", pads=[1, 1, 1, 1]
        ),
        oh.make_node("HardSigmoid", ["c"], ["h"], name="hard_sigmoid", alpha=0.2, beta=0.5),
        oh.make_node("GlobalAveragePool", ["h"], ["p"], name="pool"),
        oh.make_node("Flatten", ["p"], ["f"], name="flatten"),
        oh.make_node("MatMul", ["f", "fc_weights"], ["z"], name="fc"),
        oh.make_node("Softmax", ["z"], ["prob"], name="softmax", axis=1),
    ]
    inputs = [
        oh.make_tensor_value_info("image", TensorProto.FLOAT, [-1, 3, 32, 32]),
        oh.make_tensor_value_info("conv1_bias", TensorProto.FLOAT, [4]),
        oh.make_tensor_value_info("fc_weights", TensorProto.FLOAT, [4, 5]),
    ]
    inits = [nh.from_array(np.full(4, 0.1, np.float32), "conv1_bias"), nh.from_array(fc, "fc_weights")]
    graph = oh.make_graph(
        nodes,
        "paddle",
        inputs,
        [oh.make_tensor_value_info("prob", TensorProto.FLOAT, [-1, 5])],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)], producer_name="PaddlePaddle")
    model.ir_version = 6
    path = folder / "model.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(8).standard_normal((1, *IMAGE)).astype(np.float32)
    return ZooModel(path, {"": x}, batch_axes={"image": 0}, extra=("--target", "prob:0"))


class _TinyBert(nn.Module):
    """A BERT-style encoder written as BERT's exports compute it: word + position + token-type
    embeddings, LayerNorm, explicit self-attention with an additive mask, GELU MLP, [CLS] pooler."""

    def __init__(
        self, vocab: int = 30, width: int = 16, heads: int = 2, layers: int = 2, length: int = 16
    ) -> None:
        super().__init__()
        self.heads = heads
        self.word = nn.Embedding(vocab, width)
        self.position = nn.Embedding(length, width)
        self.token_type = nn.Embedding(2, width)
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.norm1 = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            for _ in range(layers)
        )
        self.norm2 = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.pooler = nn.Linear(width, width)
        self.classifier = nn.Linear(width, 2)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        n, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device).unsqueeze(0)
        h = self.norm(self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids))
        bias = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        for qkv, out, norm1, mlp, norm2 in zip(
            self.qkv, self.out, self.norm1, self.mlp, self.norm2, strict=True
        ):
            q, k, v = qkv(h).reshape(n, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5) + bias
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, length, -1)
            h = norm1(h + out(context))
            h = norm2(h + mlp(h))
        return self.classifier(torch.tanh(self.pooler(h[:, 0])))


_BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _bert_batch(rows: int, length: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Token ids, an attention mask hiding the first row's last two tokens, and two segments."""
    ids = torch.randint(1, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(rows, length, dtype=torch.int64)
    mask[0, -2:] = 0
    types = torch.zeros(rows, length, dtype=torch.int64)
    types[:, length // 2 :] = 1
    return ids, mask, types


def _export_bert(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path,
    exporter: str,
    names: tuple[str, ...] = _BERT_INPUTS,
) -> None:
    """``dynamo`` (batch and sequence dynamic) or ``legacy`` (opset 17, dynamic axes); the inputs
    ``names``, one per tensor of ``example``."""
    names = tuple(names[: len(example)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
            torch.onnx.export(
                module, example, str(path), dynamo=True, input_names=list(names),
                output_names=["logits"], dynamic_shapes=({0: batch, 1: sequence},) * len(names), verbose=False,
            )  # fmt: skip
        else:
            torch.onnx.export(
                module, example, str(path), dynamo=False, opset_version=17, input_names=list(names),
                output_names=["logits"], dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names}, "logits": {0: "batch"}},
            )  # fmt: skip


def _bert_zoo(path: Path, example: tuple[torch.Tensor, ...], expected: np.ndarray) -> ZooModel:
    """The exported model with its example's first row, explained on the token ids."""
    names = _BERT_INPUTS[: len(example)]
    inputs = {name: t[:1].numpy() for name, t in zip(names, example, strict=True)}
    return ZooModel(
        path, inputs, "input_ids", dict.fromkeys(names, 0), expected, players="tokens",
        extra=("--baseline", "token:0"),
    )  # fmt: skip


def bert_like(folder: Path, length: int = 8) -> ZooModel:
    folder.mkdir(parents=True, exist_ok=True)
    module = _seeded(_TinyBert(), 9)
    example = _bert_batch(1, length, vocab=30, seed=10)
    with torch.no_grad():
        expected = module(*example).numpy()
    _export_bert(module, example, folder / "model.onnx", "legacy")
    return _bert_zoo(folder / "model.onnx", example, expected)


def hf_bert(
    folder: Path,
    exporter: str,
    length: int = 8,
    width: int = 32,
    layers: int = 2,
    vocab: int = 100,
    attention: str | None = None,
) -> ZooModel:
    """transformers' BertForSequenceClassification built from its config (random weights, no
    download; initializer_range 0.3 instead of 0.02, else the logits are ~0.01 and every verdict
    vacuous), exported as its users do: ``dynamo`` (torch.onnx.export's default exporter, from a
    two-row example) or ``legacy``. Heads of 64 floats (at least two) and a feed-forward twice the
    width (BERT's is four times) keep the default tiny; bench/suite.py's text section asks for more.
    ``attention``: transformers' attention implementation (None: its default, sdpa; ``eager`` writes
    the matrix products that onnxruntime's optimizer fuses into its Attention operator)."""
    from transformers import BertConfig, BertForSequenceClassification

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, num_attention_heads=max(2, width // 64),
        intermediate_size=2 * width, max_position_embeddings=max(64, length), num_labels=3,
        initializer_range=0.3, **({} if attention is None else {"attn_implementation": attention}),
    )  # fmt: skip
    module = BertForSequenceClassification(config).eval()
    example = _bert_batch(2, length, vocab=vocab, seed=11)
    with torch.no_grad():
        expected = module(*(t[:1] for t in example)).logits.numpy()
    _export_bert(module, example, folder / "model.onnx", exporter)
    return _bert_zoo(folder / "model.onnx", example, expected)


def hf_deberta(folder: Path, exporter: str, length: int = 8) -> ZooModel:
    """transformers' DebertaV2ForSequenceClassification (DeBERTa-v3's class) built from its config as
    :func:`hf_bert` is, on token ids and the attention mask (its token types are off by default):
    it multiplies attention weights and values over one axis of rows and heads, the weights
    reshaped by their own size in between."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = DebertaV2Config(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=64, num_labels=3, initializer_range=0.3,
    )  # fmt: skip
    module = DebertaV2ForSequenceClassification(config).eval()
    example = _bert_batch(2, length, vocab=100, seed=12)[:2]
    with torch.no_grad():
        expected = module(*(t[:1] for t in example)).logits.numpy()
    _export_bert(module, example, folder / "model.onnx", exporter)
    return _bert_zoo(folder / "model.onnx", example, expected)


def hf_bert_int8(folder: Path) -> ZooModel:
    """:func:`hf_bert` from the dynamo exporter, then quantized as CPU deployments quantize it:
    onnxruntime's ``quantize_dynamic`` (int8 weights; each MatMul's input quantized by
    DynamicQuantizeLinear with the range of the whole batch, which couples its rows)."""
    from dataclasses import replace

    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = hf_bert(folder / "fp32", "dynamo")
    target = folder / "model.onnx"
    quantize_dynamic(str(source.model), str(target), weight_type=QuantType.QInt8)
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    expected = session.run(None, source.inputs)[0]  # the quantized model's own output, one row
    return replace(source, model=target, expected=expected)


def hf_bert_ort_optimized(folder: Path) -> ZooModel:
    """:func:`hf_bert` with eager attention from the legacy exporter, then fused by onnxruntime's
    transformer optimizer as CPU deployments run it: onnxruntime's own contrib operators
    (com.microsoft.EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu), which the
    game runs as they are and the methods' graph as ONNX's own operators."""
    from dataclasses import replace

    from onnxruntime.transformers import optimizer

    source = hf_bert(folder / "fp32", "legacy", attention="eager")
    target = folder / "model.onnx"
    optimizer.optimize_model(
        str(source.model), model_type="bert", num_heads=2, hidden_size=32
    ).save_model_to_file(str(target))
    return replace(source, model=target)


CUSTOM: dict[str, Callable[[Path], ZooModel]] = {
    "speech_lstm": speech_lstm,
    "fixed_batch_cnn": fixed_batch_cnn,
    "onehot_bytes": onehot_bytes,
    "paddle_style": paddle_style,
    "bert_like": bert_like,
    "hf_bert_dynamo": lambda folder: hf_bert(folder, "dynamo"),
    "hf_bert_legacy": lambda folder: hf_bert(folder, "legacy"),
    "hf_bert_int8": hf_bert_int8,
    "hf_deberta_dynamo": lambda folder: hf_deberta(folder, "dynamo"),
    "hf_deberta_legacy": lambda folder: hf_deberta(folder, "legacy"),
    "hf_bert_ort_optimized": hf_bert_ort_optimized,
}
