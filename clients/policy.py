"""Gate policies: which methods to audit, which must be judged reliable, and how to judge.

A policy is a YAML mapping with these keys, all optional, nothing else allowed::

    audit: [integrated_gradients, occlusion_1]   # or "all" (default: the fourteen methods)
    require_reliable: [integrated_gradients]     # each must also be audited (default: none)
    tolerances: {complete_allocation: 0.02}      # criterion -> tolerance, sent with the audit
    not_applicable: ignore                       # or "fail" (default: ignore)
    min_samples: 20                              # audited input samples at least (default: any)
    confidence: 0.95                             # intervals at this level (sent with the audit) at least
    allow_inconclusive: false                    # may a required method be inconclusive? (default: no)

How a report is judged (:func:`evaluate`): a method in ``require_reliable`` fails unless its verdict is
``reliable`` (or ``inconclusive`` under ``allow_inconclusive: true``: inconclusive is never a pass
otherwise); an audited method the policy does not require is informational (it never fails the
gate); an audited method with verdict ``not_applicable`` is skipped under ``ignore`` and fails under
``fail`` (required or not); an audited method missing from the report fails. A report audited on
fewer samples than ``min_samples``, or whose intervals are at a lower level than ``confidence`` (a
v1 report has none), fails every required method that would otherwise pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import CRITERIA, DEFAULT_TOLERANCES, EXTRA_METHODS, FOURTEEN_METHODS

__all__ = [
    "FailingCriterion",
    "GateOutcome",
    "MethodOutcome",
    "Policy",
    "evaluate",
    "load_policy",
    "parse_policy",
    "report_shortfalls",
]

NotApplicablePolicy = Literal["ignore", "fail"]
Status = Literal["passed", "failed", "skipped"]

_KEYS = (
    "audit",
    "require_reliable",
    "tolerances",
    "not_applicable",
    "min_samples",
    "confidence",
    "allow_inconclusive",
)
_KNOWN_METHODS = FOURTEEN_METHODS + EXTRA_METHODS


@dataclass(frozen=True)
class Policy:
    audit: tuple[str, ...] = FOURTEEN_METHODS
    require_reliable: tuple[str, ...] = ()
    # Only the overrides the policy names; :meth:`audit_tolerances` fills in the defaults.
    tolerances: Mapping[str, float] = field(default_factory=dict)
    not_applicable: NotApplicablePolicy = "ignore"
    min_samples: int | None = None
    confidence: float | None = None
    allow_inconclusive: bool = False

    def audit_tolerances(self) -> dict[str, float]:
        """Every criterion's tolerance for the audit: the defaults with this policy's overrides."""
        return {**DEFAULT_TOLERANCES, **self.tolerances}


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # no stubs for PyYAML
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _method_list(value: Any, key: str, where: str, *, allow_all: bool) -> tuple[str, ...]:
    if allow_all and value == "all":
        return FOURTEEN_METHODS
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        hint = '"all" or ' if allow_all else ""
        raise InvalidInput(f"{where}: '{key}' must be {hint}a list of method names")
    out: list[str] = []
    for name in value:
        if name not in _KNOWN_METHODS:
            raise InvalidInput(
                f"{where}: '{key}' names unknown method '{name}'; known: {', '.join(_KNOWN_METHODS)}"
            )
        if name in out:
            raise InvalidInput(f"{where}: '{key}' lists '{name}' twice")
        out.append(name)
    if allow_all and not out:
        raise InvalidInput(f"{where}: '{key}' is empty; nothing would be audited")
    return tuple(out)


def parse_policy(text: str, source: str = "policy") -> Policy:
    """A :class:`Policy` from YAML text; :class:`InvalidInput` naming ``source`` and the key otherwise."""
    try:
        raw = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InvalidInput(f"{source}: not valid YAML{where}: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"{source}: must be a mapping with keys {', '.join(_KEYS)}")
    unknown = [str(k) for k in raw if k not in _KEYS]
    if unknown:
        raise InvalidInput(f"{source}: unknown key '{unknown[0]}'; allowed: {', '.join(_KEYS)}")
    audit = _method_list(raw.get("audit", "all"), "audit", source, allow_all=True)
    required = _method_list(raw.get("require_reliable", []), "require_reliable", source, allow_all=False)
    not_audited = [m for m in required if m not in audit]
    if not_audited:
        raise InvalidInput(
            f"{source}: 'require_reliable' names '{not_audited[0]}', which 'audit' does not include"
        )
    tolerances_raw = raw.get("tolerances", {})
    if tolerances_raw is None:
        tolerances_raw = {}
    if not isinstance(tolerances_raw, dict):
        raise InvalidInput(f"{source}: 'tolerances' must be a mapping of criterion to number")
    tolerances: dict[str, float] = {}
    for name, value in tolerances_raw.items():
        if name not in CRITERIA:
            raise InvalidInput(
                f"{source}: 'tolerances' names unknown criterion '{name}'; known: {', '.join(CRITERIA)}"
            )
        # bool is an int in Python; `true` is not a tolerance.
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidInput(f"{source}: 'tolerances.{name}' must be a number")
        if value < 0:
            raise InvalidInput(f"{source}: 'tolerances.{name}' must be >= 0")
        tolerances[name] = float(value)
    na = raw.get("not_applicable", "ignore")
    if na not in ("ignore", "fail"):
        raise InvalidInput(f"{source}: 'not_applicable' must be 'ignore' or 'fail', not {na!r}")
    min_samples = raw.get("min_samples")
    if min_samples is not None and (
        isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1
    ):
        raise InvalidInput(f"{source}: 'min_samples' must be a whole number >= 1")
    confidence = raw.get("confidence")
    if confidence is not None and (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not 0.5 <= float(confidence) < 1.0
    ):
        raise InvalidInput(f"{source}: 'confidence' must be a level between 0.5 and 1 (e.g. 0.95)")
    allow = raw.get("allow_inconclusive", False)
    if not isinstance(allow, bool):
        raise InvalidInput(f"{source}: 'allow_inconclusive' must be true or false")
    return Policy(
        audit=audit,
        require_reliable=required,
        tolerances=tolerances,
        not_applicable=na,
        min_samples=min_samples,
        confidence=None if confidence is None else float(confidence),
        allow_inconclusive=allow,
    )


def load_policy(path: Path) -> Policy:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"policy file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"policy file {path} cannot be read ({type(exc).__name__})") from None
    return parse_policy(text, str(path))


@dataclass(frozen=True)
class FailingCriterion:
    name: str
    score: float | None
    tolerance: float | None
    # v2 reports: the interval and whether it lies above the tolerance or straddles it.
    lower: float | None = None
    upper: float | None = None
    status: str = "fails"

    def describe(self) -> str:
        score = "n/a" if self.score is None else f"{self.score:.4g}"
        tolerance = "n/a" if self.tolerance is None else f"{self.tolerance:.4g}"
        bounds = "" if self.lower is None or self.upper is None else f" [{self.lower:.4g}, {self.upper:.4g}]"
        relation = "straddles" if self.status == "undecided" else ">"
        return f"{self.name}: score {score}{bounds} {relation} tolerance {tolerance}"


@dataclass(frozen=True)
class MethodOutcome:
    method: str
    verdict: str  # reliable | unreliable | inconclusive | not_applicable | missing
    required: bool
    status: Status
    reason: str
    failing: tuple[FailingCriterion, ...] = ()
    criteria: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0  # the method's audit time in the report (JUnit's test time)

    @property
    def label(self) -> str:
        """What the gate prints: PASSED/FAILED/SKIPPED, and INFO for a method the policy does not
        require, whatever its verdict (it can neither pass nor fail the gate)."""
        if not self.required and self.status == "passed":
            return "INFO"
        return self.status.upper()

    def failure_text(self) -> str:
        """Why this method failed (or would have, when informational): criteria with scores and tolerances."""
        lines = [f"{self.method}: verdict {self.verdict}" + (f" ({self.reason})" if self.reason else "")]
        lines += [f"  {c.describe()}" for c in self.failing]
        return "\n".join(lines)


@dataclass(frozen=True)
class GateOutcome:
    methods: tuple[MethodOutcome, ...]
    policy: Policy

    @property
    def passed(self) -> bool:
        return not any(m.status == "failed" for m in self.methods)

    @property
    def failed(self) -> tuple[MethodOutcome, ...]:
        return tuple(m for m in self.methods if m.status == "failed")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _failing_criteria(criteria: Mapping[str, Any]) -> tuple[FailingCriterion, ...]:
    out = []
    for name in sorted(criteria, key=lambda n: (CRITERIA.index(n) if n in CRITERIA else len(CRITERIA), n)):
        entry = criteria[name]
        if not isinstance(entry, dict):
            continue
        score, tolerance = _number(entry.get("score")), _number(entry.get("tolerance"))
        status = entry.get("status")
        if status in ("fails", "undecided"):  # v2: judged by the interval
            lower, upper = _number(entry.get("lower")), _number(entry.get("upper"))
            out.append(FailingCriterion(name, score, tolerance, lower, upper, str(status)))
        elif status is None and entry.get("passed") is False:  # v1: the point estimate
            out.append(FailingCriterion(name, score, tolerance))
    return tuple(out)


def report_shortfalls(policy: Policy, report: Mapping[str, Any]) -> tuple[str, ...]:
    """What the report as a whole lacks for ``policy``: too few samples, too low a confidence level."""
    out = []
    inputs = report.get("inputs") if isinstance(report.get("inputs"), dict) else {}
    count = _number(inputs.get("count")) if isinstance(inputs, dict) else None
    if policy.min_samples is not None and (count is None or count < policy.min_samples):
        shown = "an unknown number of" if count is None else f"{int(count)}"
        out.append(f"audited on {shown} samples; the policy requires at least {policy.min_samples}")
    if policy.confidence is not None:
        config = report.get("config") if isinstance(report.get("config"), dict) else {}
        confidence = config.get("confidence") if isinstance(config, dict) else None
        level = _number(confidence.get("level")) if isinstance(confidence, dict) else None
        if level is None:
            out.append(f"the report has no confidence intervals; the policy requires {policy.confidence:.0%}")
        elif level + 1e-12 < policy.confidence:
            out.append(
                f"the report's intervals are at {level:.0%}; the policy requires {policy.confidence:.0%}"
            )
    return tuple(out)


def evaluate(policy: Policy, report: Mapping[str, Any]) -> GateOutcome:
    """Judge a (verified) report against ``policy``; see the module docstring for the rules."""
    shortfalls = report_shortfalls(policy, report)
    by_name = {m.get("name"): m for m in report.get("methods", []) if isinstance(m, dict)}
    outcomes: list[MethodOutcome] = []
    for name in policy.audit:
        required = name in policy.require_reliable
        entry = by_name.get(name)
        if entry is None:
            outcomes.append(
                MethodOutcome(name, "missing", required, "failed", "the report has no verdict for it")
            )
            continue
        verdict = str(entry.get("verdict", "missing"))
        reason = str(entry.get("reason") or "")
        raw_criteria = entry.get("criteria")
        criteria: dict[str, Any] = raw_criteria if isinstance(raw_criteria, dict) else {}
        failing = _failing_criteria(criteria)
        status: Status
        if verdict == "reliable":
            status = "passed"
        elif verdict == "not_applicable":
            status = "failed" if policy.not_applicable == "fail" else "skipped"
        elif verdict == "unreliable":
            status = "failed" if required else "passed"
        elif verdict == "inconclusive":
            status = "failed" if required and not policy.allow_inconclusive else "passed"
        else:
            status = "failed"
            reason = reason or f"unknown verdict {verdict!r}"
        if required and status == "passed" and shortfalls:
            status, reason = "failed", "; ".join(shortfalls)
        seconds = _number(entry.get("seconds")) or 0.0
        outcomes.append(MethodOutcome(name, verdict, required, status, reason, failing, criteria, seconds))
    return GateOutcome(tuple(outcomes), policy)
