"""The parts of a job spec that are written as short strings, parsed once into typed objects.

``--players grid:2x4``, ``--baseline blur:2``, ``--target prob:3``, tolerances, the audit order and
the device: each string has one parser here, used by the CLI, the client library, the service (at
submission, before anything is recorded) and the worker (which reads the typed result). What needs
the data (does a 2x4 grid fit the input?) is checked where the data is; everything else is here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from xaudit.contract.criteria import DEFAULT_TOLERANCES  # one per registered criterion
from xaudit.contract.errors import InvalidInput
from xaudit.contract.names import CRITERIA

__all__ = [
    "DEFAULT_TOLERANCES",
    "MAX_AUDIT_ORDER",
    "MAX_BLUR_SIGMA",
    "MAX_GRID_SIDE",
    "MAX_TEXT_SPEC",
    "MAX_WINDOWS",
    "BaselineSpec",
    "PlayerSpec",
    "TargetSpec",
    "check_audit_order",
    "check_device",
    "check_tolerances",
    "parse_baseline",
    "parse_players",
    "parse_target",
]

MAX_AUDIT_ORDER = 16
MAX_BLUR_SIGMA = 1e4  # pixels: far past any image's size, far from float overflow
MAX_GRID_SIDE = 1024
MAX_WINDOWS = 4096
MAX_TEXT_SPEC = 256  # a players / baseline / target string
MAX_INDEX = 2**63 - 1  # class indices, token ids, output indices: they fit an int64

PlayerKind = Literal["auto", "grid", "features", "groups", "mask", "windows", "tokens"]
_PLAYER_USAGE = (
    "use auto, grid:RxC, grid:DxRxC, features, groups:FILE.json, mask:FILE.npy, windows:K[:axis=A], tokens"
)


def _short(text: str, limit: int = 60) -> str:
    text = text.replace("\x00", "\\0")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _index(text: str) -> int:
    """A non-negative integer that fits an int64; ValueError otherwise."""
    text = text.strip()
    if not text.isdigit() or len(text) > 19 or int(text) > MAX_INDEX:
        raise ValueError(text)
    return int(text)


def _check_length(what: str, text: str) -> None:
    if len(text) > MAX_TEXT_SPEC:
        raise InvalidInput(f"{what} '{_short(text)}' is longer than {MAX_TEXT_SPEC} characters")


@dataclass(frozen=True)
class PlayerSpec:
    """``kind`` and its arguments: ``grid`` (rows, cols; depth for a volume's grid:DxRxC, 0 for an
    image's grid:RxC), ``windows`` (count; axis of the sample, -1 the last), ``tokens`` (skip:
    positions, negative from the end), ``groups``/``mask`` (source: the file the caller read)."""

    text: str
    kind: PlayerKind
    rows: int = 0
    cols: int = 0
    depth: int = 0
    axis: int = -1  # windows: the sample's axis they cut (the last by default)
    count: int = 0
    skip: tuple[int, ...] = ()
    source: str = ""


def parse_players(text: str) -> PlayerSpec:
    """The one parser of the players string."""
    _check_length("player spec", text)
    spec = text.strip()
    kind, sep, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind in ("auto", "features"):
        if sep:
            raise InvalidInput(f"player spec '{_short(spec)}': '{kind}' takes no argument")
        return PlayerSpec(spec, kind)  # type: ignore[arg-type]
    if kind == "grid":
        try:
            sides = [_index(v) for v in arg.lower().split("x")]
            if len(sides) not in (2, 3):
                raise ValueError(arg)
        except ValueError:
            raise InvalidInput(
                f"player spec '{_short(spec)}': expected grid:RxC, e.g. grid:2x4, or grid:DxRxC for a "
                "volume, e.g. grid:2x2x2 (a series: windows:K)"
            ) from None
        if not all(1 <= side <= MAX_GRID_SIDE for side in sides):
            raise InvalidInput(
                f"player spec '{_short(spec)}': each side must be between 1 and {MAX_GRID_SIDE}"
            )
        *depth, rows, cols = sides
        return PlayerSpec(spec, "grid", rows=rows, cols=cols, depth=depth[0] if depth else 0)
    if kind == "windows":
        count_text, _, axis_text = arg.partition(":")
        try:
            count = _index(count_text)
            key, eq, value = axis_text.partition("=")
            if axis_text and (key.strip().lower() != "axis" or not eq or len(value.strip()) > 3):
                raise ValueError(axis_text)
            axis = int(value) if axis_text else -1
        except ValueError:
            raise InvalidInput(
                f"player spec '{_short(spec)}': expected windows:K with an integer K, e.g. windows:8, or "
                "windows:K:axis=A for windows over another axis of the sample (0: the first, e.g. time "
                "in a (time, features) sequence)"
            ) from None
        if not 1 <= count <= MAX_WINDOWS:
            raise InvalidInput(f"player spec '{_short(spec)}': K must be between 1 and {MAX_WINDOWS}")
        return PlayerSpec(spec, "windows", count=count, axis=axis)
    if kind == "tokens":
        skip: tuple[int, ...] = ()
        if arg:
            key, eq, raw = arg.partition("=")
            try:
                if key.strip().lower() != "skip" or not eq:
                    raise ValueError(arg)
                skip = tuple(int(p) for p in raw.split(",") if len(p.strip()) <= 19)
                if len(skip) != len(raw.split(",")) or any(abs(p) > MAX_INDEX for p in skip):
                    raise ValueError(arg)
            except ValueError:
                raise InvalidInput(
                    f"player spec '{_short(spec)}': expected tokens or tokens:skip=P,P (positions)"
                ) from None
        return PlayerSpec(spec, "tokens", skip=skip)
    if kind in ("groups", "mask"):
        if not arg.strip():
            what = "groups:FILE.json" if kind == "groups" else "mask:FILE.npy"
            raise InvalidInput(f"player spec '{_short(spec)}': expected {what}")
        return PlayerSpec(spec, kind, source=arg.strip())  # type: ignore[arg-type]
    raise InvalidInput(f"unknown player spec '{_short(spec)}' ({_PLAYER_USAGE})")


BaselineKind = Literal["zeros", "mean", "blur", "constant", "token", "tensor"]


@dataclass(frozen=True)
class BaselineSpec:
    """``zeros``, ``mean``, ``blur`` (sigma; None: from the input's size), ``constant`` (value),
    ``token`` (token id), ``tensor`` (the attached ``baseline`` array)."""

    text: str
    kind: BaselineKind
    sigma: float | None = None
    value: float = 0.0
    token: int = 0


def parse_baseline(text: str) -> BaselineSpec:
    """The one parser of the baseline string (a caller turns ``FILE.npy`` into ``tensor`` first)."""
    _check_length("baseline", text)
    spec = text.strip()
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind in ("zeros", "mean", "tensor", "file"):
        if arg:
            raise InvalidInput(f"baseline '{_short(spec)}': '{kind}' takes no argument")
        return BaselineSpec(spec, "tensor" if kind == "file" else kind)  # type: ignore[arg-type]
    if kind == "blur":
        if not arg:
            return BaselineSpec(spec, "blur")
        try:
            sigma = float(arg)
        except ValueError:
            raise InvalidInput(f"baseline '{_short(spec)}': expected blur or blur:SIGMA") from None
        if not (math.isfinite(sigma) and 0 < sigma <= MAX_BLUR_SIGMA):
            raise InvalidInput(f"baseline '{_short(spec)}': sigma must be in (0, {MAX_BLUR_SIGMA:g}]")
        return BaselineSpec(spec, "blur", sigma=sigma)
    if kind == "constant":
        try:
            value = float(arg)
        except ValueError:
            raise InvalidInput(f"baseline '{_short(spec)}': expected constant:V with a number V") from None
        if not math.isfinite(value):
            raise InvalidInput(f"baseline '{_short(spec)}': the constant must be a finite number")
        return BaselineSpec(spec, "constant", value=value)
    if kind == "token":
        try:
            token = _index(arg)
        except ValueError:
            raise InvalidInput(
                f"baseline '{_short(spec)}': expected token:ID with an integer ID between 0 and {MAX_INDEX}"
            ) from None
        return BaselineSpec(spec, "token", token=token)
    raise InvalidInput(
        f"unknown baseline '{_short(spec)}' (use zeros, mean, blur[:SIGMA], constant:V, token:ID or a .npy file)"
    )


TargetKind = Literal["logit", "prob", "logodds"]


@dataclass(frozen=True)
class TargetSpec:
    """``kind`` of score for class ``fixed_class`` (None: the predicted class), or element
    ``fixed_class`` of the named model ``output`` read as is."""

    text: str
    kind: TargetKind = "logit"
    fixed_class: int | None = None
    output: str | None = None


_TARGET_USAGE = "use predicted, class:K, logit[:K], prob[:K], logodds[:K], output:NAME[INDEX]"


def parse_target(text: str) -> TargetSpec:
    """The one parser of the target string."""
    _check_length("target", text)
    spec = text.strip() or "predicted"
    if spec.lower().startswith("output:"):
        body = spec[len("output:") :].strip()
        index = 0
        if body.endswith("]") and "[" in body:
            body, _, raw = body[:-1].partition("[")
            try:
                index = _index(raw)
            except ValueError:
                raise InvalidInput(
                    f"target '{_short(spec)}': expected output:NAME[INDEX] with an integer INDEX >= 0"
                ) from None
        if not body:
            raise InvalidInput(f"target '{_short(spec)}': expected output:NAME or output:NAME[INDEX]")
        return TargetSpec(spec, "logit", index, body)
    kind, _, arg = spec.lower().partition(":")
    if kind == "predicted":
        if arg:
            raise InvalidInput(f"target '{_short(spec)}': 'predicted' takes no class")
        return TargetSpec(spec)
    if kind == "class":
        kind = "logit"
        if not arg:
            raise InvalidInput(f"target '{_short(spec)}': expected class:K")
    if kind not in ("logit", "prob", "logodds"):
        raise InvalidInput(f"unknown target '{_short(spec)}' ({_TARGET_USAGE})")
    fixed: int | None = None
    if arg:
        try:
            fixed = _index(arg)
        except ValueError:
            raise InvalidInput(f"target '{_short(spec)}': class index must be an integer >= 0") from None
    return TargetSpec(spec, kind, fixed)  # type: ignore[arg-type]


def check_tolerances(given: Mapping[str, object]) -> dict[str, float]:
    """The defaults overridden by ``given``: known criteria, finite numbers >= 0 (at most 1: a
    tolerance is a share of effect mass)."""
    out = dict(DEFAULT_TOLERANCES)
    for name, value in given.items():
        if name not in CRITERIA:
            raise InvalidInput(f"unknown tolerance '{_short(str(name))}' (criteria: {', '.join(CRITERIA)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInput(f"tolerance {name}={_short(str(value))}: must be a number")
        number = float(value)
        if not (math.isfinite(number) and 0 <= number <= 1):
            raise InvalidInput(f"tolerance {name}={value}: must be a finite number between 0 and 1")
        out[name] = number
    return out


def check_audit_order(order: object) -> int:
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_AUDIT_ORDER:
        raise InvalidInput(
            f"audit order {_short(str(order))}: must be an integer between 1 and {MAX_AUDIT_ORDER}"
        )
    return order


def check_device(text: str) -> str:
    """``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``; lower-cased."""
    device = (text or "auto").strip().lower()
    if device in ("auto", "cpu", "cuda"):
        return device
    if device.startswith("cuda:") and device[5:].isdigit() and len(device) <= 9:
        return device
    raise InvalidInput(f"unknown device '{_short(text)}' (use auto, cpu, cuda or cuda:N)")
