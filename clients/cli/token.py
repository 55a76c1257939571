"""``xaudit token create``: mint a bearer token; print it once, store only its sha256 in the tokens file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register", "run_create"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("token", help="manage the service's bearer tokens (stored hashed)")
    verbs = parser.add_subparsers(dest="token_command", metavar="VERB", required=True)
    create = verbs.add_parser(
        "create",
        help="create a token for a tenant; prints it once (only its hash is kept)",
        description="Prints the new token on stdout, once: give it to the client as $XAUDIT_TOKEN "
        "(or to a worker as $XAUDIT_WORKER_TOKEN). The tokens file keeps only its sha256.",
    )
    create.add_argument("--tenant", required=True, help="tenant the token acts for")
    create.add_argument(
        "--scopes",
        default="submit,read",
        help="comma-separated: submit, read, admin, worker (default submit,read)",
    )
    create.add_argument("--tokens", required=True, type=Path, help="tokens file (YAML; created if missing)")
    create.add_argument(
        "--queues", help="worker tokens: take only jobs of these comma-separated queues (default: any)"
    )
    create.add_argument(
        "--job-tenants", help="worker tokens: take only these comma-separated tenants' jobs (default: any)"
    )
    create.set_defaults(func=run_create)


def run_create(args: argparse.Namespace) -> int:
    from service.tokens import create_token

    def names(text: str | None) -> list[str] | None:
        return None if text is None else [n.strip() for n in text.split(",") if n.strip()]

    token = create_token(args.tokens, args.tenant, args.scopes, names(args.queues), names(args.job_tenants))
    print(token)
    print(f"xaudit: token for tenant '{args.tenant}' stored (hashed) in {args.tokens}", file=sys.stderr)
    return 0
