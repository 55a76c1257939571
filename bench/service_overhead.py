"""Service overhead: time from submit to result available, minus the job's compute time.

Starts the real service in each mode (`xaudit serve` processes on loopback), uploads a tiny ONNX
MLP, runs one warm-up job, then REPEATS distinct tiny attribution jobs one after another, polling
GetJob every 5 ms. Prints a table of medians (and 90th percentiles) in milliseconds.

    python bench/service_overhead.py [--repeats 20] [--modes embedded,sqla,redis]

Modes: ``embedded`` (`xaudit serve`: filesystem broker, local worker, SQLite), ``sqla`` (kombu's
sqla+sqlite transport instead, for the broker choice), ``redis`` (Redis broker, SQLite store, a
separate `xaudit worker`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xaudit.contract.tensors import encode_tensor  # noqa: E402
from xaudit.v1 import audit_pb2, audit_pb2_grpc  # noqa: E402

REDIS = os.environ.get("XAUDIT_BENCH_REDIS", "redis://127.0.0.1:6379/12")


def tiny_onnx() -> bytes:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    buffer = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.zeros(2, 6),),
        buffer,
        dynamo=False,
        opset_version=17,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
    )
    return buffer.getvalue()


def _spawn(args: list[str], home: Path, log: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, XAUDIT_HOME=str(home), XAUDIT_WORKER_CACHE=str(home / f"{log}-cache"))
    with (home / f"{log}.log").open("wb") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "clients.cli.main", *args],
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextmanager
def service(mode: str, home: Path) -> Iterator[str]:
    home.mkdir(parents=True)
    extra: list[str] = []
    if mode == "sqla":
        extra = ["--broker", f"sqla+sqlite:///{home / 'broker.db'}", "--local-worker"]
    elif mode == "redis":
        import redis

        redis.Redis.from_url(REDIS).flushdb()
        extra = ["--broker", REDIS]
    procs = [_spawn(["serve", "--listen", "127.0.0.1:0", *extra], home, "serve")]
    try:
        deadline = time.monotonic() + 120
        address = None
        while address is None:
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError((home / "serve.log").read_text()[-2000:])
            found = re.search(r"serving on (\S+)", (home / "serve.log").read_text())
            address = found.group(1) if found else None
            time.sleep(0.05)
        if mode == "redis":
            procs.append(_spawn(["worker", "--broker", REDIS, "--server", address], home, "worker"))
        yield address
    finally:
        for proc in procs:
            _kill(proc)


def measure(address: str, model: bytes, repeats: int) -> list[tuple[float, float]]:
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=60)
    api = audit_pb2_grpc.AuditServiceStub(channel)
    meta = audit_pb2.ModelMetadata(format=audit_pb2.MODEL_FORMAT_ONNX, declared_size=len(model))
    sha = api.UploadModel(
        iter([audit_pb2.ModelChunk(metadata=meta), audit_pb2.ModelChunk(data=model)])
    ).sha256
    out = []
    for i in range(repeats + 1):  # the first job warms the worker up and is not counted
        x = np.random.default_rng(i).normal(size=(1, 6)).astype(np.float32)
        req = audit_pb2.SubmitRequest(
            model_sha256=sha,
            inputs=[encode_tensor("inputs", x)],
            players="features",
            methods=[audit_pb2.MethodSpec(name="gradient_x_input")],
            device="cpu",
        )
        start = time.perf_counter()
        job = api.SubmitAttribution(req)
        while job.state not in (audit_pb2.JOB_STATE_SUCCEEDED, audit_pb2.JOB_STATE_FAILED):
            time.sleep(0.005)
            job = api.GetJob(audit_pb2.GetJobRequest(job_id=job.id))
        total = time.perf_counter() - start
        if job.state != audit_pb2.JOB_STATE_SUCCEEDED:
            raise RuntimeError(f"job failed: {job.error_message}")
        if i:
            out.append((total, job.compute_seconds))
    channel.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--modes", default="embedded,sqla,redis")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups on `timeout`
    model = tiny_onnx()
    rows = []
    with tempfile.TemporaryDirectory(prefix="xaudit-bench-") as tmp:
        for mode in args.modes.split(","):
            with service(mode, Path(tmp) / mode) as address:
                samples = measure(address, model, args.repeats)
            overhead = sorted(1000 * (t - c) for t, c in samples)
            compute = statistics.median(1000 * c for _, c in samples)
            total = statistics.median(1000 * t for t, _ in samples)
            p90 = overhead[int(0.9 * (len(overhead) - 1))]
            rows.append((mode, total, compute, statistics.median(overhead), p90))
    print(
        f"{'mode':<10} {'submit->result ms':>18} {'compute ms':>11} {'overhead ms':>12} {'overhead p90':>13}"
    )
    for mode, total, compute, median, p90 in rows:
        print(f"{mode:<10} {total:>18.0f} {compute:>11.0f} {median:>12.0f} {p90:>13.0f}")
    print(f"(median of {args.repeats} jobs each; {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
