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
from functools import cached_property
from typing import Any

import numpy as np

from xaudit.contract.errors import InvalidInput, UnknownMethod
from xaudit.contract.names import ALL_METHODS, CRITERIA, EXTRA_METHODS, FOURTEEN_METHODS, JOB_KINDS, JobKind
from xaudit.contract.params import check_method_params, parameter_defaults
from xaudit.contract.subspecs import (
    DEFAULT_TOLERANCES,
    BaselineSpec,
    PlayerSpec,
    TargetSpec,
    check_audit_order,
    check_device,
    check_tolerances,
    parse_baseline,
    parse_players,
    parse_target,
)

__all__ = [
    "ALL_METHODS",
    "ATTACHMENTS",
    "CRITERIA",
    "DEFAULT_TOLERANCES",
    "EXTRA_METHODS",
    "FOURTEEN_METHODS",
    "BaselineSpec",
    "JobSpec",
    "PlayerSpec",
    "TargetSpec",
    "config_digest",
    "resolve_method_names",
    "tensor_digest",
]

# Named tensors that may travel with a spec.
ATTACHMENTS: tuple[str, ...] = ("inputs", "background", "baseline", "player_mask", "player_groups")


MAX_SEED = 2**63 - 1
MAX_BUDGET_EVALUATIONS = 10**15  # model rows; far above any audit a worker finishes
MAX_BUDGET_S = 7 * 24 * 3600.0
MAX_NAME = 256  # explain, embedding_tensor, one group name
MAX_GROUP_NAMES = 65536


@dataclass(frozen=True)
class JobSpec:
    """Everything a job needs besides the model bytes and the attached tensors.

    Validated and normalised when built (``__post_init__``), wherever that happens: the CLI, the
    client library, the service (before the job is recorded) and the worker (from the stored JSON)
    all build it, so the same bad option gives the same one-line :class:`InvalidInput` everywhere and
    nothing downstream re-checks it. The string fields keep the wire form; their typed, parsed views
    are :attr:`player_spec`, :attr:`baseline_spec`, :attr:`target_spec` and :meth:`params_for`.
    """

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

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalised values are written once, here
        if self.kind not in JOB_KINDS:
            raise InvalidInput(f"unknown job kind '{self.kind}' (use {', '.join(JOB_KINDS)})")
        for name in ("players", "baseline", "target", "device", "explain", "embedding_tensor"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidInput(f"{name} must be text, not {type(value).__name__}")
        set_(self, "players", parse_players(self.players).text or "auto")
        set_(self, "baseline", parse_baseline(self.baseline).text)
        set_(self, "target", parse_target(self.target).text)
        methods = resolve_method_names(self.methods)
        set_(self, "methods", methods)
        if not isinstance(self.method_params, Mapping):
            raise InvalidInput("method parameters must map method names to parameters")
        stray = sorted(set(self.method_params) - set(methods))
        if stray:
            raise InvalidInput(f"parameters for methods that are not requested: {', '.join(map(str, stray))}")
        params: dict[str, dict[str, Any]] = {}
        for method, given in self.method_params.items():
            if not isinstance(given, Mapping):
                raise InvalidInput(f"parameters of {method} must map names to values")
            if given:
                params[method] = check_method_params(method, given)
        set_(self, "method_params", params)
        set_(self, "audit_order", check_audit_order(self.audit_order))
        evaluations, seconds = self.budget_evaluations, self.budget_seconds
        if (
            isinstance(evaluations, bool)
            or not isinstance(evaluations, int)
            or not 0 <= evaluations <= MAX_BUDGET_EVALUATIONS
        ):
            raise InvalidInput(f"budget_evaluations must be between 0 and {MAX_BUDGET_EVALUATIONS}")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 <= seconds <= MAX_BUDGET_S
        ):
            raise InvalidInput(f"budget_seconds must be between 0 and {MAX_BUDGET_S:g}")
        set_(self, "budget_seconds", float(seconds))
        level = self.confidence
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.5 <= level < 1.0:
            raise InvalidInput(f"confidence {str(level)[:24]}: must be a level between 0.5 and 1 (e.g. 0.95)")
        set_(self, "confidence", float(level))
        if not isinstance(self.tolerances, Mapping):
            raise InvalidInput("tolerances must map criteria to numbers")
        set_(self, "tolerances", check_tolerances(self.tolerances))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise InvalidInput(f"seed {str(self.seed)[:24]}: must be an integer between 0 and {MAX_SEED}")
        set_(self, "device", check_device(self.device))
        group_names = tuple(self.group_names)
        if len(group_names) > MAX_GROUP_NAMES or any(
            not isinstance(n, str) or len(n) > MAX_NAME for n in group_names
        ):
            raise InvalidInput(
                f"group names: at most {MAX_GROUP_NAMES} names of at most {MAX_NAME} characters each"
            )
        set_(self, "group_names", group_names)
        for name in ("explain", "embedding_tensor"):
            value = getattr(self, name).strip()
            if len(value) > MAX_NAME:
                raise InvalidInput(f"{name} is longer than {MAX_NAME} characters")
            set_(self, name, value)

    @cached_property
    def player_spec(self) -> PlayerSpec:
        return parse_players(self.players)

    @cached_property
    def baseline_spec(self) -> BaselineSpec:
        return parse_baseline(self.baseline)

    @cached_property
    def target_spec(self) -> TargetSpec:
        return parse_target(self.target)

    def params_for(self, method: str) -> dict[str, Any]:
        """``method``'s declared defaults overridden by this job's parameters (already checked)."""
        return {**parameter_defaults(method), **self.method_params.get(method, {})}

    def to_json(self) -> str:
        return json.dumps(
            {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSpec:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise InvalidInput("a job spec must be a JSON object")
        raw["methods"] = tuple(raw.get("methods", FOURTEEN_METHODS))
        raw["group_names"] = tuple(raw.get("group_names", ()))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return list(value)
    return value


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
                raise UnknownMethod(f"unknown method '{item[:60]}'; known: {', '.join(ALL_METHODS)}")
            if item not in out:
                out.append(item)
    return tuple(out)
