"""Names every role agrees on: methods, criteria, verdicts, job kinds and states, queues.

Plain tuples of strings: the service validates against them, the worker dispatches on them, the
client and the renderer print them, and none of them needs to import another role for that.
"""

from __future__ import annotations

from typing import Literal

from xaudit.contract.criteria import CRITERIA as _REGISTERED_CRITERIA

__all__ = [
    "ALL_METHODS",
    "CRITERIA",
    "DEFAULT_ADDRESS",
    "EXTRA_METHODS",
    "FOURTEEN_METHODS",
    "JOB_KINDS",
    "QUEUES",
    "QUEUE_CPU",
    "QUEUE_GPU",
    "TASK_NAME",
    "VERDICTS",
    "JobKind",
    "queue_for",
]

# The fourteen methods audited by default (docs/methods.md), then the extras run only on request.
FOURTEEN_METHODS: tuple[str, ...] = (
    "gradient_x_input",
    "occlusion_1",
    "occlusion_patch",
    "prediction_difference",
    "grad_cam",
    "integrated_gradients",
    "expected_gradients",
    "shapley_value",
    "lrp_epsilon",
    "lrp_alpha_beta",
    "deep_taylor",
    "deeplift_rescale",
    "deepshap",
    "deeplift_revealcancel",
)
EXTRA_METHODS: tuple[str, ...] = ("saliency", "smoothgrad")
ALL_METHODS: tuple[str, ...] = FOURTEEN_METHODS + EXTRA_METHODS

# The allocation criteria of the audit: from their registry (xaudit.contract.criteria).
CRITERIA: tuple[str, ...] = _REGISTERED_CRITERIA

# What the audit can say about one method (docs/science.md, section 6). ``inconclusive``: neither
# reliable nor unreliable at the stated confidence, or too noisy / too much unaudited to judge.
VERDICTS: tuple[str, ...] = ("reliable", "unreliable", "inconclusive", "not_applicable")

JobKind = Literal["audit", "attribution"]
JOB_KINDS: tuple[str, ...] = ("audit", "attribution")

# Where `xaudit serve` listens and the client connects by default.
DEFAULT_ADDRESS = "127.0.0.1:50051"

# Celery: the one task name and the queues workers listen on.
TASK_NAME = "xaudit.run_job"
QUEUE_CPU = "xaudit.cpu"
QUEUE_GPU = "xaudit.gpu"
QUEUES: tuple[str, ...] = (QUEUE_CPU, QUEUE_GPU)


def queue_for(device: str) -> str:
    """Jobs that ask for CUDA go to the GPU queue; ``auto`` and ``cpu`` run anywhere a CPU worker listens."""
    return QUEUE_GPU if device.strip().lower().startswith("cuda") else QUEUE_CPU
