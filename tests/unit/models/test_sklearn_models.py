"""Tabular models as other teams export them: scikit-learn pipelines through skl2onnx with its
defaults (label first, probabilities in a ZipMap), and a torch model with a second output.

Before workers/models/onnx_outputs.py the audit explained a classifier's first output, the int64
label: a step function of the input, audited as if it were a score. Before workers/models/ml_ops.py
no gradient or rule method ran on a scikit-learn linear model. The references here are
scikit-learn's own ``predict_proba``/``predict`` and the logistic model's closed-form gradient."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from skl2onnx import to_onnx
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from workers.audit import run_audit
from workers.inspect_model import inspect_model
from workers.prepare import Prepared, prepare
from xaudit.contract.errors import InvalidInput, InvalidModel
from xaudit.contract.spec import JobSpec

_GRADIENT = (
    "gradient_x_input",
    "integrated_gradients",
    "deeplift_rescale",
    "deeplift_revealcancel",
    "lrp_epsilon",
)


def _data(features: int = 6) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(0)
    x = r.normal(loc=3.0, scale=2.0, size=(300, features)).astype(np.float32)
    y = (x[:, 0] - 0.5 * x[:, 1] * (x[:, 2] > 3) + r.normal(size=300) > 3).astype(np.int64)
    return x, y


def _exported(estimator: object, x: np.ndarray) -> bytes:
    return to_onnx(estimator, x[:1]).SerializeToString()  # skl2onnx's defaults: ZipMap included


def _prepared(
    data: bytes, x: np.ndarray, methods: tuple[str, ...] = ("shapley_value",), target: str = "predicted"
) -> Prepared:
    spec = JobSpec(players="features", methods=methods, target=target, device="cpu")
    return prepare(spec, data, None, {"inputs": x[:4]})


def test_logistic_pipeline_explains_probabilities_and_its_gradient_is_the_closed_form() -> None:
    x, y = _data()
    pipeline = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y)
    prep = _prepared(_exported(pipeline, x), x)
    assert prep.model.info.output_name == "output_probability"  # not output_label
    np.testing.assert_allclose(prep.full_outputs, pipeline.predict_proba(x[:4]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(prep.classes, pipeline.predict(x[:4]))
    # The methods' graph is the pipeline, derivative included: d p1/dx = p1 (1 - p1) w / scale.
    rows = torch.from_numpy(x[:4]).requires_grad_(True)
    graph = prep.model.torch_differentiable()
    (grad,) = torch.autograd.grad(graph(rows)[:, 1].sum(), rows)
    scaler, logistic = pipeline[0], pipeline[1]
    p = pipeline.predict_proba(x[:4])[:, 1:]
    expected = p * (1 - p) * logistic.coef_ / scaler.scale_
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-4, atol=1e-7)


def test_logistic_pipeline_every_gradient_and_rule_method_is_judged() -> None:
    x, y = _data()
    pipeline = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y)
    report = run_audit(_prepared(_exported(pipeline, x), x, _GRADIENT)).report
    verdicts = {m["name"]: (m["verdict"], m.get("reason", "")) for m in report["methods"]}
    assert all(v != "not_applicable" for v, _ in verdicts.values()), verdicts
    # A logistic model of independent features: IG and RevealCancel on it are exact on the game.
    assert verdicts["integrated_gradients"][0] == "reliable"
    assert report["model"]["output_name"] == "output_probability"


def test_multinomial_polynomial_and_imputed_regression_match_scikit_learn() -> None:
    x, _ = _data()
    three = np.digitize(x[:, 0], [2.0, 4.0])
    multinomial = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, three)
    prep = _prepared(_exported(multinomial, x), x)
    graph = prep.model.torch_differentiable()
    np.testing.assert_allclose(
        graph(torch.from_numpy(x[:4])).detach().numpy(),
        multinomial.predict_proba(x[:4]),
        rtol=1e-5,
        atol=1e-6,
    )
    polynomial = make_pipeline(PolynomialFeatures(2), StandardScaler(), Ridge()).fit(x, x[:, 0] * x[:, 1])
    graph = _prepared(_exported(polynomial, x), x).model.torch_differentiable()
    np.testing.assert_allclose(
        graph(torch.from_numpy(x[:4])).detach().numpy()[:, 0], polynomial.predict(x[:4]), rtol=1e-4, atol=1e-4
    )
    holes = x.copy()
    holes[::7, 2] = np.nan  # fitted with missing values; the audited rows are complete
    regression = make_pipeline(SimpleImputer(), StandardScaler(), LinearRegression()).fit(
        holes, x[:, 0] * 2 - x[:, 3]
    )
    prep = _prepared(_exported(regression, holes), x)
    graph = prep.model.torch_differentiable()
    np.testing.assert_allclose(
        graph(torch.from_numpy(x[:4])).detach().numpy()[:, 0], regression.predict(x[:4]), rtol=1e-4, atol=1e-4
    )


def test_tree_ensemble_is_audited_on_its_probabilities_and_gradients_say_why_not() -> None:
    x, y = _data()
    trees = GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=0).fit(x, y)
    data = _exported(trees, x)
    prep = _prepared(data, x, ("shapley_value", "gradient_x_input"))
    np.testing.assert_allclose(prep.full_outputs, trees.predict_proba(x[:4]), rtol=1e-5, atol=1e-6)
    report = run_audit(prep).report
    game = next(c for c in report["game"]["checks"] if c["name"] == "full")
    np.testing.assert_allclose(game["game"], trees.predict_proba(x[:4]).max(axis=1), rtol=1e-5)
    verdicts = {m["name"]: m for m in report["methods"]}
    assert verdicts["shapley_value"]["verdict"] == "reliable"
    assert verdicts["gradient_x_input"]["verdict"] == "not_applicable"
    assert "TreeEnsembleClassifier" in verdicts["gradient_x_input"]["reason"]
    with pytest.raises(InvalidInput, match=r"'output_label' \(int64\) holds no scores.*'output_probability'"):
        _prepared(data, x, target="output:output_label")


class _TwoOutputs(torch.nn.Module):
    """Logits and the features before them, as models that also serve embeddings return."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.head = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.hidden(x))
        return self.head(h), h


