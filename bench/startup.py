"""How fast the CLI answers before any work: ``--help``, ``methods`` and argument errors.

    python -m bench.startup [--repeats 7]

Each command runs in a fresh process (median of ``--repeats``); wall seconds and CPU seconds (user +
system, robust to a loaded machine) are printed as a Markdown table, with the interpreter's own
start-up and the engine import (torch, onnxruntime) as references in the same run. The README's
start-up figure is this output. Every command here must stay under 1 s of CPU: they are answered
before torch is imported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_MEASURED = """
import resource, runpy, sys
sys.argv = sys.argv[1:]
try:
    if sys.argv[0] == "-c":
        exec(compile(sys.argv[1], "<cmd>", "exec"))
    else:
        runpy.run_module(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
finally:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM: this program's own peak (ru_maxrss would include the forked parent's pages).
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
    print(f"@@ {usage.ru_utime + usage.ru_stime} {'torch' in sys.modules} {int(hwm) / 1024}", file=sys.stderr)
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "proto"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def timed(args: list[str], repeats: int) -> tuple[float, float, bool, float]:
    """Median wall and CPU seconds of ``python args`` in fresh processes, whether torch was imported,
    and the peak resident memory (MB)."""
    walls, cpus, torch, peak = [], [], False, 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _MEASURED, *args], capture_output=True, text=True, env=_env(), cwd=ROOT
        )
        walls.append(time.perf_counter() - t0)
        line = [x for x in done.stderr.splitlines() if x.startswith("@@ ")][-1]
        cpus.append(float(line.split()[1]))
        torch = torch or line.split()[2] == "True"
        peak = max(peak, float(line.split()[3]))
    return statistics.median(walls), statistics.median(cpus), torch, peak


def print_table(repeats: int) -> None:
    """The start-up table (also the start-up section of bench/suite.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        text_model = Path(tmp) / "notes.pt"
        text_model.write_text("not a model\n")
        inputs = ROOT / "workers" / "assets" / "digits_inputs.npy"
        model = ROOT / "workers" / "assets" / "digits_cnn.onnx"
        cli = ["clients.cli.main"]
        audit = [*cli, "audit", "--model", str(model), "--input", str(inputs), "--out", f"{tmp}/r.json"]
        cases = (
            ("`python -c pass` (the interpreter's floor)", ["-c", "pass"]),
            ("`xaudit --help`", [*cli, "--help"]),
            ("`xaudit methods`", [*cli, "methods"]),
            ("`xaudit audit` (missing arguments)", [*cli, "audit"]),
            ("`xaudit audti` (did you mean)", [*cli, "audti"]),
            ("`--methods shapley_vlaue` (did you mean)", [*audit, "--methods", "shapley_vlaue"]),
            ("`--audit-order 0` (refused)", [*audit, "--audit-order", "0"]),
            (
                "`--input missing.npy` (file not found)",
                [*audit[:4], "--input", "missing.npy", "--out", "r.json"],
            ),
            ("a text file named `.pt`", [*cli, "audit", "--model", str(text_model), *audit[4:]]),
            ("engine import, for reference", ["-c", "import workers.audit, workers.models.onnx_model"]),
        )
        print(f"Fresh processes, median of {repeats}; CPU = user + system seconds of the process.")
        print()
        print("| command | wall s | CPU s | peak MB | imports torch |")
        print("|---|---:|---:|---:|---|")
        for label, args in cases:
            wall, cpu, torch, peak = timed(args, repeats)
            print(
                f"| {label} | {wall:.2f} | {cpu:.2f} | {peak:.0f} | {'yes' if torch else 'no'} |", flush=True
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    print_table(parser.parse_args().repeats)


if __name__ == "__main__":
    main()
