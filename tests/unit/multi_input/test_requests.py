"""Named inputs on the wire: client request -> SubmitRequest -> the service's job tensors, and back."""

from __future__ import annotations

import numpy as np
import pytest

from clients._requests import submit_request
from service.validation import submission_from_request
from workers.inputs import input_key
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec

_CAPS = {"max_elements": 1 << 20, "max_dims": 8}


def test_named_inputs_round_trip_through_the_request() -> None:
    image = np.arange(2 * 64, dtype=np.float32).reshape(2, 1, 8, 8)
    clinical = np.ones((2, 4), np.float32)
    spec = JobSpec(players="grid:2x2", explain="image", embedding_tensor="", device="cpu")
    request = submit_request("0" * 64, spec, {"inputs": image, input_key("clinical"): clinical})
    assert [t.name for t in request.inputs] == ["image", "clinical"] and request.explain == "image"
    submission = submission_from_request(request, "audit", **_CAPS)
    assert submission.spec.explain == "image"
    assert sorted(submission.tensors) == ["input:clinical", "inputs"]
    np.testing.assert_array_equal(submission.tensors["inputs"], image)
    np.testing.assert_array_equal(submission.tensors["input:clinical"], clinical)


def test_one_input_requests_are_unchanged() -> None:
    x = np.ones((2, 6), np.float32)
    request = submit_request("0" * 64, JobSpec(players="features"), {"inputs": x})
    assert [t.name for t in request.inputs] == ["inputs"] and request.explain == ""
    assert sorted(submission_from_request(request, "audit", **_CAPS).tensors) == ["inputs"]


def test_held_inputs_need_an_explained_one() -> None:
    with pytest.raises(InvalidInput, match="set explain"):
        submit_request("0" * 64, JobSpec(), {"inputs": np.ones((1, 2)), input_key("state"): np.ones((1, 2))})
    spec = JobSpec(explain="x")
    request = submit_request("0" * 64, spec, {"inputs": np.ones((1, 2)), input_key("x"): np.ones((1, 2))})
    with pytest.raises(InvalidInput, match="distinct, non-empty names"):
        submission_from_request(request, "audit", **_CAPS)
