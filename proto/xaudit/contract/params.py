"""Method parameters: declared with each method's name, with their defaults and bounds.

The one table of what ``--param METHOD.KEY=VALUE`` (CLI) or ``MethodSpec.params`` (gRPC) may set.
The job spec checks given parameters against it before a job is recorded or run (same message
locally and from the service); the worker's methods take their defaults from it. Bounds keep a job's
cost bounded (docs/methods.md): e.g. quadrature steps, noise samples, window sizes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from xaudit.contract.errors import InvalidInput

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_PARAM_DEPTH",
    "MAX_PARAM_TEXT",
    "METHOD_PARAMETERS",
    "QUADRATURES",
    "Param",
    "check_method_params",
    "expected_gradients_steps",
    "parameter_defaults",
    "parse_param_text",
]

MAX_PARAM_TEXT = 256  # one parameter's text
MAX_PARAM_DEPTH = 2  # a list of numbers at most: parameters are scalars or short lists
MAX_INT_DIGITS = 18  # fits an int64 and every loop bound

# Captum's quadrature rules (captum.attr._utils.approximation_methods).
QUADRATURES: tuple[str, ...] = (
    "gausslegendre",
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
)

ParamKind = Literal["int", "float", "bool", "choice", "pair", "name"]


@dataclass(frozen=True)
class Param:
    """One parameter: its kind, default and bounds (inclusive). ``optional``: None is allowed (and
    means "found from the model or data")."""

    kind: ParamKind
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False

    def describe(self) -> str:
        if self.kind == "choice":
            return f"one of {', '.join(self.choices)}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "name":
            return "a layer name"
        if self.kind == "pair":
            return f"RxC with R and C between {self.low:g} and {self.high:g}, e.g. 2x2"
        what = "an integer" if self.kind == "int" else "a number"
        return f"{what} between {self.low:g} and {self.high:g}"

    def check(self, where: str, value: Any) -> Any:
        """The value, normalised (ints as int, floats as float); InvalidInput naming ``where``."""
        if value is None and self.optional:
            return None
        bad = InvalidInput(f"{where}={_shown(value)}: expected {self.describe()}")
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad
            return value
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise bad
            return value
        if self.kind == "name":
            if not isinstance(value, str) or not value or len(value) > MAX_PARAM_TEXT:
                raise bad
            return value
        if self.kind == "pair":
            text = str(value).lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
            try:
                rows, cols = (int(v) for v in text.split("x")) if "x" in text else (int(text), int(text))
            except ValueError:
                raise bad from None
            assert self.low is not None and self.high is not None
            if not (self.low <= rows <= self.high and self.low <= cols <= self.high):
                raise bad
            return f"{rows}x{cols}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if self.kind == "int":
            if isinstance(value, float):
                if not value.is_integer():
                    raise bad
                value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise bad
        assert self.low is not None and self.high is not None
        if not self.low <= value <= self.high:
            raise bad
        return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_STEPS = 1024  # quadrature points per path: beyond this the discretisation error is far below noise

# Expected Gradients' default quadrature: at least this many path points per input over the whole
# background (Integrated Gradients' default for its one reference), and at least the floor per reference.
EG_PATH_POINTS = 64
EG_MIN_STEPS = 8


def expected_gradients_steps(references: int) -> int:
    """Quadrature nodes per reference when the job does not set them: 64 over 1 reference, 32 over
    2, 8 from 8 references up (the error of the average falls with the number of references too)."""
    return max(EG_MIN_STEPS, math.ceil(EG_PATH_POINTS / max(1, references)))


# method name -> its parameters. A method absent here takes none.
METHOD_PARAMETERS: Mapping[str, Mapping[str, Param]] = {
    "integrated_gradients": {
        "steps": Param("int", 64, 1, _STEPS),
        "quadrature": Param("choice", "gausslegendre", choices=QUADRATURES),
    },
    "expected_gradients": {
        # Nodes per background reference; None: expected_gradients_steps(K) for the K references
        # the job averages over (docs/science.md 5.5).
        "steps": Param("int", None, 1, _STEPS, optional=True),
        "quadrature": Param("choice", "gausslegendre", choices=QUADRATURES),
    },
    "smoothgrad": {
        "samples": Param("int", 32, 1, 1024),
        "noise": Param("float", 0.15, 0.0, 10.0),  # standard deviation, as a share of the input's range
    },
    "grad_cam": {
        "layer": Param("name", None, optional=True),
        "relu": Param("bool", True),
    },
    "lrp_epsilon": {
        "epsilon": Param("float", 1e-6, 0.0, 1e3),
    },
    "lrp_alpha_beta": {
        "alpha": Param("float", 2.0, 0.0, 100.0),
        "beta": Param("float", 1.0, 0.0, 100.0),
    },
    "deep_taylor": {
        "low": Param("float", None, -1e30, 1e30, optional=True),
        "high": Param("float", None, -1e30, 1e30, optional=True),
    },
    "shapley_value": {
        # Sampled permutations above the exact limit (an unbiased estimate; docs/science.md).
        "permutations": Param("int", 256, 2, 100_000),
    },
    "occlusion_patch": {
        "window": Param("pair", "2x2", 1, 1024),
        "stride": Param("pair", "1x1", 1, 1024),
    },
}


def parameter_defaults(method: str) -> dict[str, Any]:
    """The declared defaults of ``method`` (empty for a method without parameters)."""
    return {name: p.default for name, p in METHOD_PARAMETERS.get(method, {}).items()}


def check_method_params(method: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` checked against ``method``'s declared parameters and bounds, normalised; unknown
    names are refused. Only the given ones are returned (defaults are applied where the method runs)."""
    declared = METHOD_PARAMETERS.get(method, {})
    unknown = sorted(set(given) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise InvalidInput(f"{method} has no parameter {', '.join(unknown)} (parameters: {known})")
    return {name: declared[name].check(f"{method}.{name}", value) for name, value in given.items()}


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise InvalidInput(f"integer {text[:24]}... has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidInput(f"number {text[:24]} is not finite")
    return value


def _depth(text: str) -> int:
    """Bracket nesting of JSON text, counted before parsing (a deep document never reaches json)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def parse_param_text(where: str, text: str) -> Any:
    """A parameter's value from its text (``--param`` or ``MethodSpec.params``): JSON when it parses
    (bounded: length, nesting, integer digits, finite numbers), else the text itself."""
    if len(text) > MAX_PARAM_TEXT:
        raise InvalidInput(f"parameter {where}: {len(text)} characters; the limit is {MAX_PARAM_TEXT}")
    if _depth(text) > MAX_PARAM_DEPTH:
        raise InvalidInput(f"parameter {where}: nested deeper than {MAX_PARAM_DEPTH} levels")
    try:
        return json.loads(
            text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_finite_float
        )
    except json.JSONDecodeError:
        return text
    except InvalidInput as exc:
        raise InvalidInput(f"parameter {where}: {exc}") from None
