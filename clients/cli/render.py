"""``xaudit render``: a report (plain JSON or signed envelope) as one self-contained HTML page.

Also the ``--html`` option that ``xaudit audit`` and ``xaudit submit`` share (:func:`add_html_option`,
:func:`html_for_job`). Exit 0: written. 3: an envelope that does not verify with the given key (never
rendered as if it were fine). 2: usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xaudit.contract.errors import EXIT_UNVERIFIED

if TYPE_CHECKING:
    import numpy as np

    from clients.client import XauditClient

__all__ = ["EXIT_INVALID", "add_html_option", "group_labels", "html_for_job", "register", "run"]

EXIT_INVALID = EXIT_UNVERIFIED  # 3: the report does not verify (xaudit.contract.errors)


def add_html_option(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--html",
        type=Path,
        required=required,
        metavar="OUT.html",
        help="write the report as one self-contained HTML page (verdicts, heatmaps, interactions, allocation)",
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("render", help="render a report or signed envelope as a self-contained HTML page")
    parser.add_argument(
        "report", type=Path, help="xaudit.report JSON (v2, or v1 from older runs) or a signed envelope (DSSE)"
    )
    parser.add_argument(
        "--attributions",
        type=Path,
        metavar="A.npz",
        help="attribution maps of the audited inputs (one array per method)",
    )
    parser.add_argument(
        "--input", type=Path, metavar="X.npy", help="the audited inputs, drawn under the heatmaps"
    )
    parser.add_argument(
        "--key",
        action="append",
        type=Path,
        default=[],
        metavar="PUB.pem",
        help="verify the envelope with this Ed25519 public key (repeatable); without one the page says "
        "'signature not checked'",
    )
    parser.add_argument(
        "--groups",
        type=Path,
        metavar="FILE.json",
        help='the group file of a groups:FILE.json audit ({"groups": [...], "names": [...]}), to sum features per group',
    )
    parser.add_argument(
        "--vocab",
        type=Path,
        help="a token model's vocabulary (one token per line or a JSON list), to show the inputs as text",
    )
    add_html_option(parser, required=True)
    parser.set_defaults(func=run)


def group_labels(tensors: Mapping[str, Any]) -> np.ndarray | None:
    """The element-to-player map of a groups:FILE.json job, as the workers number the groups."""
    import numpy as np

    groups = tensors.get("player_groups")
    if groups is None:
        return None
    return np.unique(np.asarray(groups).ravel(), return_inverse=True)[1]


def _read_attributions(path: Path) -> dict[str, np.ndarray]:
    import numpy as np

    from xaudit.contract.errors import InvalidInput

    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise InvalidInput(f"attributions file not found: {path}") from None
    except Exception as exc:
        raise InvalidInput(
            f"attributions file {path} is not a readable .npz ({type(exc).__name__})"
        ) from None


def _read_groups(path: Path) -> np.ndarray | None:
    import numpy as np

    from clients.cli.options import read_file
    from xaudit.contract.errors import InvalidInput

    try:
        raw = json.loads(read_file(path, "group"))
        return group_labels({"player_groups": np.asarray(raw["groups"], dtype=np.int64)})
    except (ValueError, KeyError, TypeError):
        raise InvalidInput(f'group file {path} must be JSON {{"groups": [...], "names": [...]}}') from None


def run(args: argparse.Namespace) -> int:
    from clients.cli.options import read_file, read_npy
    from clients.render import read_report, write_html
    from clients.verify import load_public_key_file
    from xaudit.contract.errors import InvalidInput, VerificationError
    from xaudit.contract.spec import tensor_digest

    keys = [load_public_key_file(path) for path in args.key]
    data = read_file(args.report, "report")
    try:
        report, status = read_report(data, keys)
    except VerificationError as exc:
        print(f"xaudit: invalid: {exc}", file=sys.stderr)
        return EXIT_INVALID
    attributions = _read_attributions(args.attributions) if args.attributions is not None else None
    inputs = None
    if args.input is not None:
        inputs = read_npy(args.input, "input")
        expected = (report.get("inputs") or {}).get("sha256")
        # Heatmaps over other images than the audited ones would mislead: refuse them.
        if expected and tensor_digest(inputs) != expected:
            raise InvalidInput(
                f"{args.input} is not the report's audited inputs (digest {str(expected)[:16]}...)"
            )
    labels = _read_groups(args.groups) if args.groups is not None else None
    vocab = None
    if args.vocab is not None:
        from clients.cli.options import read_vocab

        vocab = read_vocab(args.vocab)
    write_html(
        args.html,
        report,
        attributions=attributions,
        inputs=inputs,
        signature=status,
        player_labels=labels,
        vocab=vocab,
    )
    print(f"{status.headline}; wrote {args.html}", file=sys.stderr)
    return 0


def html_for_job(
    client: XauditClient, job_id: str, envelope: bytes, tensors: Mapping[str, np.ndarray], out: Path
) -> None:
    """``--html`` for ``xaudit submit``: the job's signed report with its attribution maps, verified
    against the keys the server publishes (the page says so: trust in that key is the reader's call)."""
    from dataclasses import replace

    from clients.render import read_report, write_html

    keys = [k.public_key_pem for k in client.signing_keys()]
    report, status = read_report(envelope, keys)
    if status.state == "verified":
        status = replace(
            status,
            detail="verified against the signing key the server publishes; compare the key id with one you trust",
        )
    write_html(
        out,
        report,
        attributions=client.get_attributions(job_id),
        inputs=tensors.get("inputs"),
        signature=status,
        player_labels=group_labels(tensors),
    )
