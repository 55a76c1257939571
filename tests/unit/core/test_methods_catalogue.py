from __future__ import annotations

from pathlib import Path

from workers.methods import ALL_METHODS
from workers.methods.catalogue import methods_markdown


def test_docs_list_every_method_as_the_code_does() -> None:
    text = methods_markdown()
    assert all(f"| `{name}` |" in text for name in ALL_METHODS)
    docs = Path(__file__).resolve().parents[3] / "docs" / "methods.md"
    assert docs.read_text() == text, "docs/methods.md is stale: run `xaudit methods > docs/methods.md`"


def test_xaudit_methods_imports_no_torch():
    import subprocess
    import sys

    code = (
        "import sys; from clients.cli.main import main; main(['methods']); "
        "assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert "| `shapley_value` |" in run.stdout
