"""``xaudit token create|list|revoke|prune``: mint a bearer token (printed once; the tokens file keeps
only its sha256), optionally with an expiry, list the file's tokens by id, remove one, remove the
expired ones. A running server re-reads the file: no restart."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clients.cli.arg_types import duration

__all__ = ["register", "run_create", "run_list", "run_prune", "run_revoke"]


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
    create.add_argument(
        "--expires-in",
        type=duration,
        metavar="DURATION",
        help="the token stops working this long from now: 90d, 12h, 30m, 45s (default: never)",
    )
    create.set_defaults(func=run_create)
    listing = verbs.add_parser(
        "list", help="list the tokens in a tokens file: id, tenant, scopes, creation, expiry, limits"
    )
    listing.add_argument("--tokens", required=True, type=Path, help="tokens file (YAML)")
    listing.add_argument("--json", action="store_true", help="one JSON object per token, one per line")
    listing.set_defaults(func=run_list)
    revoke = verbs.add_parser(
        "revoke",
        help="remove a token; a running server refuses it from its next call",
        description="Names the token by its id (xaudit token list) or by the token itself, "
        "e.g. one that leaked.",
    )
    revoke.add_argument("token", metavar="ID|TOKEN", help="the token's id (8+ hex digits) or the token")
    revoke.add_argument("--tokens", required=True, type=Path, help="tokens file (YAML)")
    revoke.set_defaults(func=run_revoke)
    prune = verbs.add_parser("prune", help="remove every expired token (a server already refuses them)")
    prune.add_argument("--tokens", required=True, type=Path, help="tokens file (YAML)")
    prune.set_defaults(func=run_prune)


def run_create(args: argparse.Namespace) -> int:
    import time

    from service.tokens import create_token, utc

    def names(text: str | None) -> list[str] | None:
        return None if text is None else [n.strip() for n in text.split(",") if n.strip()]

    now = time.time()  # the stored expiry and the one shown count from the same instant
    token = create_token(
        args.tokens,
        args.tenant,
        args.scopes,
        names(args.queues),
        names(args.job_tenants),
        args.expires_in,
        now,
    )
    print(token)
    until = "" if args.expires_in is None else f"; it expires at {utc(now + args.expires_in)} UTC"
    print(
        f"xaudit: token for tenant '{args.tenant}' stored (hashed) in {args.tokens}{until}", file=sys.stderr
    )
    return 0


def run_list(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import time

    from clients._columns import aligned
    from service.tokens import list_tokens, utc

    entries = list_tokens(args.tokens)
    if args.json:
        for entry in entries:
            print(json.dumps(dataclasses.asdict(entry)))
        return 0
    if not entries:
        print(f"no tokens in {args.tokens}", file=sys.stderr)
        return 0
    now = time.time()
    rows = [("ID", "TENANT", "SCOPES", "CREATED (UTC)", "EXPIRES (UTC)", "LIMITS")]
    for e in entries:
        created = utc(e.created_at) if e.created_at is not None else "-"
        expires = (
            "never" if e.expires_at is None else utc(e.expires_at) + (" expired" if e.expired(now) else "")
        )
        limits = "; ".join(
            f"{label} {','.join(values)}"
            for label, values in (("queues", e.queues), ("job tenants", e.job_tenants))
            if values is not None
        )
        rows.append((e.id, e.tenant, ",".join(e.scopes), created, expires, limits or "-"))
    print("\n".join(aligned(rows)))
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from service.tokens import revoke_token

    entry = revoke_token(args.tokens, args.token)
    print(
        f"xaudit: token {entry.id} of tenant '{entry.tenant}' ({','.join(entry.scopes)}) removed from "
        f"{args.tokens}; a running server refuses it from its next call",
        file=sys.stderr,
    )
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from service.tokens import prune_tokens, utc

    removed = prune_tokens(args.tokens)
    for entry in removed:
        assert entry.expires_at is not None
        print(f"removed {entry.id} of tenant '{entry.tenant}', expired at {utc(entry.expires_at)} UTC")
    print(f"xaudit: {len(removed)} expired token(s) removed from {args.tokens}", file=sys.stderr)
    return 0
