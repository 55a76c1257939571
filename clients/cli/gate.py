"""``xaudit gate``: the CI model-governance gate.

Submits an audit (or reuses the finished one through the idempotency key), waits for it, verifies the
signed report (keys from the server's GetSigningKeys unless ``--key`` pins them), checks that the
report is about exactly the given model and inputs, and applies the policy.

Exit 0: the policy passes. 1: a policy violation. 3: a signed report that does not verify (or is not
about the given model and inputs). 2: any other error (unreachable server, malformed policy,
a failed job). Errors are always one line on stderr (exit statuses: xaudit.contract.errors).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xaudit.contract.errors import EXIT_VIOLATION

if TYPE_CHECKING:
    import numpy as np

    from xaudit.contract.spec import JobSpec

__all__ = ["EXIT_VIOLATION", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option
    from clients.cli.options import add_job_options

    parser = sub.add_parser("gate", help="audit a model on a server and pass or fail it against a policy")
    add_server_option(parser)
    parser.add_argument("--policy", required=True, type=Path, help="policy YAML (see deploy/policies/)")
    add_job_options(parser, audit=True)
    parser.add_argument(
        "--key",
        action="append",
        default=[],
        type=Path,
        metavar="PUB.pem",
        help="pin the accepted signing keys (repeatable) instead of trusting the server's GetSigningKeys",
    )
    parser.add_argument("--junit", type=Path, help="write JUnit XML here (one test case per audited method)")
    parser.add_argument(
        "--summary", type=Path, help="write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)"
    )
    parser.add_argument("--envelope-out", type=Path, help="also keep the signed report here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients.cli._files import check_writable
    from clients.cli.options import job_from_args, read_model
    from clients.policy import evaluate, load_policy
    from clients.verify import (
        check_inputs_subject,
        check_model_subject,
        load_public_key_file,
        looks_unsigned,
        verify_envelope,
    )
    from xaudit.contract.errors import InvalidInput, VerificationError
    from xaudit.contract.spec import tensor_digest

    # Everything local first: a bad policy or a missing file fails before any network call.
    policy = load_policy(args.policy)
    pinned = [load_public_key_file(path) for path in args.key]
    for path in (args.junit, args.summary, args.envelope_out):
        check_writable(path)
    if args.methods != "all":
        raise InvalidInput("gate: methods come from the policy's 'audit' key; drop --methods")
    if args.tolerance:
        raise InvalidInput("gate: tolerances come from the policy's 'tolerances' key; drop --tolerance")
    if args.confidence is not None and policy.confidence is not None:
        raise InvalidInput(
            "gate: the confidence level comes from the policy's 'confidence' key; drop --confidence"
        )
    spec, tensors = job_from_args(args, "audit")
    stray = sorted(set(spec.method_params) - set(policy.audit))
    if stray:
        raise InvalidInput(f"gate: --param names methods the policy does not audit: {', '.join(stray)}")
    spec = dataclasses.replace(spec, methods=policy.audit, tolerances=policy.audit_tolerances())
    if policy.confidence is not None:  # the intervals at the level the policy asks for
        spec = dataclasses.replace(spec, confidence=policy.confidence)
    model = read_model(args.model, sniff=False)
    inputs_sha256 = tensor_digest(tensors["inputs"])

    envelope, server_keys = _audit_on_server(args, model, spec, tensors, fetch_keys=not pinned)
    if args.envelope_out is not None:
        args.envelope_out.write_bytes(envelope)
    if looks_unsigned(envelope):
        raise VerificationError(
            "the server returned an unsigned report; the gate accepts signed reports only"
        )
    try:
        verified = verify_envelope(envelope, pinned or server_keys)
        check_model_subject(verified.statement, model)
        check_inputs_subject(verified.statement, inputs_sha256)
        _check_config(verified.report, policy.audit_tolerances())
    except VerificationError as exc:
        raise VerificationError(f"the signed report does not verify: {exc}") from None

    outcome = evaluate(policy, verified.report)
    if args.junit is not None:
        from clients.junit import write_junit

        write_junit(args.junit, outcome, verified.report)
    if args.summary is not None:
        from clients.summary import gate_markdown

        args.summary.write_text(gate_markdown(outcome, verified.report, verified.key_id), encoding="utf-8")
    for m in outcome.methods:
        line = f"{m.label:7} {m.method} ({m.verdict}{', required' if m.required else ', not required'})"
        print(line)
        if m.status == "failed":
            for c in m.failing:
                print(f"        {c.describe()}")
    if outcome.passed:
        print(f"gate passed: report signed by key {verified.key_id}")
        return 0
    names = ", ".join(m.method for m in outcome.failed)
    print(f"xaudit: gate failed: {names}", file=sys.stderr)
    return EXIT_VIOLATION


def _check_config(report: Mapping[str, Any], tolerances: Mapping[str, float]) -> None:
    """The signed report must have been judged with the policy's tolerances, not the server's whim."""
    from xaudit.contract.errors import VerificationError

    used = report.get("config", {}).get("tolerances", {}) if isinstance(report.get("config"), dict) else {}
    for name, value in tolerances.items():
        if name in used and abs(float(used[name]) - value) > 1e-12:
            raise VerificationError(f"the report used tolerance {name}={used[name]}, the policy asks {value}")


def _audit_on_server(
    args: argparse.Namespace,
    model: bytes,
    spec: JobSpec,
    tensors: Mapping[str, np.ndarray],
    *,
    fetch_keys: bool,
) -> tuple[bytes, list[str]]:
    """Upload, submit (an identical earlier audit is reused by the server's idempotency key), follow
    the job, and fetch the envelope and, unless pinned, the keys."""
    from clients._connect import client_from_args
    from clients.cli._results import follow
    from clients.cli.keys import fetch_keys as _fetch_keys

    with client_from_args(args) as client:
        ref = client.upload_model(model, name=args.model.name)
        job = client.submit_audit(ref, spec, tensors)
        print(f"job {job.id} ({job.state}) on {client.address}", file=sys.stderr)
        job = follow(client, job, "audit")
        envelope = client.get_report(job.id)
        keys = [pem for _, pem in _fetch_keys(client)] if fetch_keys else []
    return envelope, keys
