"""Load test of the scale-out setup: N concurrent clients submit M small audit jobs to `xaudit serve`
(Redis broker on a private redis-server, PostgreSQL job store) with W separate `xaudit worker`s.

Checks: every job reaches a terminal state, exactly one report per succeeded job, the server's
resident memory stays bounded. Prints throughput and p50/p95 submit latency.

    .venv/bin/python -m bench.load_test                      # 50 clients, 200 jobs, 2 workers
    .venv/bin/python -m bench.load_test --clients 10 --jobs 40

tests/load/test_load.py runs a smaller configuration of the same code in the test suite.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from service.store import JobStore
from tests.integration.conftest import start_serve, start_worker, stop_process
from tests.integration.security._infra import RedisServer, fresh_postgres, rss_bytes
from tests.integration.service._helpers import TERMINAL, inputs, mlp_onnx, request, stub, upload
from xaudit.contract.units import MiB
from xaudit.v1 import audit_pb2

__all__ = ["LoadResult", "run_load"]


@dataclass(frozen=True)
class LoadResult:
    clients: int
    jobs: int
    workers: int
    submitted: int
    succeeded: int
    failed: int
    other_terminal: int
    not_terminal: int
    reports_per_job: list[int]
    submit_p50_ms: float
    submit_p95_ms: float
    submit_seconds: float
    total_seconds: float
    jobs_per_second: float
    server_rss_start_mib: float
    server_rss_peak_mib: float
    server_rss_end_mib: float


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_load(clients: int = 50, jobs: int = 200, workers: int = 2, timeout: float = 900.0) -> LoadResult:
    with tempfile.TemporaryDirectory(prefix="xaudit-load-") as tmp, fresh_postgres() as store_url:
        home = Path(tmp) / "home"
        redis = RedisServer.start_new()
        service = start_serve(home, "--broker", redis.url, "--store", store_url, "--lease-seconds", "20")
        procs = [start_worker(redis.url, service.address, home, name=f"worker-{i}") for i in range(workers)]
        try:
            return _drive(service.address, service.proc.pid, store_url, clients, jobs, procs, timeout)
        finally:
            for proc in procs:
                stop_process(proc, signal.SIGKILL)
            stop_process(service.proc, signal.SIGKILL)
            redis.close()


def _drive(
    address: str,
    server_pid: int,
    store_url: str,
    clients: int,
    jobs: int,
    procs: list[subprocess.Popen[bytes]],
    timeout: float,
) -> LoadResult:
    api = stub(address)
    sha = upload(api, mlp_onnx(seed=7))
    rss = [rss_bytes(server_pid)]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.25):
            rss.append(rss_bytes(server_pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    latencies: list[float] = []
    ids: list[str] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with grpc.insecure_channel(address) as channel:
            from xaudit.v1 import audit_pb2_grpc

            own = audit_pb2_grpc.AuditServiceStub(channel)
            for n in range(index, jobs, clients):
                req = request(sha, inputs(seed=1000 + n, batch=1), {"gradient_x_input": {}})
                started = time.perf_counter()
                job = own.SubmitAudit(req, timeout=60)
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    ids.append(job.id)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    submit_seconds = time.perf_counter() - started
    states: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while True:
        states = {}
        token = ""
        while True:
            page = api.ListJobs(audit_pb2.ListJobsRequest(page_size=500, page_token=token), timeout=30)
            states.update({j.id: j.state for j in page.jobs})
            token = page.next_page_token
            if not token:
                break
        if all(states.get(i) in TERMINAL for i in ids) or time.monotonic() > deadline:
            break
        if all(proc.poll() is not None for proc in procs):  # nothing left to run them: stop waiting
            break
        time.sleep(0.5)
    total = time.perf_counter() - started
    sampling.set()
    sampler.join()
    store = JobStore(store_url)
    try:
        reports = [store.count_results(i)[0] for i in ids]
    finally:
        store.close()
    succeeded = sum(states.get(i) == audit_pb2.JOB_STATE_SUCCEEDED for i in ids)
    failed = sum(states.get(i) == audit_pb2.JOB_STATE_FAILED for i in ids)
    terminal = sum(states.get(i) in TERMINAL for i in ids)
    return LoadResult(
        clients=clients,
        jobs=jobs,
        workers=len(procs),
        submitted=len(set(ids)),
        succeeded=succeeded,
        failed=failed,
        other_terminal=terminal - succeeded - failed,
        not_terminal=len(ids) - terminal,
        reports_per_job=sorted(set(reports)),
        submit_p50_ms=1000 * statistics.median(latencies),
        submit_p95_ms=1000 * _percentile(latencies, 0.95),
        submit_seconds=submit_seconds,
        total_seconds=total,
        jobs_per_second=terminal / total,
        server_rss_start_mib=rss[0] / MiB,
        server_rss_peak_mib=max(rss) / MiB,
        server_rss_end_mib=rss[-1] / MiB,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    result = run_load(args.clients, args.jobs, args.workers)
    print(json.dumps(asdict(result), indent=2))
    ok = result.not_terminal == 0 and result.succeeded == result.jobs and result.reports_per_job == [1]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
