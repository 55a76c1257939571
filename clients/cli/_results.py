"""Follow a job to its end with a progress bar and write what it produced (submit, report, demo)."""

from __future__ import annotations

import sys
from pathlib import Path

from clients._types import Job
from clients.cli._files import write_npz
from clients.client import XauditClient
from xaudit.contract.errors import Cancelled

__all__ = ["follow", "write_result"]


def follow(client: XauditClient, job: Job, label: str) -> Job:
    """Watch ``job`` to its terminal state; the project error it failed with, or Cancelled."""
    from clients.cli.progress import progress_bar

    try:
        with progress_bar(label) as update:
            for update_ in client.watch(job.id):
                job = update_
                update(job.progress, job.message or job.state)
    except KeyboardInterrupt:
        # The job is the server's now; say how to find it again rather than cancelling it.
        print(
            f"\njob {job.id} continues on the server: xaudit status {job.id} --server {client.address}",
            file=sys.stderr,
        )
        raise
    error = job.error()
    if error is not None:
        raise error
    if job.state == "cancelled":
        raise Cancelled(f"job {job.id} was cancelled")
    return job


def write_result(client: XauditClient, job: Job, out: Path) -> None:
    """Audits: the exact report bytes. Attribution jobs: an .npz, one array per method plus targets."""
    if job.kind == "attribution":
        result = client.get_attribution_result(job.id)
        arrays = dict(result.attributions)
        if result.target_values is not None:
            arrays["target_values"] = result.target_values
        if result.target_classes is not None:
            arrays["target_classes"] = result.target_classes
        write_npz(out, arrays)
        for name, reason in result.not_applicable.items():
            print(f"{name}: not applicable: {reason}", file=sys.stderr)
        return
    out.write_bytes(client.get_report(job.id))