def test_a_second_output_no_longer_breaks_the_gradient_methods() -> None:
    """The first output is explained, by the game and by the methods alike (before, the methods' graph
    returned both outputs: "'list' object has no attribute 'reshape'")."""
    torch.manual_seed(0)
    buffer = io.BytesIO()
    torch.onnx.export(
        _TwoOutputs().eval(), (torch.zeros(2, 6),), buffer, dynamo=False, input_names=["x"],
        output_names=["logits", "features"], dynamic_axes={"x": {0: "n"}},
    )  # fmt: skip
    data = buffer.getvalue()
    x, _ = _data()
    default = run_audit(_prepared(data, x, ("gradient_x_input", "shapley_value"))).report
    named = run_audit(
        _prepared(data, x, ("gradient_x_input", "shapley_value"), target="output:logits")
    ).report
    assert default["model"]["output_name"] == "logits"
    assert [m["verdict"] for m in default["methods"]] == [m["verdict"] for m in named["methods"]]
    assert default["methods"][0]["verdict"] != "not_applicable", default["methods"][0]


def test_inspect_names_the_explained_output_and_what_can_run() -> None:
    x, y = _data()
    logistic = inspect_model(_exported(make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y), x))
    assert logistic.explained_output == "output_probability"
    assert logistic.output_head == "ZipMap"
    assert all(logistic.methods[name].startswith("runs") for name in _GRADIENT), logistic.methods
    assert "output_probability: float32 (N, 2)  <- explained" in logistic.text()
    trees = inspect_model(_exported(GradientBoostingClassifier(n_estimators=5).fit(x, y), x))
    assert "TreeEnsembleClassifier" in trees.methods["gradient_x_input"]


def test_a_dataframe_export_with_a_string_column_is_refused_with_what_to_do() -> None:
    """skl2onnx makes one input per DataFrame column, categories as tensor(string)."""
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder

    x, y = _data()
    frame = pd.DataFrame({"age": x[:, 0], "bp": x[:, 1], "sex": np.where(y == 1, "m", "f")})
    columns = ColumnTransformer([("num", StandardScaler(), ["age", "bp"]), ("cat", OneHotEncoder(), ["sex"])])
    pipeline = make_pipeline(columns, LogisticRegression()).fit(frame, y)
    data = to_onnx(pipeline, frame[:1]).SerializeToString()
    with pytest.raises(InvalidModel, match=r"'sex' has type tensor\(string\).*one input per column"):
        inspect_model(data)
