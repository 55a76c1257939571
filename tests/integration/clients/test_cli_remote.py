"""The remote commands (submit, jobs, status, cancel, report) as users run them: `.venv/bin/xaudit` in a
subprocess against a real embedded `xaudit serve` (gRPC server, local worker, filesystem broker, SQLite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from clients._report import report_document
from clients.client import XauditClient
from tests.integration.conftest import Service, start_serve, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
XAUDIT = Path(sys.executable).with_name("xaudit")
ASSETS = ROOT / "workers" / "assets"
MODEL = ASSETS / "digits_cnn.onnx"
INPUTS = ASSETS / "digits_inputs.npy"
BACKGROUND = ASSETS / "digits_background.npy"
JOB = ["--model", str(MODEL), "--input", str(INPUTS), "--players", "grid:2x4"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_serve(tmp_path_factory.mktemp("clients-home"))
    try:
        yield svc
    finally:
        stop_process(svc.proc)


def xaudit(*args: str, server: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("XAUDIT_SERVER", None)
    if server is not None:
        env["XAUDIT_SERVER"] = server
    try:
        return subprocess.run(
            [str(XAUDIT), *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired as exc:  # say where it stood, not only that it hung
        raise AssertionError(f"xaudit {args[0]} ran past {timeout:g} s; its stderr:\n{exc.stderr}") from None


def test_submit_writes_the_exact_report_the_server_stores(service: Service, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    run = xaudit(
        "submit",
        *JOB,
        "--methods",
        "integrated_gradients,occlusion_1",
        "--out",
        str(out),
        server=service.address,
    )
    assert run.returncode == 0, run.stderr
    job_id = run.stderr.split("job ", 1)[1].split()[0]
    with XauditClient(service.address) as client:
        assert out.read_bytes() == client.get_report(job_id)
        assert client.get_job(job_id).state == "succeeded"
    verdicts = {m["name"]: m["verdict"] for m in report_document(out.read_bytes())["methods"]}
    # docs/science.md, section 5.3: Integrated Gradients is complete on every sub-input, Occlusion-1 over-allocates.
    assert verdicts == {"integrated_gradients": "reliable", "occlusion_1": "unreliable"}


def test_detach_status_jobs_and_report_round_trip(service: Service, tmp_path: Path) -> None:
    args = ("submit", *JOB, "--methods", "gradient_x_input", "--seed", "11", "--detach")
    first = xaudit(*args, "--server", service.address)
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    assert len(job_id.split()) == 1 and job_id
    # Same model, inputs and options: the same job, not a second one.
    again = xaudit(*args, "--server", service.address)
    assert again.returncode == 0 and again.stdout.strip() == job_id

    status = xaudit("status", job_id, server=service.address)
    assert status.returncode == 0, status.stderr
    assert f"job:       {job_id}" in status.stdout and "kind:      audit" in status.stdout

    out = tmp_path / "r.json"
    report = xaudit("report", job_id, "--wait", "--out", str(out), server=service.address)
    assert report.returncode == 0, report.stderr
    assert report_document(out.read_bytes())["methods"][0]["name"] == "gradient_x_input"
    assert "succeeded" in xaudit("status", job_id, server=service.address).stdout

    listing = xaudit("jobs", server=service.address)
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split()[:3] == ["JOB", "KIND", "STATE"]
    assert [r.split()[:3] for r in rows if r.startswith(job_id)] == [[job_id, "audit", "succeeded"]]


def test_remote_commands_print_verdicts_on_stdout_and_say_what_they_reuse(
    service: Service, tmp_path: Path
) -> None:
    args = ("submit", *JOB, "--methods", "occlusion_1,shapley_value", "--seed", "31")
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    first = xaudit(*args, "--out", str(out), server=service.address)
    assert first.returncode == 0, first.stderr
    rows = {line.split()[0]: line.split()[1] for line in first.stdout.splitlines()[1:3]}
    assert first.stdout.startswith("METHOD") and rows == {
        "occlusion_1": "unreliable",
        "shapley_value": "reliable",
    }
    assert f"report: {out.resolve()}" in first.stdout and "returning existing job" not in first.stderr
    job_id = first.stderr.split("job ", 1)[1].split()[0]

    again = xaudit(*args, "--out", str(out), "--json", server=service.address)
    assert again.returncode == 0, again.stderr
    assert f"returning existing job {job_id} (succeeded" in again.stderr and "pass --new" in again.stderr
    summary = json.loads(again.stdout)
    assert summary["job"] == job_id and summary["summary"]["reliable"] == ["shapley_value"]
    fresh = xaudit(*args, "--out", str(out), "--new", "--detach", server=service.address)
    assert fresh.returncode == 0 and fresh.stdout.strip() != job_id and "existing" not in fresh.stderr

    status = xaudit("status", job_id, server=service.address)
    assert status.returncode == 0 and "state:     succeeded" in status.stdout
    assert any(line.split()[:2] == ["occlusion_1", "unreliable"] for line in status.stdout.splitlines())

    report = xaudit("report", job_id, "--out", str(out), "--html", str(page), server=service.address)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("METHOD") and f"html: {page.resolve()}" in report.stdout
    assert 'id="decision-table"' in page.read_text()


def test_attribution_jobs_write_an_npz_equal_to_a_local_explain(service: Service, tmp_path: Path) -> None:
    remote, local = tmp_path / "remote.npz", tmp_path / "local.npz"
    opts = (
        "--methods",
        "integrated_gradients,expected_gradients",
        "--background",
        str(BACKGROUND),
        "--device",
        "cpu",
    )
    run = xaudit("submit", *JOB, *opts, "--kind", "attribution", "--out", str(remote), server=service.address)
    assert run.returncode == 0, run.stderr
    assert xaudit("explain", *JOB, *opts, "--out", str(local)).returncode == 0
    got, want = np.load(remote), np.load(local)
    assert sorted(got.files) == sorted(want.files)
    for name in want.files:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["integrated_gradients"].shape == (4, 1, 8, 8)
    # `xaudit report` of an attribution job writes the same .npz again.
    job_id = run.stderr.split("job ", 1)[1].split()[0]
    again = tmp_path / "again.npz"
    assert xaudit("report", job_id, "--out", str(again), server=service.address).returncode == 0
    assert again.read_bytes() == remote.read_bytes()


def test_cancel_a_queued_job_then_a_running_one(service: Service) -> None:
    # One local worker: the first job (an Integrated Gradients audit, seconds of work) holds it, so the
    # second is still queued when cancelled. Submitted through the library (no CLI start-up); cancel and
    # status import no torch and answer in well under a second.
    with XauditClient(service.address) as client:
        ref = client.upload_model(MODEL)
        x = np.load(INPUTS)
        # Seeds of their own: a request equal to another test's would return that (finished) job.
        # 16 samples at 1,024 quadrature steps: tens of seconds of work, checked for cancellation after
        # every two samples, so it is still running when the `xaudit cancel` process has started (256
        # steps on 4 samples once finished first on a loaded machine).
        many = np.concatenate([x * scale for scale in (1.0, 0.9, 0.8, 0.7)]).astype(np.float32)
        first = client.submit_audit(
            ref,
            inputs=many,
            players="grid:2x4",
            methods="integrated_gradients,occlusion_1",
            method_params={"integrated_gradients": {"steps": 1024}},
            seed=21,
        )
        queued = client.submit_audit(ref, inputs=x, players="grid:2x4", methods="saliency", seed=22)
    assert first.state == "queued" and queued.state == "queued", (first, queued)

    run = xaudit("cancel", queued.id, server=service.address)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"job {queued.id}: cancelled"
    assert "state:     cancelled" in xaudit("status", queued.id, server=service.address).stdout
    no_result = xaudit("report", queued.id, "--out", os.devnull, server=service.address)
    assert no_result.returncode == 2 and "cancelled" in no_result.stderr
    assert "--wait" not in no_result.stderr  # waiting will not give a cancelled job a result

    # A running audit stops at its worker's next progress step (audits check once per method).
    with XauditClient(service.address) as client:
        for job in client.watch(first.id):
            if job.state == "running":
                break
        run = xaudit("cancel", first.id, server=service.address)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == f"job {first.id}: running (running jobs stop at their next step)"
        final = client.wait(first.id)
    assert final.state == "cancelled", final
    assert not final.report_available


def test_a_failed_job_is_one_line_and_exit_2(service: Service, tmp_path: Path) -> None:
    # 16x16 grid cells on an 8x8 image: refused (by the service or by the worker), never a traceback.
    run = xaudit(
        "submit",
        *JOB[:-2],
        "--players",
        "grid:16x16",
        "--methods",
        "saliency",
        "--out",
        str(tmp_path / "x.json"),
        server=service.address,
    )
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("xaudit: error: ") and "Traceback" not in run.stderr
    unknown = xaudit("status", "no-such-job", server=service.address)
    assert (
        unknown.returncode == 2
        and unknown.stderr.startswith("xaudit: error:")
        and "no-such-job" in unknown.stderr
    )


@pytest.mark.parametrize(
    "command",
    [
        ["jobs"],
        ["status", "j1"],
        ["cancel", "j1"],
        ["report", "j1", "--out", "x"],
        ["submit", *JOB, "--detach"],
    ],
)
def test_unreachable_server_is_one_line_exit_2(command: list[str]) -> None:
    from clients._embedded import free_port

    address = f"127.0.0.1:{free_port()}"
    run = xaudit(*command, server=address, timeout=60)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert lines == [f"xaudit: error: cannot reach the xaudit server at {address} (Connection refused)"]


def test_report_json_is_valid_json_envelope(service: Service, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    run = xaudit("submit", *JOB, "--methods", "deeplift_rescale", "--out", str(out), server=service.address)
    assert run.returncode == 0, run.stderr
    envelope = json.loads(out.read_bytes())
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and envelope["signatures"]
