"""A failed TorchScript -> ONNX export does not print the model's graph into our output."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import torch

from workers.models.native_output import captured_native_output

ROOT = Path(__file__).resolve().parents[3]


def test_native_writes_are_captured_and_the_streams_restored() -> None:
    with captured_native_output() as printed:
        os.write(1, b"from C to stdout\n")
        os.write(2, b"from C to stderr\n")
    assert printed == ["from C to stdout\nfrom C to stderr\n"]
    probe = subprocess.run(
        [sys.executable, "-c", "import os; os.write(1, b'ok')"], capture_output=True, timeout=60
    )
    assert probe.stdout == b"ok"


class _Attention(torch.nn.Module):
    """Traced multi-head attention: the legacy exporter fails on it (transpose of unknown rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.attention(x, x, x, need_weights=False)
        return self.head(y[:, 0])


def test_a_failed_export_keeps_the_graph_out_of_stdout(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 5, 8)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(_Attention().eval(), x, check_trace=False), buffer)  # type: ignore[no-untyped-call]
    (tmp_path / "attention.pt").write_bytes(buffer.getvalue())
    code = (
        "import sys, numpy as np\n"
        "from workers.models import load_model\n"
        "model = load_model(open(sys.argv[1], 'rb').read(), 'torchscript', 'cpu')\n"
        "model.check_sample(np.ones((1, 5, 8), np.float32))\n"
        "try:\n"
        "    model.torch_hookable('lrp_epsilon')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "attention.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.stdout == "NotApplicable\n", done.stdout[:500]
    assert "Torch IR graph" not in done.stderr
