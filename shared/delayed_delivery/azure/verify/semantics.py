"""Storage semantics the design leans on, asked of the account itself on temporary resources.

* Blob leases last 15 to 60 seconds or are infinite: 14 and 61 are refused, 15 and 60 accepted, a second holder is
  refused while the lease is held, a renewal keeps it. With ``--full`` (in an account) a 15 s lease left alone
  expires, so a dead dispatcher is replaced.
* A queue message may stay invisible for up to 7 days: 604,800 s is accepted (and the message stays hidden),
  604,801 s is refused.

The temporary blob and queue are deleted whatever happens. On an emulator the answers are shown but prove nothing
about Azure: the checks say so ("needs a real account").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from azure.core.exceptions import AzureError, HttpResponseError
from azure.storage.blob import BlobLeaseClient

from ...verification import CheckResult, Group, Mode, failed, needs_account, passed, skipped
from ..blob_lease import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from ..sdk_errors import translate
from ..storage_queue import MAX_NATIVE_DELAY_SECONDS
from .context import AzureVerifyContext

__all__ = ["lease_semantics", "visibility_semantics"]

B = Group.BEHAVIOUR


def _answer(call: Callable[[], object]) -> str:
    """``accepted`` or the status the service refused with."""
    try:
        call()
    except HttpResponseError as exc:
        return f"refused ({exc.status_code})"
    return "accepted"


def _lease_answers(ctx: AzureVerifyContext) -> dict[str, str]:
    container = ctx.clients.blobs.get_container_client(ctx.target.config.container_name)
    blob = container.get_blob_client(f"verify-lease-{ctx.run_id}")
    blob.upload_blob(b"", overwrite=True)
    ctx.cleanup.add(f"the temporary blob {blob.blob_name}", lambda: _delete_leased(blob))
    answers = {
        f"{MIN_LEASE_SECONDS - 1} s": _answer(lambda: BlobLeaseClient(blob).acquire(MIN_LEASE_SECONDS - 1)),
        f"{MAX_LEASE_SECONDS + 1} s": _answer(lambda: BlobLeaseClient(blob).acquire(MAX_LEASE_SECONDS + 1)),
    }
    held = BlobLeaseClient(blob, lease_id=str(uuid.uuid4()))
    answers[f"{MIN_LEASE_SECONDS} s"] = _answer(lambda: held.acquire(MIN_LEASE_SECONDS))
    answers["second holder"] = _answer(lambda: BlobLeaseClient(blob, lease_id=str(uuid.uuid4())).acquire(15))
    answers["renewal"] = _answer(held.renew)
    if ctx.mode is Mode.FULL and not ctx.target.local:
        ctx.progress(f"waiting {MIN_LEASE_SECONDS + 2} s for a {MIN_LEASE_SECONDS} s lease to expire")
        ctx.clock.sleep(MIN_LEASE_SECONDS + 2)
        held = BlobLeaseClient(blob, lease_id=str(uuid.uuid4()))
        answers["after expiry, a new holder"] = _answer(lambda: held.acquire(MIN_LEASE_SECONDS))
    held.release()
    longest = BlobLeaseClient(blob, lease_id=str(uuid.uuid4()))
    answers[f"{MAX_LEASE_SECONDS} s"] = _answer(lambda: longest.acquire(MAX_LEASE_SECONDS))
    return answers


def _delete_leased(blob: object) -> None:
    """Delete the blob, breaking any lease on it first."""
    BlobLeaseClient(blob).break_lease(lease_break_period=0)  # type: ignore[arg-type]
    blob.delete_blob()  # type: ignore[attr-defined]


_LEASE_EXPECTED = {
    f"{MIN_LEASE_SECONDS - 1} s": "refused",
    f"{MAX_LEASE_SECONDS + 1} s": "refused",
    f"{MIN_LEASE_SECONDS} s": "accepted",
    "second holder": "refused",
    "renewal": "accepted",
    "after expiry, a new holder": "accepted",
    f"{MAX_LEASE_SECONDS} s": "accepted",
}


def lease_semantics(ctx: AzureVerifyContext) -> CheckResult:
    """Leases of 15-60 s, exclusive while held, renewable (and expiring, with ``--full``)."""
    if "container" in ctx.missing:
        return skipped(
            "lease-semantics", B, "blob lease", "the lease container does not exist (the lease-container check)"
        )
    try:
        answers = _lease_answers(ctx)
    except AzureError as exc:
        error = translate(exc, "the temporary lease blob")
        return failed(
            "lease-semantics",
            B,
            "blob lease",
            f"the probe could not run: {error}",
            "give the identity running verify Storage Blob Data Contributor on the lease container",
        )
    evidence = "; ".join(f"{k}: {v}" for k, v in answers.items())
    if ctx.target.local:
        return needs_account("lease-semantics", B, "blob lease", f"will ask Azure; the emulator answered: {evidence}")
    wrong = [k for k, v in answers.items() if k in _LEASE_EXPECTED and not v.startswith(_LEASE_EXPECTED[k])]
    if wrong:
        return failed(
            "lease-semantics",
            B,
            "blob lease",
            f"{evidence}; unexpected: {', '.join(wrong)}",
            "the dispatcher's one-holder-per-shard rule depends on these: report it, and run with shards=1",
        )
    return passed("lease-semantics", B, "blob lease", evidence)


def visibility_semantics(ctx: AzureVerifyContext) -> CheckResult:
    """A message may be hidden for up to 7 days on a queue, not a second more."""
    name = f"delayed-delivery-verify-{ctx.run_id}"[:63]
    queue = ctx.clients.queues.get_queue_client(name)
    try:
        queue.create_queue()
        ctx.cleanup.add(f"the temporary queue {name}", queue.delete_queue)
        longest = _answer(
            lambda: queue.send_message("verify", visibility_timeout=MAX_NATIVE_DELAY_SECONDS, time_to_live=-1)
        )
        beyond = _answer(
            lambda: queue.send_message("verify", visibility_timeout=MAX_NATIVE_DELAY_SECONDS + 1, time_to_live=-1)
        )
        hidden = not list(queue.peek_messages(max_messages=1))
    except AzureError as exc:
        error = translate(exc, f"the temporary queue {name}")
        return failed(
            "visibility-7d",
            B,
            name,
            f"the probe could not run: {error}",
            "give the identity running verify Storage Queue Data Contributor on the delays account's "
            "delayed-delivery-verify-* queues (docs/verify.md)",
        )
    evidence = (
        f"{MAX_NATIVE_DELAY_SECONDS} s: {longest}{' and hidden' if hidden else ''}; "
        f"{MAX_NATIVE_DELAY_SECONDS + 1} s: {beyond}"
    )
    if ctx.target.local:
        return needs_account("visibility-7d", B, "queue", f"will ask Azure; the emulator answered: {evidence}")
    if longest != "accepted" or not hidden:
        return failed(
            "visibility-7d",
            B,
            "queue",
            evidence,
            "set DELAYED_DELIVERY_MAX_NATIVE_DELAY below what was accepted, so longer delays go through the table",
        )
    return passed("visibility-7d", B, "queue", evidence)
