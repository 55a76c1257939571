"""The whole model zoo, audited at every exporter and opset, with the ONNX operator coverage.

CI (tests/models/zoo) audits every torchvision architecture for one exporter set at few quadrature steps;
this runs the full matrix at the methods' default parameters, which takes far longer than CI
allows (tens of minutes on 2 cores), and prints, per model: export and audit seconds, how many
methods were judged and which were not applicable (and why, grouped), plus the operators of all
exported graphs with whether onnx2torch (with workers/models/onnx_converters.py) converts them.

    python -m bench.zoo [--archs resnet18,vit_b_16] [--exporters dynamo,legacy17,torchscript]

vit_b_16 is torchvision's real one (86M parameters); ``--archs vit_tiny`` gives its class at 2 layers
of width 32. Besides the default exporters, ``dynamo_auto`` (``Dim.AUTO``), ``dynamo_batch2`` (a
two-row example) and ``dynamo_defaults`` (no ``dynamic_shapes``) show what the dynamo exporter does to
a model's batch (README, "auditing your own model").
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import onnx

from clients.cli.main import main as xaudit
from tests.models.zoo.builders import CUSTOM, IMAGE_ARCHS, export_image_model, image_model

EXPORTERS = ("dynamo", "legacy17", "legacy18", "legacy19", "legacy20", "legacy21", "torchscript")
# The dynamo exporter's other ways with the batch: Dim.AUTO, a two-row example, and no dynamic_shapes.
_EXTRA_DYNAMO = ("dynamo_auto", "dynamo_batch2", "dynamo_defaults")


def _operators(path: Path, found: dict[str, set[str]]) -> None:
    from workers.models.onnx_to_torch import unconvertible_nodes

    model = onnx.load(path, load_external_data=False)
    missing = {m.split("'")[1] for m in unconvertible_nodes(model)}
    for node in model.graph.node:
        found.setdefault(node.op_type, set()).add(path.parent.name)
        if node.op_type in missing:
            found.setdefault("!" + node.op_type, set()).add(path.parent.name)


def _audit(args: list[str], out: Path) -> tuple[float, Counter[str], dict[str, str]]:
    started = time.perf_counter()
    assert xaudit(["audit", *args, "--methods", "all", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    verdicts = Counter(m["verdict"] for m in report["methods"])
    reasons = {m["name"]: m["reason"] for m in report["methods"] if m["verdict"] == "not_applicable"}
    return time.perf_counter() - started, verdicts, reasons


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default=",".join(IMAGE_ARCHS))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--custom", default=",".join(CUSTOM))
    opts = parser.parse_args()
    unknown = {e for e in opts.exporters.split(",") if e} - set(EXPORTERS) - set(_EXTRA_DYNAMO)
    if unknown:
        parser.error(
            f"unknown exporter(s) {', '.join(sorted(unknown))}; choose from {', '.join((*EXPORTERS, *_EXTRA_DYNAMO))}"
        )
    root = Path(tempfile.mkdtemp(prefix="xaudit-zoo-"))
    operators: dict[str, set[str]] = {}
    rows = []
    jobs = [(a, e) for a in opts.archs.split(",") if a for e in opts.exporters.split(",") if e]
    jobs += [(c, "custom") for c in opts.custom.split(",") if c]
    for name, exporter in jobs:
        folder = root / f"{name}-{exporter}"
        started = time.perf_counter()
        if exporter == "custom":
            zoo = CUSTOM[name](folder)
        else:
            kind, opset = (
                (exporter[:6], int(exporter[6:])) if exporter.startswith("legacy") else (exporter, 18)
            )
            zoo = export_image_model(image_model(name), folder, kind, opset)
        export_s = time.perf_counter() - started
        if zoo.model.suffix == ".onnx":
            _operators(zoo.model, operators)
        seconds, verdicts, reasons = _audit(zoo.cli_args(folder), folder / "report.json")
        why = Counter(r.split(" (")[0][:70] for r in reasons.values())
        rows.append((name, exporter, export_s, seconds, verdicts, why))
        split = "/".join(str(verdicts[v]) for v in ("reliable", "unreliable", "inconclusive"))
        print(f"{name:20} {exporter:11} export {export_s:6.1f}s audit {seconds:6.1f}s "
              f"judged {sum(verdicts.values()) - verdicts['not_applicable']:2} (r/u/i {split}) "
              f"n/a {verdicts['not_applicable']:2}  "
              + "; ".join(f"{n}x {r}" for r, n in why.most_common()), flush=True)  # fmt: skip
    print("\noperator coverage (torch conversion) over the exported graphs:")
    for op in sorted(k for k in operators if not k.startswith("!")):
        missing = operators.get("!" + op)
        status = f"NO CONVERTER in {len(missing)} graph(s)" if missing else "converted"
        print(f"  {op:28} {status:32} used by {len(operators[op])} graph(s)")


if __name__ == "__main__":
    main()
