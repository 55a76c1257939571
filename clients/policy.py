"""Gate policies: which methods to audit, which must be judged reliable, and how to judge.

A policy is a YAML mapping with these keys, all optional, nothing else allowed::

    audit: [integrated_gradients, occlusion_1]   # or "all" (default: the fourteen methods)
    require_reliable: [integrated_gradients]     # each must also be audited (default: none)
    tolerances: {complete_allocation: 0.02}      # criterion -> tolerance, sent with the audit
    not_applicable: ignore                       # or "fail" (default: ignore)

How a report is judged (:func:`evaluate`): a method in ``require_reliable`` fails unless its verdict is
``reliable``; an audited method the policy does not require is informational (it never fails the gate);
an audited method with verdict ``not_applicable`` is skipped under ``ignore`` and fails under ``fail``
(required or not); an audited method missing from the report fails.
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
]

NotApplicablePolicy = Literal["ignore", "fail"]
Status = Literal["passed", "failed", "skipped"]

_KEYS = ("audit", "require_reliable", "tolerances", "not_applicable")
_KNOWN_METHODS = FOURTEEN_METHODS + EXTRA_METHODS


@dataclass(frozen=True)
class Policy:
    audit: tuple[str, ...] = FOURTEEN_METHODS
    require_reliable: tuple[str, ...] = ()
    # Only the overrides the policy names; :meth:`audit_tolerances` fills in the defaults.
    tolerances: Mapping[str, float] = field(default_factory=dict)
    not_applicable: NotApplicablePolicy = "ignore"

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
    return Policy(audit=audit, require_reliable=required, tolerances=tolerances, not_applicable=na)


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

    def describe(self) -> str:
        score = "n/a" if self.score is None else f"{self.score:.4g}"
        tolerance = "n/a" if self.tolerance is None else f"{self.tolerance:.4g}"
        return f"{self.name}: score {score} > tolerance {tolerance}"


@dataclass(frozen=True)
class MethodOutcome:
    method: str
    verdict: str  # reliable | unreliable | not_applicable | missing
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
        if isinstance(entry, dict) and entry.get("passed") is False:
            out.append(FailingCriterion(name, _number(entry.get("score")), _number(entry.get("tolerance"))))
    return tuple(out)


def evaluate(policy: Policy, report: Mapping[str, Any]) -> GateOutcome:
    """Judge a (verified) report against ``policy``; see the module docstring for the rules."""
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
        else:
            status = "failed"
            reason = reason or f"unknown verdict {verdict!r}"
        seconds = _number(entry.get("seconds")) or 0.0
        outcomes.append(MethodOutcome(name, verdict, required, status, reason, failing, criteria, seconds))
    return GateOutcome(tuple(outcomes), policy)
