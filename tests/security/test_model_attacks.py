"""Attacks by a tenant's model on the worker's host, each run for real (docs/security.md).

Every test first shows the attack works where the defence is absent (a control in the same test:
a plain interpreter, an unconfined process), then that the sandbox refuses or contains it. The
models are real TorchScript / ONNX files; the child processes are the product's own
(:func:`workers.sandbox.run_sandboxed`), with no test hook in them.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models import MLP_FEATURES, relu_mlp, to_torchscript
from tests.security._attacks import file_reader_torchscript, file_writer_torchscript, onnx_loop_bomb
from workers.confine import landlock_abi
from workers.models import load_model
from workers.sandbox import SandboxLimits, run_sandboxed
from xaudit.contract.errors import Cancelled, InvalidInput, InvalidModel
from xaudit.contract.spec import JobSpec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SPEC = JobSpec(kind="attribution", players="features", methods=("gradient_x_input",), device="cpu")
X = np.random.default_rng(0).standard_normal((2, MLP_FEATURES)).astype(np.float32)
needs_landlock = pytest.mark.skipif(not landlock_abi(), reason="this kernel has no Landlock")
# Both ways of starting a model process: forked by the zygote (the default) and spawned per job.
MODES = [pytest.param("1", id="forkserver"), pytest.param("0", id="spawn")]


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "signing_key.pem"
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\nTEST-ONLY\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("forkserver", MODES)
def test_a_model_reading_the_signing_key_is_refused_naming_the_operator(
    key_file: Path, monkeypatch: pytest.MonkeyPatch, forkserver: str
) -> None:
    monkeypatch.setenv("XAUDIT_SANDBOX_FORKSERVER", forkserver)
    model = file_reader_torchscript(str(key_file), 8)
    # Control: loaded without the check, the scripted model returns the key's bytes as its output.
    leaked = torch.jit.load(io.BytesIO(model))(torch.from_numpy(X))
    assert bytes(leaked[0].to(torch.uint8).tolist()) == key_file.read_bytes()[:8]
    with pytest.raises(InvalidInput, match=r"aten::from_file"):  # INVALID_ARGUMENT, as a bad model
        run_sandboxed(SPEC, model, "torchscript", {"inputs": X})
    with pytest.raises(InvalidModel, match=r"aten::from_file"):  # the local CLI's path too
        load_model(model, "torchscript", "cpu")


def test_a_model_writing_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "planted.pt"
    model = file_writer_torchscript(str(target))
    torch.jit.load(io.BytesIO(model))(torch.from_numpy(X))  # control: it writes
    assert target.exists()
    target.unlink()
    with pytest.raises(InvalidInput, match=r"aten::save"):
        run_sandboxed(SPEC, model, "torchscript", {"inputs": X})
    assert not target.exists()


_SHADOW = "open({marker!r}, 'w').write('imported')\nfrom importlib import import_module\n"


def test_a_planted_module_is_never_imported_by_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The escalation: a json.py where the next model process starts (its working directory, or a
    # PYTHONPATH entry) runs before any limit applies.
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "marker"
    for name in ("json", "pickle", "numpy", "workers"):
        (planted / f"{name}.py").write_text(_SHADOW.format(marker=str(marker)))
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", f"{planted}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("XAUDIT_SANDBOX_PREWARM", "0")  # a child started now, from here
    control = subprocess.run([sys.executable, "-c", "import json"], cwd=planted, timeout=60)
    assert control.returncode == 0 and marker.exists(), "control: a plain interpreter imports it"
    marker.unlink()
    model = to_torchscript(relu_mlp(1), torch.zeros(2, MLP_FEATURES))
    result = run_sandboxed(SPEC, model, "torchscript", {"inputs": X})
    assert set(result.attributions) == {"gradient_x_input"}
    assert not marker.exists(), "the sandbox imported a planted module"


_PROBE = r"""
import json, os, socket, sys
sys.path.extend(sys.argv[2:])
from workers.confine import confine

