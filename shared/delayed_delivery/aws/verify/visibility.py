"""The 12-hour visibility rule, asked of the account itself on a temporary queue.

Parking relies on it: a ``ChangeMessageVisibility`` counts from the call, and the total cannot pass 12 hours from
the receive. The probe receives a message, changes its visibility to 12 hours less a margin (parking's longest park
must be accepted), then asks for a full 12 hours from now (past the limit: it must be refused). The queue and the
message are deleted again whatever happens.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from ...planning import MAX_PARK_SECONDS, MAX_VISIBILITY_TIMEOUT
from ...verification import CheckResult, Group, failed, needs_account, passed, warned
from ..sqs import translate_error
from .context import AwsVerifyContext

__all__ = ["visibility_rule"]

B = Group.BEHAVIOUR
CHECK = "probe-visibility-12h"


def _change(ctx: AwsVerifyContext, url: str, handle: str, seconds: int) -> str | None:
    """None when the change is accepted, else the account's answer."""
    try:
        ctx.clients.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=seconds)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        return f"{error.get('Code', '?')}: {' '.join(str(error.get('Message', '')).split())}"
    return None


def _answers(ctx: AwsVerifyContext, name: str) -> tuple[str | None, str | None] | None:
    """Create the queue, send, receive, ask twice; the two answers (None: the message never came back)."""
    sqs = ctx.clients.sqs
    url = sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
    ctx.cleanup.add(f"the temporary queue {name}", lambda: sqs.delete_queue(QueueUrl=url))
    sqs.send_message(QueueUrl=url, MessageBody="visibility probe")
    messages = []
    for _ in range(5):
        messages = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, VisibilityTimeout=60).get("Messages", [])
        if messages:
            break
    if not messages:
        return None
    handle = messages[0]["ReceiptHandle"]
    longest = _change(ctx, url, handle, MAX_PARK_SECONDS)
    beyond = _change(ctx, url, handle, MAX_VISIBILITY_TIMEOUT)
    return longest, beyond


def visibility_rule(ctx: AwsVerifyContext) -> CheckResult:
    """Parking's longest park is accepted after a receive; 12 hours more from a later call is refused."""
    name = f"delayed-delivery-verify-{ctx.run_id}"
    fix = "give the role running verify sqs:CreateQueue/DeleteQueue on delayed-delivery-verify-*"
    try:
        found = _answers(ctx, name)
    except (ClientError, BotoCoreError) as exc:
        error = translate_error(exc, f"the temporary queue {name}")
        return failed(CHECK, B, name, f"the probe could not run: {error}", fix)
    if found is None:
        return failed(
            CHECK,
            B,
            name,
            "the message sent to the temporary queue was not received back in 5 s",
            "run it again; if it persists, SQS is degraded in this region",
        )
    longest, beyond = found
    answer = (
        f"{MAX_PARK_SECONDS} s after the receive: {'accepted' if longest is None else 'refused (' + longest + ')'}; "
        f"{MAX_VISIBILITY_TIMEOUT} s more: {'accepted' if beyond is None else 'refused (' + beyond + ')'}"
    )
    data = {"longest_park_accepted": longest is None, "beyond_12h_refused": beyond is not None}
    if ctx.target.local:
        return needs_account(CHECK, B, "SQS", f"will ask the account; the emulator answered: {answer}", **data)
    if longest is not None:
        return failed(
            CHECK,
            B,
            "SQS",
            f"{answer}: parks of {MAX_PARK_SECONDS} s would be refused",
            "lower DELAYED_DELIVERY_MAX_PARK_SECONDS (context maxParkSeconds) below what was accepted, or "
            "set it to 0 to turn parking off",
            **data,
        )
    if beyond is None:
        return warned(
            CHECK,
            B,
            "SQS",
            f"{answer}: the account accepts more than the documented 12 hours",
            "nothing to change: parks stay within 12 hours; report it if it persists",
            **data,
        )
    return passed(CHECK, B, "SQS", answer, **data)
