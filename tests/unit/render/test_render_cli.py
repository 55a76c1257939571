"""``xaudit render`` and ``xaudit audit --html`` in-process: envelopes verified or labelled unchecked,
tampered ones refused, inputs that are not the audited ones refused, heatmaps from the .npz."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main
from clients.render import read_report
from clients.verify import key_id, load_public_key_file
from tests.unit.render._html import parse
from tests.unit.render._reports import GROUP_NAMES, GROUPS, image_audit
from xaudit.contract.errors import InvalidInput, VerificationError

SIGNING = Path(__file__).parents[2] / "assets" / "signing"
ENVELOPE = SIGNING / "envelope-key-1.json"
KEY = SIGNING / "key-1.pub.pem"


def test_read_report_verifies_with_a_key_and_labels_unchecked_without():
    data = ENVELOPE.read_bytes()
    report, status = read_report(data, [KEY.read_bytes()])
    assert status.state == "verified"
    assert status.key_id == key_id(load_public_key_file(KEY))
    unchecked, status2 = read_report(data)
    assert status2.state == "not_checked" and status2.key_id == status.key_id
    assert unchecked == report
    plain, status3 = read_report(json.dumps(report).encode())
    assert status3.state == "unsigned" and plain == report


@pytest.mark.parametrize(
    "name", ["tampered-verdict.json", "tampered-signature.json", "tampered-payload-type.json"]
)
def test_read_report_refuses_tampered_envelopes(name):
    with pytest.raises(VerificationError):
        read_report((SIGNING / name).read_bytes(), [KEY.read_bytes()])


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b'{"schema": "something/v9"}'])
def test_read_report_refuses_what_is_not_a_report(data):
    with pytest.raises(InvalidInput):
        read_report(data)


def test_render_envelope_with_key_shows_verified_key_id(tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["render", str(ENVELOPE), "--key", str(KEY), "--html", str(out)]) == 0
    page = parse(out.read_text())
    assert "✔ signature verified" in page.text
    assert key_id(load_public_key_file(KEY)) in page.text
    # Without attribution maps the grid says so rather than showing nothing.
    report, _ = read_report(ENVELOPE.read_bytes())
    assert len(page.table("decision-table").rows) == len(report["methods"]) > 10
    assert page.text.count("No attribution maps were supplied") == 1


def test_render_envelope_without_key_says_not_checked(tmp_path):
    out = tmp_path / "page.html"
    assert main(["render", str(ENVELOPE), "--html", str(out)]) == 0
    assert "⚠ signature not checked" in parse(out.read_text()).text


def test_render_refuses_a_tampered_envelope(tmp_path, capsys):
    out = tmp_path / "page.html"
    assert (
        main(["render", str(SIGNING / "tampered-verdict.json"), "--key", str(KEY), "--html", str(out)]) == 3
    )
    assert "xaudit: invalid:" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # the real audit of the digits CNN
def test_render_with_npz_and_inputs_draws_every_heatmap(tmp_path):
    a = image_audit()
    (tmp_path / "r.json").write_bytes(a.report_bytes)
    np.savez(tmp_path / "a.npz", target_values=np.zeros(2), **a.attributions)
    np.save(tmp_path / "x.npy", a.inputs)
    out = tmp_path / "page.html"
    argv = ["render", str(tmp_path / "r.json"), "--attributions", str(tmp_path / "a.npz")]
    assert main([*argv, "--input", str(tmp_path / "x.npy"), "--html", str(out)]) == 0
    page = parse(out.read_text())
    for b in range(len(a.inputs)):
        assert all(name in page.images[f"grid-{b}"]["alt"] for name in a.attributions)
    assert "⚠ unsigned report" in page.text


@pytest.mark.slow  # the real audit of the digits CNN
def test_render_refuses_inputs_that_were_not_audited(tmp_path, capsys):
    a = image_audit()
    (tmp_path / "r.json").write_bytes(a.report_bytes)
    np.save(tmp_path / "x.npy", a.inputs[::-1])
    argv = [
        "render",
        str(tmp_path / "r.json"),
        "--input",
        str(tmp_path / "x.npy"),
        "--html",
        str(tmp_path / "o.html"),
    ]
    assert main(argv) == 2
    assert "is not the report's audited inputs" in capsys.readouterr().err


def test_audit_html_on_a_grouped_tabular_model(tmp_path):
    import torch

    from tests.models import relu_mlp, to_onnx

    inputs = np.random.default_rng(1).normal(size=(2, 6)).astype(np.float32)
    (tmp_path / "m.onnx").write_bytes(to_onnx(relu_mlp(), torch.from_numpy(inputs)))
    np.save(tmp_path / "x.npy", inputs)
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"groups": GROUPS.tolist(), "names": list(GROUP_NAMES)}))
    out = tmp_path / "page.html"
    argv = ["audit", "--model", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "x.npy")]
    argv += ["--players", f"groups:{groups}", "--methods", "shapley_value,gradient_x_input"]
    assert main([*argv, "--out", str(tmp_path / "r.json"), "--html", str(out)]) == 0
    page = parse(out.read_text())
    alt = page.images["grid-0"]["alt"]
    assert f"(columns: {', '.join(GROUP_NAMES)})" in alt
    assert "shapley_value" in alt and "gradient_x_input" in alt
    report = json.loads((tmp_path / "r.json").read_text())
    assert page.table("model-table").rows[0][1] == report["model"]["sha256"]


def test_render_with_a_group_file_sums_features_per_group(tmp_path):
    from tests.unit.render._reports import tabular_audit

    a = tabular_audit(True)
    (tmp_path / "r.json").write_bytes(a.report_bytes)
    np.savez(tmp_path / "a.npz", **a.attributions)
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"groups": GROUPS.tolist(), "names": list(GROUP_NAMES)}))
    out = tmp_path / "page.html"
    argv = ["render", str(tmp_path / "r.json"), "--attributions", str(tmp_path / "a.npz")]
    assert main([*argv, "--groups", str(groups), "--html", str(out)]) == 0
    alt = parse(out.read_text()).images["grid-0"]["alt"]
    assert f"(columns: {', '.join(GROUP_NAMES)})" in alt


def test_an_unwritable_html_path_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "missing-dir" / "page.html"
    assert main(["render", str(ENVELOPE), "--html", str(out)]) == 2
    assert "cannot write the HTML page" in capsys.readouterr().err
