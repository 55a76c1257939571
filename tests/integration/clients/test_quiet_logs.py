"""`xaudit serve` without -v: a job runs through its local worker and the log holds the service's own
lines only: no Celery banner or root warning, no gRPC fork_posix line, no kombu hostname warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from clients.client import XauditClient
from tests.integration.conftest import stop_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
NOISE = (
    "superuser",
    "fork_posix",
    "No hostname was supplied",
    "[queues]",
    "celery@",
    "UserWarning",
    "FutureWarning",
)


def test_serve_logs_only_its_own_lines_by_default(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "GRPC_VERBOSITY")}
    env.update(XAUDIT_HOME=str(tmp_path / "home"), XAUDIT_WORKER_CACHE=str(tmp_path / "cache"))
    with log.open("wb") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clients.cli.main", "serve", "--listen", "127.0.0.1:0"],
            cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"xaudit: serving on (\S+)", log.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        with XauditClient(found.group(1)) as client:
            ref = client.upload_model(ROOT / "workers" / "assets" / "digits_cnn.onnx")
            inputs = np.load(ROOT / "workers" / "assets" / "digits_inputs.npy")[:1]
            submitted = client.submit_audit(
                ref, inputs=inputs, players="grid:2x2", methods="occlusion_1", seed=41
            )
            final = list(client.watch(submitted.id))[-1]
            assert final.state == "succeeded", final
    finally:
        stop_process(proc)
    text = log.read_text(errors="replace")
    assert [n for n in NOISE if n in text] == [], text[-3000:]
