"""The benchmark suite: xaudit against its peers and against the floor, ratios measured in one run.

    python -m bench.suite [--repeats 5] [--sections shapley,game,methods,audit,scale,images,text,startup,gpu]
                          [--audit-players 8,16]

Prints Markdown; the README's performance section is this output. Every ratio compares two
workloads timed alternately in this run (median of repeats), so machine load hits both alike.
Single thread (XAUDIT_THREADS=1) unless --threads says otherwise: the floor and xaudit get the
same threads. Sections:

- shapley: exact Shapley values from one batched game vs shap's ExactExplainer and Captum's
  ShapleyValues, same model, input and reference; max abs difference;
- game: the masking game (mask + infer + Moebius) vs raw onnxruntime on the same masked rows, same
  session options;
- methods: each gradient and rule method on the audit's sub-inputs vs a raw forward+backward of
  the same torch graph over the same rows (times the method's nominal passes: IG/EG steps), on the
  digits CNN, then the one-pass methods on torchvision's resnet18 and efficientnet_b0 at 64x64 and a
  ViT-Ti-sized VisionTransformer at 32x32;
- audit: the 14-method digits audit, wall time and peak memory, in a fresh process per size;
- threads: the 8-player audit with all CPUs' threads sleeping or spinning when idle, and with one
  thread, on the machine as it is and beside one busy process;
- scale: the audit at 64 and 256 players (five methods on a 1x16x16 CNN, sampled sets), from
  bench/scale.py's players section, each in a fresh process;
- images: audit calls at an image scale (resnet18 at 224x224, 64 sub-inputs of one sample; one row
  at 112x112) per method, each in a fresh process: wall time, peak memory and the longest wait for
  progress;
- text: forward calls and Gradient x Input's and Integrated Gradients' audit calls on a transformers
  BERT (width 256) at 128 and 512 tokens, each in a fresh process, with today's code, today's with
  subnormal floats kept, and the cuts of before: rows per call, peak memory, the longest wait for
  progress;
- startup: ``xaudit methods`` and the engine import, in fresh processes;
- gpu: only where a GPU is present (otherwise one line says why it was skipped): the digits audit on
  the CPU and on CUDA (verdicts, score differences, providers; TF32 off as xaudit runs and allowed
  as the libraries allow it by default), the game and methods sections on CUDA (onnxruntime's CUDA
  provider, torch CUDA; the game also against onnxruntime fed rows on the GPU, the methods with the
  peak GPU memory of an audit call), and the one-pass methods on resnet18 at 224x224.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]
ASSETS = ROOT / "workers" / "assets"

SECTIONS = ("shapley", "game", "methods", "audit", "threads", "scale", "images", "text", "startup", "gpu")
# Gradient and rule methods, with their nominal forward+backward passes per row (one constituent).
GRADIENT_METHODS: dict[str, Any] = {
    "gradient_x_input": 1,
    "grad_cam": 1,
    "integrated_gradients": "steps",
    "expected_gradients": "steps",
    "lrp_epsilon": 1,
    "lrp_alpha_beta": 1,
    "deep_taylor": 1,
    "deeplift_rescale": 1,
    "deepshap": 1,
    "deeplift_revealcancel": 1,
}


def _digits() -> tuple[bytes, Any, Any]:
    import numpy as np

    return (
        (ASSETS / "digits_cnn.onnx").read_bytes(),
        np.load(ASSETS / "digits_inputs.npy"),
        np.load(ASSETS / "digits_background.npy"),
    )


# --- shapley ---------------------------------------------------------------------------------------


def _shapley_row(n: int, repeats: int, with_captum: bool) -> str:
    import numpy as np
    import shap
    import torch

    from bench._common import paired_medians
    from tests.models import relu_mlp, to_onnx
    from workers.game import play
    from workers.models import load_model
    from workers.players import parse_players
    from workers.targets import parse_target

    module = relu_mlp(0, features=n, hidden=(32, 16))
    x = np.random.default_rng(n).normal(size=(1, n)).astype(np.float32)
    model = load_model(to_onnx(module, torch.from_numpy(x)), "onnx", "cpu")
    players = parse_players("features", x.shape[1:])
    target = parse_target("class:0")
    classes = np.zeros(1, dtype=np.int64)
    base = np.zeros_like(x)

    def ours() -> Any:
        return play(model, x, base, players, target, classes).shapley()[0]

    def f(z: Any) -> Any:
        return model.predict(z.astype(np.float32))[:, 0]

    explainer = shap.explainers.Exact(f, shap.maskers.Independent(base, max_samples=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = explainer(x).values[0]  # also the warm-up (numba compiles shap's kernels once)
        t_ours, t_shap = paired_medians(
            ours, lambda: explainer(x), max(1, repeats // 2) if n >= 14 else repeats
        )
    values = ours()
    diff = float(np.abs(values - theirs).max())
    exact = _shapley_float64(module, x[0], target=0)
    exact_diff = float(np.abs(values - exact).max())
    captum, captum_diff = "-", "-"
    if with_captum:
        from captum.attr import ShapleyValues

        t0 = time.perf_counter()
        # float64: its sum over n! permutations would otherwise accumulate float32 rounding.
        sv = ShapleyValues(module.double()).attribute(
            torch.from_numpy(x).double(),
            baselines=torch.from_numpy(base).double(),
            target=0,
            perturbations_per_eval=256,
        )
        t_captum = time.perf_counter() - t0
        captum_values = sv.detach().double().numpy()[0]
        captum_diff = (
            f"{float(np.abs(values - captum_values).max()):.1e} "
            f"(Captum vs exact: {float(np.abs(captum_values - exact).max()):.1e})"
        )
        captum = f"{t_captum:.2f} s ({t_captum / t_ours:,.0f}x)"
    return (
        f"| {n} | {t_ours * 1e3:.1f} ms | {t_shap * 1e3:.1f} ms | {t_shap / t_ours:.1f}x | {captum} | "
        f"{diff:.1e} | {captum_diff} | {exact_diff:.1e} |"
    )


def _shapley_float64(module: Any, x: Any, target: int) -> Any:
    """Shapley values by the textbook formula over all 2^n coalitions, the torch model in float64
    (zero reference): an independent check that needs neither the game nor a peer."""
    import copy
    import math

    import numpy as np
    import torch

    n = len(x)
    coalitions = (np.arange(2**n)[:, None] >> np.arange(n)[None]) & 1  # row k: the bits of k
    with torch.no_grad():
        model64 = copy.deepcopy(module).double()
        values = model64(torch.from_numpy(coalitions * x.astype(np.float64)))[:, target].numpy()
    size = coalitions.sum(1)
    weight = np.array([math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) for k in range(n)])
    phi = np.zeros(n)
    for i in range(n):
        without = np.flatnonzero(coalitions[:, i] == 0)  # S not containing i; S + i is k + 2^i
        phi[i] = (weight[size[without]] * (values[without + 2**i] - values[without])).sum()
    return phi


def section_shapley(repeats: int) -> None:
    print("## Exact Shapley values vs shap and Captum")
    print()
    print("ReLU MLP (n -> 32 -> 16 -> 3) as ONNX, one input, zero reference, target class 0. xaudit: one")
    print(
        "batched game over all 2^n subsets + Moebius transform. shap: `explainers.Exact` (same ONNX model)."
    )
    print(
        "Captum: `ShapleyValues` (all n! permutations, the torch model in float64, 256 perturbations per call), at n = 8 only."
    )
    print()
    print("Captum accumulates its permutations in float32 whatever the model's precision (its")
    print("`ShapleyValues` allocates its sums as `torch.float`); the last column checks xaudit against the")
    print("textbook formula over all 2^n coalitions with the torch model in float64.")
    print()
    print(
        "| players n | xaudit | shap Exact | shap / xaudit | Captum (Captum / xaudit) | diff vs shap | diff vs Captum | diff vs exact float64 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in (8, 12, 14, 16):
        print(_shapley_row(n, repeats, with_captum=n == 8), flush=True)
    print()


# --- game ------------------------------------------------------------------------------------------


def _game_row(grid: str, samples: int, repeats: int, device: str = "cpu") -> tuple[str, float]:
    import numpy as np
    import onnxruntime as ort
    import torch

    from bench._common import paired_medians
    from workers.device_budget import equal_parts
    from workers.game import play
    from workers.interactions import subsets_up_to
    from workers.models import load_model
    from workers.models.onnx_model import session_providers
    from workers.models.ort_options import session_options
    from workers.players import parse_players, subset_bits
    from workers.sub_inputs import masked_samples
    from workers.targets import parse_target

    data, inputs, _ = _digits()
    model = load_model(data, "onnx", device)
    x = inputs[:samples]
    players = parse_players(grid, x.shape[1:])
    target = parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    base = np.zeros_like(x)
    session = ort.InferenceSession(
        data,
        sess_options=session_options(),
        providers=session_providers(model.device),
    )
    name = session.get_inputs()[0].name
    subsets = subsets_up_to(players.n, players.n)
    masked = masked_samples(subset_bits(subsets, players.n), x, base, players)
    step = equal_parts(len(masked), model.rows_per_call(int(np.prod(x.shape[1:]))))  # the game's cut

    def raw() -> None:
        for start in range(0, len(masked), step):
            session.run(None, {name: masked[start : start + step]})

    t_raw, t_game = paired_medians(raw, lambda: play(model, x, base, players, target, classes), repeats)
    rows = len(masked)
    line = (
        f"| {players.n} | {samples} | {rows:,} | {step:,} | {rows / t_raw:,.0f} | {rows / t_game:,.0f} | "
        f"{t_raw / t_game:.0%} | {', '.join(session.get_providers()[:1])} |"
    )
    if model.takes_device_rows:  # the game's rows are built on the GPU: against ORT fed from there too
        on_device = torch.from_numpy(masked).to(model.device)
        t_bound, t_game = paired_medians(
            lambda: model.predict_rows(on_device),
            lambda: play(model, x, base, players, target, classes),
            repeats,
        )
        line += f" {rows / t_bound:,.0f} | {t_bound / t_game:.0%} |"
    return line, t_raw / t_game


def section_game(repeats: int, device: str = "cpu") -> None:
    print(f"## The game vs raw onnxruntime ({device})")
    print()
    print("Digits CNN (1x8x8), zero reference, every subset; raw: the same masked rows, prepared beforehand,")
    print(
        "through an `InferenceSession` with the same session options and rows per call. Game: mask + infer + Moebius."
    )
    print()
    if device == "cpu":
        print(
            "| players | samples | rows | rows per call | raw ORT rows/s | game rows/s | game / raw | provider |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
    else:  # the game builds its rows on the GPU and binds them there (workers/device_rows.py)
        print(
            "The game builds its rows on the GPU and binds them there (workers/device_rows.py); the last two"
        )
        print(
            "columns compare it with onnxruntime fed rows that already lie on the GPU, through the same binding."
        )
        print()
        print(
            "| players | samples | rows | rows per call | raw ORT rows/s | game rows/s | game / raw | provider "
            "| ORT, rows on the GPU, rows/s | game / that |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for grid, samples in (("grid:2x4", 4), ("grid:4x4", 1)):
        print(_game_row(grid, samples, repeats, device)[0], flush=True)
    print()
    print("Building the sub-inputs of every subset, chunk by chunk as the game calls the model: the")
    print("masked copy (`workers.sub_inputs.masked_samples`) against the sum of two half tables")
    print("(`ExactSubInputs`, tables built included); random inputs and references.")
    print()
    print(
        "| input | players | samples per call | rows per call | masked copy ms | half tables ms | speed-up |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for spec, shape, samples in (
        ("grid:2x4", (1, 8, 8), 4),
        ("grid:4x4", (1, 8, 8), 1),
        ("features", (16,), 1),
        ("grid:4x4", (3, 32, 32), 1),
        ("grid:2x4", (3, 224, 224), 1),
    ):
        print(_sub_input_row(spec, shape, samples, repeats), flush=True)
    print()


def _sub_input_row(spec: str, shape: tuple[int, ...], samples: int, repeats: int) -> str:
    import numpy as np

    from bench._common import paired_medians
    from workers.interactions import all_subset_bits
    from workers.models.base import rows_per_call
    from workers.players import parse_players
    from workers.sub_inputs import ExactSubInputs, masked_samples

    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, *shape)).astype(np.float32)
    base = rng.normal(size=x.shape).astype(np.float32)
    players = parse_players(spec, shape)
    bits = all_subset_bits(players.n)
    # as workers.game cuts calls: whole samples together when they fit, else one sample's chunks
    rows = rows_per_call(x[0].size)
    step = len(bits) if samples * len(bits) <= rows else rows

    def copy() -> None:
        for start in range(0, len(bits), step):
            masked_samples(bits[start : start + step], x, base, players)

    def tables() -> None:
        exact = ExactSubInputs.build(players.n, players, x, base)
        assert exact is not None
        for start in range(0, len(bits), step):
            exact.rows(start, min(start + step, len(bits)))

    t_copy, t_tables = paired_medians(copy, tables, repeats)
    size = "x".join(map(str, shape))
    return (
        f"| {size} | {players.n} | {samples} | {samples * step:,} | {t_copy * 1e3:.2f} | "
        f"{t_tables * 1e3:.2f} | {t_copy / t_tables:.1f}x |"
    )


# --- methods ---------------------------------------------------------------------------------------


def _plain_torch(data: bytes, device: Any) -> Any:
    """The ONNX model converted to torch as xaudit converts it, without its dense input gradients."""
    from workers.models.onnx_to_torch import onnx_to_torch
    from xaudit.contract.onnx_checks import parse_onnx

    graph = onnx_to_torch(parse_onnx(data)).to(device)
    for p in graph.parameters():
        p.requires_grad_(False)
    return graph


def _efficientnet_b0() -> tuple[bytes, Any, Any]:
    """torchvision's efficientnet_b0 built as _resnet18 builds resnet18: SiLU (Sigmoid x Mul in the
    export) and squeeze-and-excitation gates, which the LRP methods hold constant (docs/science.md
    5.8), and depthwise convolutions."""
    import numpy as np
    import torch

    from tests.models import to_onnx
    from tests.models.zoo.builders import image_model

    rng = np.random.default_rng(0)
    inputs, background = (rng.random((2, 3, 64, 64), dtype=np.float32) for _ in range(2))
    return to_onnx(image_model("efficientnet_b0"), torch.from_numpy(inputs[:1])), inputs, background


def _vit_ti() -> tuple[bytes, Any, Any]:
    """torchvision's VisionTransformer at ViT-Ti's size (12 layers, width 192, 3 heads, MLP 768;
    5.5M parameters) on 32x32 images in 8x8 patches (16 tokens and the class token), random weights
    with a random head (torchvision zeroes it), from the legacy exporter: layer norms, attention
    and GELU, which the LRP methods hold constant (docs/science.md 5.8)."""
    import numpy as np
    import torch
    from torch import nn
    from torchvision.models.vision_transformer import VisionTransformer

    from tests.models import to_onnx

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32, patch_size=8, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768, num_classes=10
    ).eval()
    nn.init.normal_(model.heads.head.weight, std=0.05)
    rng = np.random.default_rng(0)
    inputs, background = (rng.random((2, 3, 32, 32), dtype=np.float32) for _ in range(2))
    return to_onnx(model, torch.from_numpy(inputs[:1])), inputs, background


def _resnet18(size: int = 64) -> tuple[bytes, Any, Any]:
    """torchvision's resnet18 as the zoo tests build it (random weights, 10 classes, batch norms
    calibrated: tests/models/zoo/builders.py), at ``size`` x ``size`` (64 by default; the GPU section
    also takes 224) from the legacy exporter (opset 17): a model
    xaudit did not design, with residual sums, batch norms and a max-pool."""
    import numpy as np
    import torch

    from tests.models import to_onnx
    from tests.models.zoo.builders import image_model

    rng = np.random.default_rng(0)
    inputs, background = (rng.random((2, 3, size, size), dtype=np.float32) for _ in range(2))
    return to_onnx(image_model("resnet18"), torch.from_numpy(inputs[:1])), inputs, background


def _method_rows(
    data: bytes, x: Any, background: Any, grid: str, names: list[str], repeats: int, device: str
) -> None:
    """One table row per method in ``names``: its audit call on every sub-input of ``grid`` against
    the floor (one plain forward+backward of the same rows, times the method's passes per row)."""
    import numpy as np
    import torch

    from bench._common import paired_medians
    from workers.audit.subinputs import attribute_sub_inputs
    from workers.interactions import subsets_up_to
    from workers.methods import get_method
    from workers.models import load_model
    from workers.players import parse_players, subset_bits
    from workers.sub_inputs import masked_samples
    from workers.targets import parse_target
    from xaudit.contract.errors import NotApplicable

    model = load_model(data, "onnx", device)
    players = parse_players(grid, x.shape[1:])
    target = parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    base = np.zeros_like(x)
    subsets = subsets_up_to(players.n, players.n)
    masked = masked_samples(subset_bits(subsets, players.n), x, base, players)
    graph = _plain_torch(data, model.device)
    points = torch.from_numpy(masked).to(model.device)
    cls = torch.as_tensor(np.repeat(classes, len(subsets)), device=model.device)

    def floor() -> None:
        z = points.detach().requires_grad_(True)
        out = graph(z)
        torch.autograd.grad(out.gather(1, cls[:, None]).sum(), z)
        if model.device.type == "cuda":
            torch.cuda.synchronize()

    cuda = model.device.type == "cuda"
    if cuda:  # and the process's peak GPU memory during one audit call (workers/device_budget.py)
        print("| method | passes/row | method s | floor s | method / floor throughput | peak GPU GiB |")
        print("|---|---:|---:|---:|---:|---:|")
    else:
        print("| method | passes/row | method s | floor s | method / floor throughput |")
        print("|---|---:|---:|---:|---:|")
    for name in names:
        passes = GRADIENT_METHODS[name]
        method = get_method(name)
        # Bound as in a job with this background (Expected Gradients' steps follow from its size).
        params = method.bind(method.params_from({}), x, (base, background))
        n_passes = int(params["steps"]) if passes == "steps" else int(passes)
        refs = (
            base if method.capabilities.baseline != "distribution" else np.repeat(background[:1], len(x), 0)
        )

        def run(method: Any = method, refs: Any = refs, params: Any = params) -> None:
            attribute_sub_inputs(method, model, players, target, params, 0, x, refs, classes, subsets)

        try:
            t_floor, t_method = paired_medians(floor, run, max(1, repeats // 2) if n_passes > 1 else repeats)
            peak = ""
            if cuda:
                torch.cuda.reset_peak_memory_stats(model.device)
                run()
                peak = f" {torch.cuda.max_memory_allocated(model.device) / 2**30:.1f} |"
        except NotApplicable as exc:
            print(f"| {name} | {n_passes} | not applicable: {exc.reason} | | |{' |' if cuda else ''}")
            continue
        t_floor *= n_passes
        print(
            f"| {name} | {n_passes} | {t_method:.3f} | {t_floor:.3f} | {t_floor / t_method:.0%} |{peak}",
            flush=True,
        )
    print()


def section_methods(repeats: int, device: str = "cpu") -> None:
    print(f"## Gradient and rule methods in the audit vs raw forward+backward ({device})")
    print()
    print("Digits CNN, 8 players, 4 samples x 256 sub-inputs = 1,024 rows, one constituent")
    print(
        "(reference: zeros; distribution methods: one background sample). Floor: one forward+backward of the"
    )
    print("torch graph converted from the same ONNX model, with torch's own kernels (not xaudit's dense")
    print("input gradients for small convolutions, workers/models/dense_conv.py), over the same rows in one")
    print("batch, times the method's nominal passes per row.")
    print()
    data, inputs, background = _digits()
    _method_rows(data, inputs, background, "grid:2x4", list(GRADIENT_METHODS), repeats, device)
    one_pass = [name for name, passes in GRADIENT_METHODS.items() if passes == 1]
    for build, about in _ONE_PASS_MODELS:
        print(about)
        print()
        data, inputs, background = build()
        _method_rows(data, inputs, background, "grid:2x2", one_pass, repeats, device)


# Torchvision models for the one-pass methods (2x2 grid, 2 samples x 16 sub-inputs), each with what
# sets it apart.
_ONE_PASS_MODELS = (
    (
        _resnet18,
        "torchvision resnet18 (random weights, batch norms calibrated as in the zoo tests) at 64x64 from\n"
        "the legacy ONNX exporter, 2x2 grid players, 2 samples x 16 sub-inputs = 32 rows, the same floor;\n"
        "the one-pass methods (Integrated and Expected Gradients repeat Gradient x Input's pass).\n"
        "On graphs with residual sums RevealCancel takes W da in float64 (docs/science.md 5.8), where torch\n"
        "has no fast convolution kernel.",
    ),
    (
        _efficientnet_b0,
        "torchvision efficientnet_b0, built and exported the same way, the same rows and floor: SiLU and\n"
        "squeeze-and-excitation gates (LRP holds them constant), signed activations (alpha-beta and\n"
        "Deep Taylor multiply both parts of each), and DeepLIFT as Captum computes it (no rule for the gates),\n"
        "each reference evaluated once (workers/methods/_deeplift_hooks.py).",
    ),
    (
        _vit_ti,
        "A ViT-Ti-sized torchvision VisionTransformer at 32x32 (8x8 patches), random weights, from the\n"
        "legacy exporter, the same rows and floor: layer norms, attention and GELU, which LRP holds\n"
        "constant; DeepLIFT as Captum computes it (no rule for them), each reference evaluated once.",
    ),
)


# --- audit -----------------------------------------------------------------------------------------

_AUDIT_CHILD = """
import json, os, sys, time
import numpy as np
from bench._common import peak_resident_mb
from workers.audit import run_audit
from workers.prepare import prepare
from xaudit.contract.spec import FOURTEEN_METHODS, JobSpec
assets = sys.argv[1]; grid = sys.argv[2]; device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
tensors = {"inputs": np.load(assets + "/digits_inputs.npy"), "background": np.load(assets + "/digits_background.npy")}
model = open(assets + "/digits_cnn.onnx", "rb").read()
if os.environ.get("XAUDIT_BENCH_TF32"):  # the gpu section's comparison: TF32 allowed, as by default
    import workers.models.devices, workers.precision
    os.environ.pop("NVIDIA_TF32_OVERRIDE", None)
    workers.precision.CUDA_PROVIDER_OPTIONS["use_tf32"] = "1"
    workers.models.devices.full_float32_torch = lambda: None
# The libraries methods import lazily (a worker imports them once, not per job), timed apart.
i0 = time.process_time()
import captum.attr, torch.fx.experimental.symbolic_shapes  # IG quadrature, DeepLIFT fallback; autograd with grad_outputs
imports = time.process_time() - i0
t0 = time.perf_counter(); c0 = time.process_time()
report = run_audit(prepare(JobSpec(players=grid, device=device, methods=FOURTEEN_METHODS), model, "onnx", tensors)).report
wall = time.perf_counter() - t0; cpu = time.process_time() - c0
peak = peak_resident_mb()
methods = {m["name"]: (m["verdict"], m.get("seconds", 0.0)) for m in report["methods"]}
scores = {m["name"]: {c: v["score"] for c, v in (m.get("criteria") or {}).items()} for m in report["methods"]}
env = report["environment"]
print(json.dumps({"wall": wall, "cpu": cpu, "imports": imports, "peak_mb": peak, "methods": methods, "scores": scores,
                  "threads": env.get("threads"), "providers": env.get("execution_providers")}))
"""


def _child(code: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any] | str:
    """``code`` run in a fresh process with ``args``: the JSON of its last line, or the last line of
    its error."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env or _env(), cwd=ROOT
    )
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["no output"])[-1][:120]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _audit_in_child(grid: str, env: dict[str, str], device: str = "cpu") -> dict[str, Any] | str:
    """The digits audit in a fresh process: its figures, or the last line of its error."""
    return _child(_AUDIT_CHILD, [str(ASSETS), grid, device], env)


def section_threads() -> None:
    """The default thread policy (idle threads sleep) against spinning threads and one thread, on an
    idle machine and beside one other busy process: why spinning is the operator's choice."""
    cpus = os.cpu_count() or 1
    print("## Threads: sleeping vs spinning idle threads")
    print()
    print(f"The 8-player digits audit (as above) with {cpus} threads, idle threads sleeping (the default:")
    print(
        "`OMP_WAIT_POLICY=PASSIVE`, no onnxruntime spinning) or spinning (`XAUDIT_THREAD_SPIN=1`), and with"
    )
    print("one thread; on the machine as it is, then beside one busy process (a shell loop on one core).")
    print()
    print("| threads | idle threads | machine | wall s | CPU s | report's policy |")
    print("|---:|---|---|---:|---:|---|")
    base = {k: v for k, v in _env().items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    configs = (
        (cpus, "sleep", {"XAUDIT_THREADS": str(cpus)}),
        (cpus, "spin", {"XAUDIT_THREADS": str(cpus), "XAUDIT_THREAD_SPIN": "1"}),
        (1, "-", {"XAUDIT_THREADS": "1"}),
    )
    for competing in (False, True):
        busy = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if competing else None
        try:
            for threads, idle, extra in configs:
                r = _audit_in_child("grid:2x4", {**base, **extra})
                machine = "one busy process beside" if competing else "as it is"
                if isinstance(r, str):
                    print(f"| {threads} | {idle} | {machine} | failed: {r} | | |")
                    continue
                policy = r["threads"] or {}
                recorded = f"{policy.get('threads')} threads, spinning {policy.get('spinning')}"
                print(
                    f"| {threads} | {idle} | {machine} | {r['wall']:.1f} | {r['cpu']:.1f} | {recorded} |",
                    flush=True,
                )
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    print()


def section_audit(players: list[int]) -> None:
    grids = {8: "grid:2x4", 16: "grid:4x4", 64: "grid:8x8"}
    print("## The 14-method digits audit: time and peak memory")
    print()
    print("Digits CNN, 4 samples, 16 background samples, defaults (audit order 3), a fresh process per size;")
    print("peak memory is the process's maximum resident set (includes torch and onnxruntime, ~0.5 GB).")
    print("Wall and CPU time from the prepared job to the report; the libraries that methods import lazily")
    print(
        "(Captum for Integrated Gradients, torch.fx's symbolic shapes), which a worker imports once, are timed apart."
    )
    print()
    print(
        "| players | wall s | CPU s | lazy imports CPU s | peak MB | slowest methods (s) | verdicts (reliable) |"
    )
    print("|---:|---:|---:|---:|---:|---|---|")
    for n in players:
        grid = grids.get(n)
        if grid is None:
            print(f"| {n} | no digits grid for {n} players | | | | | |")
            continue
        r = _audit_in_child(grid, _env())
        if isinstance(r, str):
            print(f"| {n} | failed: {r} | | | | | |")
            continue
        slow = sorted(r["methods"].items(), key=lambda kv: -kv[1][1])[:3]
        slowest = ", ".join(f"{k} {v[1]:.1f}" for k, v in slow)
        reliable = ", ".join(k for k, v in r["methods"].items() if v[0] == "reliable")
        print(
            f"| {n} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['imports']:.1f} | {r['peak_mb']:.0f} | {slowest} "
            f"| {reliable} |",
            flush=True,
        )
    print()


# --- scale -----------------------------------------------------------------------------------------


def section_scale() -> None:
    """Time and peak memory at 64 and 256 players: bench/scale.py's players section, run from here."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale",
            "--sections",
            "players",
            "--players",
            "64,256",
            "--samples",
            "2",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"## Scale\n\nFailed: {tail[:200]}\n")
        return
    print(done.stdout)


# --- images ----------------------------------------------------------------------------------------

_IMAGES_CHILD = """
import json, sys, time
import numpy as np, torch
from bench._common import peak_resident_mb
from tests.models import to_onnx
from tests.models.zoo.builders import image_model
from workers.audit.subinputs import attribute_sub_inputs
from workers.interactions import subsets_up_to
from workers.methods import get_method
from workers.models import load_model
from workers.players import parse_players
from workers.targets import parse_target
name, params, size, rows = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
x = np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)
model = load_model(to_onnx(image_model("resnet18"), torch.from_numpy(x)), "onnx", "cpu")
players = parse_players("grid:2x4", x.shape[1:])
target = parse_target("predicted")
classes = target.resolve_classes(model.predict(x))
base = np.zeros_like(x)
method = get_method(name)
bound = method.bind(method.params_from(params), x, (base, base))
before = peak_resident_mb()
ticks = [time.perf_counter()]
attribute_sub_inputs(method, model, players, target, bound, 0, x, base, classes,
                     subsets_up_to(players.n, players.n)[:rows], tick=lambda: ticks.append(time.perf_counter()))
ticks.append(time.perf_counter())
print(json.dumps({"wall": ticks[-1] - ticks[0], "calls": len(ticks) - 2, "wait": max(np.diff(ticks)),
                  "before_mb": before, "peak_mb": peak_resident_mb()}))
"""

# Methods at an image scale (side, sub-inputs), with parameters that keep a row's passes few enough
# for a benchmark; the last row's passes reach 32 rows, where small convolutions may take dense
# input gradients (workers/models/dense_conv.py).
_IMAGE_METHODS = (
    ("gradient_x_input", {}, 224, 64),
    ("integrated_gradients", {"steps": 8}, 224, 64),
    ("grad_cam", {}, 224, 64),
    ("lrp_epsilon", {}, 224, 64),
    ("deeplift_rescale", {}, 224, 64),
    ("deeplift_revealcancel", {}, 224, 64),
    ("gradient_x_input", {}, 112, 128),
)


def section_images() -> None:
    """Audit calls on resnet18 at 224x224: what a user's machine must hold, and how long a job goes
    without progress (a call ends with a progress tick and a cancellation check)."""
    print("## Audit calls at 224x224: time, memory and progress (cpu)")
    print()
    print("torchvision resnet18 (as in the methods section) at 224x224 (last row: 112x112), 2x4 grid,")
    print("sub-inputs of one sample, one method per fresh process; peak: the process's maximum resident set")
    print("(before the call: the model, torch and onnxruntime); wait: the longest stretch without a")
    print("progress tick.")
    print()
    print(
        "| method | parameters | side | sub-inputs | calls | wall s | longest wait s | peak MB | before the call MB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, params, size, rows in _IMAGE_METHODS:
        r = _child(_IMAGES_CHILD, [name, json.dumps(params), str(size), str(rows)])
        shown = ", ".join(f"{k} {v}" for k, v in params.items()) or "defaults"
        if isinstance(r, str):
            print(f"| {name} | {shown} | {size} | {rows} | failed: {r} | | | | |")
            continue
        print(
            f"| {name} | {shown} | {size} | {rows} | {r['calls']} | {r['wall']:.1f} | {r['wait']:.1f} "
            f"| {r['peak_mb']:.0f} | {r['before_mb']:.0f} |",
            flush=True,
        )
    print()


# --- text ------------------------------------------------------------------------------------------

_TEXT_CHILD = """
import json, sys, tempfile, time
from pathlib import Path
import numpy as np
import workers.audit.subinputs as subinputs
import workers.methods._passes as passes
import workers.models.base as base
from bench._common import peak_resident_mb
from tests.models.zoo.builders import hf_bert
from workers.interactions import subsets_up_to
from workers.methods import get_method
from workers.denormals import current, flushing
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec
scope = flushing()  # held for the whole child (a dropped scope is closed, and puts the register back),
scope.__enter__()  # entered before hf_bert's torch work, as a job enters it (workers/denormals.py)
work, length, rows, old = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "old"
zoo = hf_bert(Path(tempfile.mkdtemp()), "legacy", length=length, width=256, layers=4, vocab=1000)
tensors = {"inputs": zoo.inputs["input_ids"], "input:attention_mask": zoo.inputs["attention_mask"],
           "input:token_type_ids": zoo.inputs["token_type_ids"]}
spec = JobSpec(players="windows:8", explain="input_ids", baseline="token:0", device="cpu")
prep = prepare(spec, zoo.model.read_bytes(), None, tensors)
if old:  # the cuts before: 256 rows per forward call, audit calls counted in token ids, passes in
    base.FORWARD_ELEMENTS = 2**40  # input elements alone
    passes.SAVED_BYTES = 2**40
    subinputs.attributed_elements = lambda method, model, inputs: int(np.prod(inputs.shape[1:]))
model = prep.model.for_sample(0)
before = peak_resident_mb()
ticks = [time.perf_counter()]
if work == "forward":  # as the game calls the model: a progress tick after each call
    per_call = model.rows_per_call(length) if not old else 256
    masked = np.repeat(prep.inputs[:1], rows, axis=0)
    for first in range(0, rows, per_call):
        model.predict(masked[first : first + per_call])
        ticks.append(time.perf_counter())
else:
    method = get_method(work)
    bound = method.bind(method.params_from({}), prep.inputs, (prep.baselines,))
    sample = subinputs.attributed_elements(method, prep.model, prep.inputs)
    per_call = min(1024, subinputs._elements_per_call(method, prep.model, bound) // sample)
    subinputs.attribute_sub_inputs(method, prep.model, prep.players, prep.target, bound, 0, prep.inputs,
                                   prep.baselines, prep.classes, subsets_up_to(prep.players.n, 3)[:rows],
                                   tick=lambda: ticks.append(time.perf_counter()))
ticks.append(time.perf_counter())
print(json.dumps({"wall": ticks[-1] - ticks[0], "calls": len(ticks) - 2, "per_call": per_call,
                  "wait": max(np.diff(ticks)), "before_mb": before, "peak_mb": peak_resident_mb(),
                  "denormals": current()}))
"""

# The rows of each work: today's code; today's with subnormal floats kept (XAUDIT_FLUSH_DENORMALS=0,
# workers/denormals.py); and the code before both, with the old cuts and subnormals kept.
_TEXT_CUTS = (("today", "today", "1"), ("today", "subnormals kept", "0"), ("old", "before", "0"))

# (work, tokens, rows or sub-inputs): forward calls of one sample's masked rows, and audit calls of
# Gradient x Input and Integrated Gradients (64 steps, its default), each run as _TEXT_CUTS says.
_TEXT_WORK = (
    ("forward", 128, 256),
    ("forward", 512, 128),
    ("gradient_x_input", 128, 256),
    ("integrated_gradients", 128, 16),
)


def section_text() -> None:
    """Forward and audit calls on a BERT at text scale: memory, speed and the wait for progress."""
    from workers.denormals import FLUSHED

    print("## Text scale: forward and audit calls on a BERT (cpu)")
    print()
    print("transformers' BertForSequenceClassification from its config (width 256, 4 layers, 4 heads,")
    print("feed-forward 512, random weights), legacy ONNX export; tokens in windows of 8; one fresh process")
    print("per row. Forward: one sample's masked rows through the model (ids, attention mask and segments).")
    print("Audit calls: Gradient x Input and Integrated Gradients (64 steps) on sub-inputs of the first")
    print("sets, at the embedding output. Before: 256 rows per forward call whatever their size, audit")
    print("calls counted in token ids, passes bounded by input elements alone, subnormal floats kept")
    print('(reproduced in the same run; "subnormals kept" is today\'s code with XAUDIT_FLUSH_DENORMALS=0).')
    print("Per call: rows per forward call, or sub-inputs per audit call.")
    print()
    print(
        "| work | tokens | rows | cut | per call | calls | wall s | longest wait s | peak MB | before the work MB |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for work, length, rows in _TEXT_WORK:
        for cut, label, flush in _TEXT_CUTS:
            env = {**_env(), "XAUDIT_FLUSH_DENORMALS": flush}
            r = _child(_TEXT_CHILD, [work, str(length), str(rows), cut], env)
            if isinstance(r, str):
                print(f"| {work} | {length} | {rows} | {label} | failed: {r} | | | | | |")
                continue
            if flush == "1" and r["denormals"] != FLUSHED:  # the row is not what it says
                label += f" ({r['denormals']})"
            print(
                f"| {work} | {length} | {rows} | {label} | {r['per_call']} "
                f"| {r['calls']} | {r['wall']:.1f} | {r['wait']:.1f} | {r['peak_mb']:.0f} | {r['before_mb']:.0f} |",
                flush=True,
            )
    print()


# --- startup ---------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "proto"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def section_startup(repeats: int) -> None:
    from bench.startup import print_table

    print("## Start-up")
    print()
    print_table(repeats)
    leaked = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, workers.audit.runner, workers.methods.lrp, workers.methods._zennit, "
            "workers.models.onnx_to_torch; print(any(m.startswith('torchvision') for m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
    ).stdout.strip()
    print(f"\ntorchvision imported by the engine: {leaked}")
    print()


# --- gpu -------------------------------------------------------------------------------------------


def section_gpu(repeats: int) -> None:
    import onnxruntime as ort
    import torch

    print("## GPU")
    print()
    available = ort.get_available_providers()
    if not torch.cuda.is_available() or "CUDAExecutionProvider" not in available:
        print(
            f"Skipped: no usable GPU here (torch.cuda.is_available() = {torch.cuda.is_available()}, "
            f"onnxruntime providers = {available})."
        )
        print()
        return
    print(
        f"Device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, onnxruntime {ort.__version__}, "
        f"providers available: {available}."
    )
    print()
    _gpu_verdicts()
    section_game(repeats, "cuda")
    section_methods(repeats, "cuda")
    print(
        "At a GPU's scale: torchvision resnet18 at 224x224, 2x4 grid, 2 samples x 256 sub-inputs = 512 rows."
    )
    print()
    data, inputs, background = _resnet18(224)
    one_pass = [name for name, passes in GRADIENT_METHODS.items() if passes == 1]
    _method_rows(data, inputs, background, "grid:2x4", one_pass, repeats, "cuda")


def _gpu_verdicts() -> None:
    """The digits audit on the CPU and on CUDA, each in a fresh process: the same verdicts, scores
    that differ only by float32 rounding, and the providers the report says it used (ORT falls back
    to the CPU silently). Against it, the same audit with the libraries' TF32 defaults, which
    workers/precision.py turns off (docs/science.md 5.4)."""
    print("The 14-method digits audit on the CPU and on CUDA, a fresh process each; score difference: the")
    print("largest |CUDA score - CPU score| over methods and criteria (tolerances are 0.05). TF32: off is")
    print("xaudit's setting (workers/precision.py); on allows it as the libraries do by default (every other")
    print("setting as xaudit makes it), for comparison.")
    print()
    print(
        "| players | device | TF32 | wall s | providers in the report | verdicts as on the CPU "
        "| largest score difference |"
    )
    print("|---:|---|---|---:|---|---|---:|")
    for players, grid in ((8, "grid:2x4"), (16, "grid:4x4")):
        cpu = _audit_in_child(grid, _env(), "cpu")
        if isinstance(cpu, str):
            print(f"| {players} | cpu | | failed: {cpu} | | | |")
            continue
        providers = ", ".join(cpu["providers"])
        print(f"| {players} | cpu | - | {cpu['wall']:.1f} | {providers} | - | - |", flush=True)
        for tf32, extra in (("off", {}), ("on", {"XAUDIT_BENCH_TF32": "1"})):
            gpu = _audit_in_child(grid, {**_env(), **extra}, "cuda")
            if isinstance(gpu, str):
                print(f"| {players} | cuda | {tf32} | failed: {gpu} | | | |")
                continue
            print(f"| {players} | cuda | {tf32} | {gpu['wall']:.1f} | {_compared(cpu, gpu)} |", flush=True)
    print()


def _compared(cpu: dict[str, Any], gpu: dict[str, Any]) -> str:
    """A GPU audit's providers, verdicts and largest score difference against the CPU's."""
    differ = [m for m, (verdict, _) in gpu["methods"].items() if cpu["methods"][m][0] != verdict]
    worst = max(
        abs(value - cpu["scores"][m][c])
        for m, criteria in gpu["scores"].items()
        for c, value in criteria.items()
        if value is not None and cpu["scores"][m].get(c) is not None
    )
    changes = ", ".join(f"{m} {cpu['methods'][m][0]}->{gpu['methods'][m][0]}" for m in differ)
    return f"{', '.join(gpu['providers'])} | {'all 14' if not differ else 'differ: ' + changes} | {worst:.2e}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--audit-players", default="8,16")
    parser.add_argument(
        "--threads", type=int, default=1, help="compute threads for xaudit and the floors (default 1)"
    )
    args = parser.parse_args()
    os.environ["XAUDIT_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    from workers.hardware import processors
    from workers.threads import current

    policy = current()
    cpu = processors("cpu")
    print("# xaudit benchmark suite")
    print()
    print(
        f"{cpu['cpu']} ({cpu['cpu_kernels']} kernels), {os.cpu_count()} CPUs; threads: {policy.threads} "
        f"({policy.source}); repeats: {args.repeats} (median, workloads interleaved); "
        f"load average at start: {os.getloadavg()[0]:.1f}"
    )
    print()
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    for section in chosen:
        if section not in SECTIONS:
            raise SystemExit(f"unknown section {section!r} (use {', '.join(SECTIONS)})")
    started = time.perf_counter()
    for section in chosen:
        if section == "shapley":
            section_shapley(args.repeats)
        elif section == "game":
            section_game(args.repeats)
        elif section == "methods":
            section_methods(args.repeats)
        elif section == "audit":
            section_audit([int(p) for p in args.audit_players.split(",") if p.strip()])
        elif section == "threads":
            section_threads()
        elif section == "scale":
            section_scale()
        elif section == "images":
            section_images()
        elif section == "text":
            section_text()
        elif section == "startup":
            section_startup(args.repeats)
        elif section == "gpu":
            section_gpu(args.repeats)
    print(
        f"_Suite ran {time.perf_counter() - started:.0f} s; load average at end: {os.getloadavg()[0]:.1f}._"
    )


if __name__ == "__main__":
    main()
