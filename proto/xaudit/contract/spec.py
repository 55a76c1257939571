"""What a job asks for, as plain data: the same object travels from CLI or gRPC to the compute core.

Files named in specs (a group file, a label mask, a baseline tensor, a background set) are read by
the caller and travel as named tensors beside the spec (see :data:`ATTACHMENTS`), so a worker on
another machine never needs the client's files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xaudit.contract.criteria import DEFAULT_TOLERANCES as _REGISTERED_TOLERANCES
from xaudit.contract.errors import InvalidInput, UnknownMethod
from xaudit.contract.names import ALL_METHODS, CRITERIA, EXTRA_METHODS, FOURTEEN_METHODS, JobKind

__all__ = [
    "ALL_METHODS",
    "ATTACHMENTS",
    "CRITERIA",
    "DEFAULT_TOLERANCES",
    "EXTRA_METHODS",
    "FOURTEEN_METHODS",
    "JobSpec",
    "config_digest",
    "resolve_method_names",
    "tensor_digest",
]

# Shares of effect mass, one per registered criterion (xaudit.contract.criteria), chosen so the
# analytic cases separate cleanly: exact methods score ~0 (within numerical noise), Occlusion-1
# scores (|S|-1)/|S| >= 0.5 on pairs.
DEFAULT_TOLERANCES: Mapping[str, float] = _REGISTERED_TOLERANCES

# Named tensors that may travel with a spec.
ATTACHMENTS: tuple[str, ...] = ("inputs", "background", "baseline", "player_mask", "player_groups")


@dataclass(frozen=True)
class JobSpec:
    """Everything a job needs besides the model bytes and the attached tensors."""

    kind: JobKind = "audit"
    players: str = "auto"
    baseline: str = "zeros"
    target: str = "predicted"
    methods: tuple[str, ...] = FOURTEEN_METHODS
    method_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    audit_order: int = 3
    # Caps on the audit's work above the exhaustive limit (0: none; workers.audit.plan): model rows
    # (forward or forward+backward passes) and seconds on the worker's device.
    budget_evaluations: int = 0
    budget_seconds: float = 0.0
    tolerances: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    # Level of the criteria's confidence intervals (docs/science.md, section 6).
    confidence: float = 0.95
    seed: int = 0
    device: str = "auto"
    group_names: tuple[str, ...] = ()
    # Models with several inputs: the one whose units are the players (the others, attached as
    # ``input:NAME``, are held at their values). Empty: the model's one input.
    explain: str = ""
    # Token inputs: the embedding output where gradient and rule methods attribute (empty: found
    # in the graph).
    embedding_tensor: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSpec:
        raw = json.loads(text)
        raw["methods"] = tuple(raw.get("methods", FOURTEEN_METHODS))
        raw["group_names"] = tuple(raw.get("group_names", ()))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def config_digest(model_sha256: str, spec: JobSpec, tensors: Mapping[str, np.ndarray]) -> str:
    """sha256 over model, spec and attached tensors: the default idempotency key."""
    h = hashlib.sha256()
    h.update(model_sha256.encode())
    h.update(spec.to_json().encode())
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        h.update(f"{name}:{arr.dtype.str}:{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def tensor_digest(array: np.ndarray) -> str:
    """sha256 of a tensor as the report and signatures name it: ``"<shape>"`` then float32 LE C-order bytes.

    Example: shape (4, 1, 8, 8) hashes b"4,1,8,8" followed by the 1024 bytes of the data.
    """
    arr = np.ascontiguousarray(np.asarray(array, dtype="<f4"))
    h = hashlib.sha256(",".join(str(d) for d in arr.shape).encode())
    h.update(arr.tobytes())
    return h.hexdigest()


def resolve_method_names(spec: str | Iterable[str]) -> tuple[str, ...]:
    """``all`` (the fourteen), ``all+extras``, or a comma-separated list, validated, in a stable order.

    Pure names: callers that only validate (the service, the CLI's remote commands) load no torch.
    """
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = [n for n in names if n]
    if not names:
        raise InvalidInput("no methods given")
    out: list[str] = []
    for name in names:
        expanded = FOURTEEN_METHODS if name == "all" else ALL_METHODS if name == "all+extras" else (name,)
        for item in expanded:
            if item not in ALL_METHODS:
                raise UnknownMethod(f"unknown method '{item}'; known: {', '.join(ALL_METHODS)}")
            if item not in out:
                out.append(item)
    return tuple(out)
