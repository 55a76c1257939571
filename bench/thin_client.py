"""The thin client, proven: a fresh ``pip install .`` (no extras) gives ``xaudit gate`` and ``xaudit
verify`` without torch, onnxruntime, celery or sqlalchemy, and they pass against a full server.

    python -m bench.thin_client [--venv DIR] [--reuse]

Builds a virtual environment in DIR (default: a temporary one) with ``pip install <this tree>``,
reports its size on disk (the budget is 400 MB), checks that importing the client library, gate,
verify, render and the whole CLI loads none of the heavy packages, then starts a full embedded
server with *this* interpreter (which has the engine and server extras) and runs the thin venv's
``xaudit gate``, ``xaudit keys`` and ``xaudit verify`` against it on the shipped digits CNN.
Slow (minutes: the install downloads wheels), so it lives here and not in the test suite.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "workers" / "assets"
HEAVY = ("torch", "onnxruntime", "celery", "sqlalchemy", "captum", "zennit", "scipy", "onnx2torch")
BUDGET_MB = 400
IMPORT_CHECK = (
    "import sys, json\n"
    "import clients.client, clients.verify, clients.policy, clients.render, clients.summary, clients.junit\n"
    "import clients.cli.main as m\n"
    "m.build_parser()\n"
    "import clients.cli.gate, clients.cli.verify, clients.cli.keys, clients.cli.render, clients.cli.submit\n"
    "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))\n"
)


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("$", " ".join(argv), flush=True)
    return subprocess.run(argv, text=True, capture_output=True, **kw)  # type: ignore[call-overload,no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--venv", type=Path, help="where to build the thin venv (default: a temporary dir)")
    parser.add_argument("--reuse", action="store_true", help="reuse an existing venv at --venv")
    args = parser.parse_args(argv)
    venv = args.venv or Path(tempfile.mkdtemp(prefix="xaudit-thin-")) / "venv"
    bin_dir = venv / "bin"
    if not (args.reuse and (bin_dir / "xaudit").exists()):
        run = _run([sys.executable, "-m", "venv", str(venv)])
        assert run.returncode == 0, run.stderr
        run = _run([str(bin_dir / "pip"), "install", "-q", str(ROOT)])
        assert run.returncode == 0, run.stderr[-3000:]
    size = _size_mb(venv)
    print(f"thin venv: {size:.0f} MB on disk (budget {BUDGET_MB} MB)")
    ok = size < BUDGET_MB

    # -I: only the venv's own install, never this tree through PYTHONPATH or the working directory.
    run = _run([str(bin_dir / "python"), "-I", "-c", IMPORT_CHECK], cwd=tempfile.gettempdir())
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = set(json.loads(run.stdout))
    heavy = sorted(loaded & set(HEAVY))
    print(f"heavy packages imported by the thin client: {heavy or 'none'}")
    # The CLI registers every subcommand (serve, worker too); their modules load lazily, so a role
    # package may be imported for its options only. Shown, not judged.
    print(f"role packages imported: {sorted(loaded & {'service', 'workers'}) or 'none'}")
    ok &= not heavy

    from clients._embedded import embedded_service  # the full server, from this interpreter

    xaudit = str(bin_dir / "xaudit")
    with tempfile.TemporaryDirectory() as tmp_name, embedded_service(Path(tmp_name) / "home") as address:
        tmp = Path(tmp_name)
        policy = tmp / "policy.yaml"
        policy.write_text(
            "audit: [integrated_gradients, occlusion_1]\nrequire_reliable: [integrated_gradients]\n"
        )
        envelope = tmp / "report.dsse.json"
        gate = _run(
            [xaudit, "gate", "--server", address, "--policy", str(policy),
             "--model", str(ASSETS / "digits_cnn.onnx"), "--input", str(ASSETS / "digits_inputs.npy"),
             "--players", "grid:2x4", "--envelope-out", str(envelope)],
            cwd=tmp,
        )  # fmt: skip
        print(
            f"thin xaudit gate: exit {gate.returncode}: {(gate.stdout + gate.stderr).strip().splitlines()[-1:]}"
        )
        ok &= gate.returncode == 0
        keys = _run([xaudit, "keys", "--server", address, "--out", str(tmp / "keys")], cwd=tmp)
        ok &= keys.returncode == 0
        key_args = [a for k in sorted((tmp / "keys").glob("*.pem")) for a in ("--key", str(k))]
        verify = _run(
            [xaudit, "verify", str(envelope), *key_args, "--model", str(ASSETS / "digits_cnn.onnx")], cwd=tmp
        )
        print(f"thin xaudit verify: exit {verify.returncode}: {verify.stdout.strip().splitlines()[:1]}")
        ok &= verify.returncode == 0 and verify.stdout.startswith("valid: signed by key")
        tampered = tmp / "tampered.json"
        data = json.loads(envelope.read_text())
        data["signatures"][0]["sig"] = "A" + data["signatures"][0]["sig"][1:]
        tampered.write_text(json.dumps(data))
        bad = _run([xaudit, "verify", str(tampered), *key_args], cwd=tmp)
        print(f"thin xaudit verify (tampered): exit {bad.returncode}")
        ok &= bad.returncode == 3
    print("thin client: OK" if ok else "thin client: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