def attempts():
    out = {}
    for label, path in (("key", sys.argv[1]), ("environ", f"/proc/{os.getppid()}/environ")):
        try:
            with open(path, "rb") as f:
                out[label] = "SECRET" if b"s3cret" in f.read() or label == "key" else "read"
        except OSError as exc:
            out[label] = type(exc).__name__
    try:
        open(os.path.join(os.path.dirname(sys.argv[1]), "planted"), "w").close()
        out["write"] = "written"
    except OSError as exc:
        out["write"] = type(exc).__name__
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=2)
        out["connect"] = "connected"
    except OSError as exc:
        out["connect"] = type(exc).__name__
    return out

before = attempts()
confinement = confine()
print(json.dumps({"before": before, "after": attempts(), "how": confinement.describe()}))
"""


@needs_landlock
def test_confinement_denies_the_key_the_parents_environ_writes_and_network(key_file: Path) -> None:
    # The layer under the operator allow-list: whatever code runs in the child after confine().
    # Its parent holds a secret in its environment, as a worker holds its token.
    parent = (
        "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-I', '-c', sys.argv[1], "
        "*sys.argv[2:]]))"
    )
    env = {"PATH": os.defpath, "XAUDIT_WORKER_TOKEN": "s3cret"}
    done = subprocess.run(
        [sys.executable, "-c", parent, _PROBE, str(key_file), str(ROOT)],
        env=env, capture_output=True, text=True, timeout=120, cwd=key_file.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # Without the confinement, all of it works (the connect is refused by the port, not by us).
    assert seen["before"]["key"] == "SECRET" and seen["before"]["environ"] == "SECRET"
    assert seen["before"]["write"] == "written"
    assert seen["after"] == {
        "key": "PermissionError", "environ": "PermissionError", "write": "PermissionError",
        "connect": seen["after"]["connect"],
    }, seen  # fmt: skip
    assert seen["after"]["connect"] in ("PermissionError", "OSError"), seen  # EACCES, or no route
    assert "landlock ABI" in seen["how"]


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _model_processes() -> set[int]:
    """This process's descendants that have no child: a spawned model process is a child, a forked
    one a grandchild (its parent, the zygote, is not a model process)."""
    parents = _parents()
    tree = {os.getpid()}
    while grown := {pid for pid, parent in parents.items() if parent in tree} - tree:
        tree |= grown
    return {pid for pid in tree - {os.getpid()} if pid not in parents.values()}


@pytest.mark.parametrize("forkserver", MODES)
def test_cancelling_kills_a_spinning_onnx_model_whose_process_holds_no_secret(
    monkeypatch: pytest.MonkeyPatch, forkserver: str
) -> None:
    monkeypatch.setenv("XAUDIT_WORKER_TOKEN", "s3cret")
    monkeypatch.setenv("XAUDIT_SANDBOX_PREWARM", "0")
    monkeypatch.setenv("XAUDIT_SANDBOX_FORKSERVER", forkserver)
    before = _model_processes()
    loading = threading.Event()
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            run_sandboxed(
                SPEC, onnx_loop_bomb(), "onnx", {"inputs": X}, lambda f, m: loading.set(), cancel.is_set,
                SandboxLimits(memory_bytes=1 << 30, cpu_seconds=600, wall_seconds=600),
            )  # fmt: skip
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert loading.wait(180), "the sandbox never started the model"
        (child,) = _model_processes() - before
        time.sleep(1.0)  # spinning in the Loop now
        status = Path(f"/proc/{child}/status").read_text()
        assert b"s3cret" not in Path(f"/proc/{child}/environ").read_bytes()
        assert "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status
        parent = _parents()[child]
        assert (parent == os.getpid()) == (forkserver == "0")  # forked: the zygote's child
        cancel.set()
        started = time.monotonic()
        thread.join(30)
        assert not thread.is_alive() and isinstance(outcome[0], Cancelled)
        assert time.monotonic() - started < 5
        assert not Path(f"/proc/{child}").exists(), "the model's process outlived its cancelled job"
    finally:  # a failed check must not leave the model spinning (and pytest waiting) for 600 s
        cancel.set()
        thread.join(30)
    assert parent == os.getpid() or Path(f"/proc/{parent}").exists(), "the cancel killed the zygote"
