"""Options shared by every command that describes a job (explain, audit, submit, gate)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clients.cli.arg_types import positive_int
from xaudit.contract.errors import InvalidInput
from xaudit.contract.params import parse_param_text
from xaudit.contract.spec import CRITERIA, DEFAULT_TOLERANCES, JobSpec
from xaudit.contract.subspecs import parse_players

if TYPE_CHECKING:  # numpy is loaded when a file is read, not for --help
    import numpy as np

__all__ = [
    "add_job_options",
    "add_threads_option",
    "apply_threads_option",
    "check_methods",
    "job_from_args",
    "read_file",
    "read_inputs",
    "read_model",
    "read_npy",
]


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: compute threads per process (default: the CPUs given, shared among workers)."""
    parser.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="torch and onnxruntime threads per compute process (default: the CPUs this process may use, "
        "divided among worker processes; env XAUDIT_THREADS; never more than the CPUs)",
    )


def apply_threads_option(args: argparse.Namespace) -> None:
    """Pass ``--threads`` on through the environment, to this process and to every process it starts
    (embedded service, worker, sandbox child): workers.threads reads it."""
    threads = getattr(args, "threads", None)
    if threads is not None:
        import os

        os.environ["XAUDIT_THREADS"] = str(threads)


def add_job_options(parser: argparse.ArgumentParser, *, audit: bool) -> None:
    parser.add_argument(
        "--model", required=True, type=Path, help="ONNX (.onnx) or TorchScript (.pt) model file"
    )
    parser.add_argument(
        "--input",
        required=True,
        action="append",
        metavar="[NAME=]FILE.npy",
        help="inputs .npy, batch axis first; for a model with several inputs, NAME=FILE.npy once per input",
    )
    parser.add_argument(
        "--explain",
        default="",
        metavar="NAME",
        help="the named input whose units are the players (the others are held)",
    )
    parser.add_argument(
        "--vocab",
        type=Path,
        help="with --players tokens: the vocabulary (one token per line, line i is id i, or a JSON list), "
        "so that the report names players by their words",
    )
    parser.add_argument(
        "--names",
        metavar="NAME,NAME,...|@FILE",
        help="the players' names in the report and the HTML page (features: one per feature; mask: one per "
        "label), comma-separated or @FILE with one per line",
    )
    parser.add_argument(
        "--embedding-tensor",
        default="",
        metavar="NAME",
        help="token inputs: the embedding output where gradient and rule methods attribute (default: found in the graph)",
    )
    parser.add_argument(
        "--players",
        default="auto",
        help="grid:RxC, grid:DxRxC (a volume), features, groups:FILE.json, mask:FILE.npy, windows:K (over the "
        "last axis; windows:K:axis=0 over the time of a (time, features) sequence, or the K tiles of a "
        "(K, C, H, W) stack), tokens "
        "or tokens:skip=P,P (default: grid:3x3 for images, grid:2x2x2 for volumes, features for up to 16 "
        "features)",
    )
    parser.add_argument(
        "--baseline",
        default="zeros",
        help="zeros (default), mean, blur[:SIGMA], constant:V, token:ID (token inputs) or FILE.npy",
    )
    parser.add_argument(
        "--background",
        type=Path,
        help="background set .npy (samples first) for expected_gradients, deepshap, prediction_difference",
    )
    parser.add_argument(
        "--target",
        default="predicted",
        help="predicted (logit of the predicted class, or a scalar output as is), class:K, prob[:K], logodds[:K], "
        "output:NAME[INDEX]; read from the model's first floating-point output (never a class label) "
        "unless output:NAME names another",
    )
    parser.add_argument(
        "--methods", default="all", help="all (the fourteen), all+extras, or a comma-separated list"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="METHOD.KEY=VALUE",
        help="a method parameter, e.g. integrated_gradients.steps=32 (repeatable)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the stochastic methods and the audit (default 0)"
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    if audit:
        parser.add_argument(
            "--audit-order",
            type=positive_int,
            default=3,
            help="largest set size judged set by set (default 3, at least 1)",
        )
        parser.add_argument(
            "--budget",
            default="",
            metavar="EVALUATIONS|SECONDSs",
            help="cap on the audit's work above 10 players: model evaluations (e.g. 2e6) or seconds on this "
            "device (e.g. 600s); sets are sampled to fit (default: up to 2048 sets per order)",
        )
        parser.add_argument(
            "--confidence",
            type=float,
            metavar="LEVEL",
            help="level of the criteria's confidence intervals, between 0.5 and 1 (default 0.95)",
        )
        parser.add_argument(
            "--tolerance",
            action="append",
            default=[],
            metavar="CRITERION=VALUE",
            help=f"override a tolerance ({', '.join(CRITERIA)}); defaults {dict(DEFAULT_TOLERANCES)}",
        )


def read_npy(path: Path, what: str) -> np.ndarray:
    try:
        import numpy as np

        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InvalidInput(f"{what} file not found: {path}") from None
    except Exception as exc:
        raise InvalidInput(
            f"{what} file {path} is not a readable .npy array ({type(exc).__name__})"
        ) from None


def read_file(path: Path, what: str) -> bytes:
    """A file's bytes, or one line naming ``what`` could not be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InvalidInput(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise InvalidInput(f"{what} file {path} cannot be read ({exc.strerror})") from None


# What a model file starts with: ONNX is a protobuf (first byte a field tag, 0x08 ir_version),
# TorchScript a zip archive ("PK").
_TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\r\n\t" for c in text)


def read_model(path: Path, *, sniff: bool = True) -> bytes:
    """The model's bytes; an ONNX model's external data files are read in from its directory.

    First a look at what they are (``sniff``): a text file or a .pt that is no TorchScript archive is
    named as such here, rather than reported later as a bad ONNX model. The gate and verify, which
    only compare the bytes with a signed report's subject, do not sniff."""
    data = read_file(path, "model")
    if sniff:
        _sniff_model(path, data)
    if data[:2] == b"PK":  # TorchScript
        return data
    from xaudit.contract.onnx_external import inline_external_data

    return inline_external_data(path, data)


def _sniff_model(path: Path, data: bytes) -> None:
    if not data:
        raise InvalidInput(f"model file {path} is empty")
    head = data[:512]
    if path.suffix.lower() in _TORCHSCRIPT_SUFFIXES and not data.startswith(b"PK"):
        kind = "a text file" if _looks_like_text(head) else "not a zip archive"
        raise InvalidInput(
            f"model file {path} is {kind}, not a TorchScript model (torch.jit.save writes a zip archive)"
        )
    if path.suffix.lower() == ".onnx" and _looks_like_text(head):
        raise InvalidInput(f"model file {path} is a text file, not an ONNX or TorchScript model")


def check_methods(text: str) -> None:
    """Unknown method names, with the nearest known one ("did you mean")."""
    import difflib

    from xaudit.contract.names import ALL_METHODS

    for name in (n.strip() for n in text.split(",")):
        if name and name not in ALL_METHODS and name not in ("all", "all+extras"):
            close = difflib.get_close_matches(name, ALL_METHODS, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(ALL_METHODS)}"
            from xaudit.contract.errors import UnknownMethod

            raise UnknownMethod(f"unknown method '{name}'{hint} (xaudit methods lists them)")


def read_inputs(items: list[str], explain: str) -> tuple[dict[str, np.ndarray], str]:
    """``--input`` values -> (job tensors, explained name): one unnamed FILE as ``inputs``; NAME=FILE
    pairs with the ``--explain`` one (or the only one) as ``inputs`` and the others as ``input:NAME``."""
    from xaudit.contract.inputs import input_key

    named: dict[str, Path] = {}
    plain: list[str] = []
    for item in items:
        name, sep, path = item.partition("=")
        if sep and name and not name.endswith(".npy"):
            if name in named:
                raise InvalidInput(f"--input {name}=... given twice")
            named[name] = Path(path)
        else:
            plain.append(item)
    if plain and (named or len(plain) > 1):
        raise InvalidInput("several inputs must be named: --input NAME=FILE.npy for each")
    if plain:
        if explain:
            raise InvalidInput(f"--explain {explain}: name the inputs, --input {explain}=FILE.npy")
        return {"inputs": read_npy(Path(plain[0]), "input")}, ""
    if not explain:
        if len(named) > 1:
            raise InvalidInput(f"{len(named)} named inputs: pick the explained one with --explain NAME")
        explain = next(iter(named))
    if explain not in named:
        raise InvalidInput(f"--explain {explain} names no input given (inputs: {', '.join(named)})")
    tensors = {"inputs": read_npy(named[explain], f"input '{explain}'")}
    for name, held in named.items():
        if name != explain:
            tensors[input_key(name)] = read_npy(held, f"input '{name}'")
    return tensors, explain


def read_vocab(path: Path) -> list[str]:
    """A vocabulary file: a JSON list of tokens, or one token per line (line i is id i)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"vocabulary file not found: {path}") from None
    except (OSError, UnicodeDecodeError):
        raise InvalidInput(f"vocabulary file {path} is not readable UTF-8 text") from None
    if text.lstrip().startswith("["):
        try:
            words = json.loads(text)
        except json.JSONDecodeError:
            raise InvalidInput(f"vocabulary file {path} is not a JSON list of tokens") from None
        return [str(w) for w in words]
    return text.splitlines()


def read_names(text: str) -> tuple[str, ...]:
    """``--names a,b,c`` or ``--names @FILE`` (one name per line)."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise InvalidInput(f"names file not found: {path}") from None
        except (OSError, UnicodeDecodeError):
            raise InvalidInput(f"names file {path} is not readable UTF-8 text") from None
        names = [line.strip() for line in lines if line.strip()]
    else:
        names = [n.strip() for n in text.split(",")]
    if not names or any(not n for n in names):
        raise InvalidInput(f"--names '{text}': empty names")
    if len(set(names)) != len(names):
        raise InvalidInput(f"--names '{text}': names must differ")
    return tuple(names)


def parse_budget(text: str) -> tuple[int, float]:
    """``--budget``: model evaluations (``2e6``) or seconds (``600s``, ``10m``) -> (evaluations, seconds)."""
    text = text.strip().lower()
    if not text:
        return 0, 0.0
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(text[-1])
    try:
        number = float(text[:-1] if scale else text)
    except ValueError:
        number = -1.0
    if not number > 0 or number != number or number == float("inf"):
        raise InvalidInput(f"--budget '{text}': expected model evaluations (e.g. 2e6) or seconds (e.g. 600s)")
    return (0, number * scale) if scale else (int(number), 0.0)


def job_from_args(args: argparse.Namespace, kind: str) -> tuple[JobSpec, dict[str, np.ndarray]]:
    """The spec and attached tensors for the options in ``args``; files are read here, once."""
    from xaudit.contract.spec import resolve_method_names

    check_methods(args.methods)
    tensors, explain = read_inputs(args.input, args.explain)
    players = args.players
    player_spec = parse_players(players)  # the one parser of the players string
    group_names: tuple[str, ...] = ()
    if player_spec.kind == "groups":
        path = Path(player_spec.source)
        try:
            raw = json.loads(path.read_text())
            import numpy as np

            tensors["player_groups"] = np.asarray(raw["groups"], dtype=np.int64)
        except FileNotFoundError:
            raise InvalidInput(f"group file not found: {path}") from None
        except (ValueError, KeyError, TypeError):
            raise InvalidInput(
                f'group file {path} must be JSON {{"groups": [...], "names": [...]}}'
            ) from None
        group_names = tuple(str(n) for n in raw.get("names", []))
    elif player_spec.kind == "mask":
        tensors["player_mask"] = read_npy(Path(player_spec.source), "player mask")
    if getattr(args, "vocab", None) is not None:
        if player_spec.kind != "tokens":
            raise InvalidInput("--vocab names token players: use it with --players tokens")
        from workers.tokens import token_names

        group_names = token_names(tensors["inputs"], read_vocab(args.vocab))
    if getattr(args, "names", None):
        if group_names:
            raise InvalidInput(
                "--names: the players are already named (by the group file or --vocab); give one"
            )
        group_names = read_names(args.names)
    baseline = args.baseline
    if baseline.endswith(".npy"):
        tensors["baseline"] = read_npy(Path(baseline), "baseline")
        baseline = "tensor"
    if args.background is not None:
        tensors["background"] = read_npy(args.background, "background")
    params: dict[str, dict[str, Any]] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        method, dot, name = key.partition(".")
        if not sep or not dot:
            raise InvalidInput(f"--param '{item}': expected METHOD.KEY=VALUE")
        params.setdefault(method, {})[name] = parse_param_text(key, value)
    methods = resolve_method_names(args.methods)
    unknown = sorted(set(params) - set(methods))
    if unknown:
        raise InvalidInput(f"--param names methods that are not requested: {', '.join(unknown)}")
    tolerances: dict[str, float] = {}
    for item in getattr(args, "tolerance", []):
        name, sep, value = item.partition("=")
        if not sep or name not in CRITERIA:
            raise InvalidInput(
                f"--tolerance '{item}': expected CRITERION=VALUE with one of {', '.join(CRITERIA)}"
            )
        try:
            tolerances[name] = float(value)
        except ValueError:
            raise InvalidInput(f"--tolerance '{item}': value must be a number") from None
    evaluations, seconds = parse_budget(getattr(args, "budget", ""))
    given = getattr(args, "confidence", None)
    confidence = JobSpec.confidence if given is None else float(given)  # the spec's default
    # JobSpec checks every option (bounds included) as the service and the worker do.
    spec = JobSpec(
        kind=kind,  # type: ignore[arg-type]
        players=players,
        baseline=baseline,
        target=args.target,
        methods=methods,
        method_params=params,
        audit_order=getattr(args, "audit_order", 3),
        budget_evaluations=evaluations,
        budget_seconds=seconds,
        tolerances=tolerances,
        confidence=confidence,
        seed=args.seed,
        device=args.device,
        group_names=group_names,
        explain=explain,
        embedding_tensor=args.embedding_tensor,
    )
    return spec, tensors
