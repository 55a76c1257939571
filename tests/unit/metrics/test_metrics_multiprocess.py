"""Multiprocess mode: values recorded in forked children are served, merged, by the parent.

Multiprocess mode is process-global in prometheus_client, so this runs in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os, sys, urllib.request
    from workers import metrics as wm

    directory = wm.use_multiprocess_dir(sys.argv[1])
    (directory / "counter_999999.db").write_bytes(b"")  # a previous run's file: must be removed
    port = wm.serve_worker_metrics(0, addr="127.0.0.1")
    assert not (directory / "counter_999999.db").exists()

    for k in range(2):  # two pool children, as Celery's prefork pool forks them
        pid = os.fork()
        if pid == 0:
            wm._pool_child_started()
            wm.count_forward(100, batches=4)
            wm.observe_method("saliency", 0.5)
            wm.record_verdict("saliency", "unreliable")
            os._exit(0)
        os.waitpid(pid, 0)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    print(text)
    """
)


def test_children_values_are_merged_by_the_parent(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "prom")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = set(done.stdout.splitlines())
    assert "xaudit_model_forward_passes_total 8.0" in lines
    assert "xaudit_model_forward_samples_total 200.0" in lines
    assert 'xaudit_method_compute_seconds_count{method="saliency"} 2.0' in lines
    assert 'xaudit_audit_verdicts_total{method="saliency",outcome="unreliable"} 2.0' in lines
    assert 'xaudit_worker_device_info{device="cpu",name="cpu"} 1.0' in lines


SANDBOX_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np, torch
    from workers import metrics as wm
    from workers.sandbox import run_sandboxed
    from xaudit.contract.spec import JobSpec
    from tests.models import MLP_FEATURES, relu_mlp, to_torchscript

    wm.use_multiprocess_dir(sys.argv[1])
    wm.activate(wm.WorkerMetrics(wm.CollectorRegistry()))  # the worker's; the sandbox reports, it records
    model = to_torchscript(relu_mlp(), torch.zeros(2, MLP_FEATURES))
    x = np.random.default_rng(0).standard_normal((2, MLP_FEATURES)).astype(np.float32)
    spec = JobSpec(kind="attribution", methods=("occlusion_1",), players="features", device="cpu")
    result = run_sandboxed(spec, model, "torchscript", {"inputs": x})
    assert set(result.attributions) == {"occlusion_1"}
    for family in wm.multiprocess_registry().collect():
        for s in family.samples:
            print(s.name, s.labels, s.value)
    """
)


def test_sandboxed_torchscript_jobs_are_counted(tmp_path: Path) -> None:
    # The sandbox is a fresh, confined interpreter that can write no file: it sends its metric
    # updates with its result and the worker records them in its multiprocess directory.
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", SANDBOX_SCRIPT, str(tmp_path / "prom")],
        capture_output=True, text=True, timeout=300, cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "xaudit_method_compute_seconds_count {'method': 'occlusion_1'} 1.0" in done.stdout
    forward = [
        line for line in done.stdout.splitlines() if line.startswith("xaudit_model_forward_samples_total")
    ]
    assert forward and float(forward[0].split()[-1]) >= 2 * 7
