"""Thread policy: never more threads than CPUs, shared CPUs divided among workers, overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.threads import CONCURRENCY_ENV, SPIN_ENV, THREADS_ENV, available_cpus, choose, set_wait_policy
from xaudit.contract.errors import InvalidInput


def test_default_is_the_cpus_divided_among_workers() -> None:
    assert choose(environ={}, cpus=(8, "cpu count")).threads == 8
    policy = choose(environ={CONCURRENCY_ENV: "3"}, cpus=(8, "cpu count"))
    assert policy.threads == 2 and policy.concurrency == 3 and not policy.spinning  # shared
    assert choose(environ={CONCURRENCY_ENV: "16"}, cpus=(8, "cpu count")).threads == 1


def test_threads_spin_only_when_the_operator_says_the_cpus_are_dedicated() -> None:
    assert not choose(environ={}, cpus=(8, "cpu count")).spinning  # the machine may be shared
    assert choose(environ={SPIN_ENV: "1"}, cpus=(os.cpu_count() or 1, "cpu count")).spinning is (
        (os.cpu_count() or 1) > 1
    )
    assert not choose(environ={SPIN_ENV: "1", CONCURRENCY_ENV: "2"}, cpus=(8, "cpu count")).spinning


def test_torch_threads_sleep_unless_spinning_is_asked_for() -> None:
    env: dict[str, str] = {}
    set_wait_policy(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    set_wait_policy(env)
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"  # the operator's own setting wins
    env = {SPIN_ENV: "1"}
    set_wait_policy(env)
    assert "OMP_WAIT_POLICY" not in env
    # In a process: set by importing the package, before torch (and so libgomp) loads.
    code = "import os, workers, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", SPIN_ENV)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=120
    )
    assert done.stdout.strip() == "PASSIVE", done.stderr[-500:]


def test_override_never_exceeds_the_cpus() -> None:
    assert choose(environ={THREADS_ENV: "1"}, cpus=(8, "affinity")).threads == 1
    policy = choose(environ={THREADS_ENV: "64"}, cpus=(2, "cgroup quota"))
    assert policy.threads == 2 and policy.source.startswith("--threads")
    assert choose(3, environ={THREADS_ENV: "1"}, cpus=(8, "cpu count")).threads == 3  # argument first
    assert choose(environ={"OMP_NUM_THREADS": "1"}, cpus=(8, "cpu count")).source == "OMP_NUM_THREADS"
    assert choose(environ={"OMP_NUM_THREADS": "1", THREADS_ENV: "2"}, cpus=(8, "cpu count")).threads == 2
    with pytest.raises(InvalidInput, match="XAUDIT_THREADS"):
        choose(environ={THREADS_ENV: "zero"}, cpus=(2, "cpu count"))


def test_cgroup_quota_limits_the_cpus(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU
    assert available_cpus(tmp_path)[0] == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path)[0] >= 1


def test_sessions_and_torch_follow_the_policy() -> None:
    code = (
        "import torch, numpy as np\n"
        "from tests.models import relu_mlp, to_onnx\n"
        "from workers.models import load_model\n"
        "from workers.threads import current\n"
        "model = load_model(to_onnx(relu_mlp(0), torch.zeros(2, 6)), 'onnx', 'cpu')\n"
        "assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
        "assert current().threads == 1 and current().source.startswith('--threads')\n"
        "opts = model._session.get_session_options()\n"
        "assert opts.intra_op_num_threads == 1, opts.intra_op_num_threads\n"
    )
    env = {**os.environ, THREADS_ENV: "1"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


_BLAS_THREADS = (
    "import json, numpy, scipy.linalg\n"  # numpy's and scipy's own OpenBLAS copies
    "from threadpoolctl import threadpool_info\n"
    "def blas(): return sorted(i['num_threads'] for i in threadpool_info() if i['internal_api'] == 'openblas')\n"
    "before = blas()\n"
    "import torch\n"
    "from tests.models import relu_mlp, to_onnx\n"
    "from workers.models import load_model\n"
    "from workers.threads import current\n"
    "load_model(to_onnx(relu_mlp(0), torch.zeros(2, 6)), 'onnx', 'cpu')\n"
    "print(json.dumps({'before': before, 'after': blas(), 'recorded': current().as_dict()['blas_threads']}))\n"
)


@pytest.mark.parametrize(("given", "expected"), [(None, 1), ("2", 2)])
def test_numpy_blas_threads_follow_the_policy_not_the_core_count(given: str | None, expected: int) -> None:
    """OpenBLAS starts a thread per core, and idle ones spin: loading a model limits every copy."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env[THREADS_ENV] = "2"
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    done = subprocess.run(
        [sys.executable, "-c", _BLAS_THREADS],
        check=True,
        timeout=120,
        env=env,
        capture_output=True,
        text=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["after"] and set(found["after"]) == {expected}
    assert found["recorded"] == expected  # the report's environment section says so
    if given is None and (os.cpu_count() or 1) > 1:
        assert max(found["before"]) > 1  # what the limit undoes
