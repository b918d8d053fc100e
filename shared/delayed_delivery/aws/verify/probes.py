"""Behaviour probes of ``aws verify``: real messages through each route of the probe endpoint, and what came back.

Every probe is sent at the start, then one loop receives from the probe endpoint's input queue until each has
arrived (and its duplicate watch is over) or its deadline passed. ``--quick`` sends the native probe (30 s);
``--full`` adds one through ``-delay.fifo`` (one hop, about 16 minutes), one through the time-bucket tier (due in
about 12 minutes), one cancelled and one rescheduled. Each probe is one check: it arrived, with its body and
attributes intact, how late, exactly once; a cancelled one never arrives. A probe that does not arrive is looked
for where it may be stuck, and the finding says where and what to fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...cancellations import cancel_request, reschedule_request
from ...errors import DelayedDeliveryError
from ...headers import FAILURE_REASON
from ...verification import (
    Arrival,
    CheckResult,
    Group,
    Mode,
    Probe,
    failed,
    judge_probe,
    probe_progress,
    skipped,
    span,
)
from ..cancellations import DynamoDbCancellationStore
from ..config import CACHE_SECONDS_ENV, DEFAULT_CACHE_SECONDS
from ..receive import delivered_from_boto3
from ..sender import SqsDelayedSender
from ..sqs import normalize_attributes, translate_error
from .context import AwsVerifyContext
from .target import EndpointTarget

__all__ = ["PROBE_ID_PREFIX", "run_probes"]

B = Group.BEHAVIOUR
#: Every probe message id starts with this (and the run id), so probes of an earlier, interrupted run are known.
PROBE_ID_PREFIX = "verify-"
#: Text that SQS must carry unchanged: non-ASCII letters, a symbol outside the BMP, quotes and a newline.
_PROBE_TEXT = 'zażółć gęślą jaźń ✓ 😀 "quoted"\nsecond line'


def _probe_attributes(kind: str) -> dict[str, Any]:
    """Three typed attributes that must arrive as sent (String, Number, Binary)."""
    return {"probe-kind": kind, "probe-number": 42.5, "probe-bytes": b"\x00\x01\xfe\xff"}


def _comparable(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Typed attributes as ``{name: "DataType:value"}`` (binary values in hex), for comparing sent and received."""
    found = {}
    for name, value in attributes.items():
        raw = value.get("StringValue", value.get("BinaryValue"))
        text = bytes(raw).hex() if isinstance(raw, bytes | bytearray) else str(raw)
        found[name] = f"{value.get('DataType')}:{text}"
    return found


def _body(message_id: str) -> str:
    return json.dumps({"probe": message_id, "text": _PROBE_TEXT}, ensure_ascii=False)


def _plan(ctx: AwsVerifyContext) -> list[tuple[str, float]]:
    """(kind, delay) of every probe this run sends."""
    s = ctx.settings
    plan = [("native", s.native_delay)]
    if ctx.mode is Mode.FULL:
        plan.append(("delay-fifo", s.fifo_delay))
        if ctx.target.tier is not None:
            plan.append(("tier", s.tier_delay))
        if ctx.target.cancellation_table:
            plan += [("cancel", s.cancel_delay), ("reschedule", s.cancel_delay)]
    return plan


def _sender(ctx: AwsVerifyContext, kind: str) -> SqsDelayedSender:
    """The sender for ``kind``: the deployment's settings; the tier's probe goes to the tier whatever its delay."""
    routing = ctx.target.sqs_settings.with_(long_delay_route="fifo")
    if kind == "tier" and ctx.target.tier is not None:
        tier = ctx.target.tier.config.sqs_settings
        routing = routing.with_(
            long_delay_route="buckets", max_native_delay=1, bucket_ingest_queue=tier.bucket_ingest_queue
        )
    return SqsDelayedSender(ctx.clients.sqs, ctx.target.settings, sqs_settings=routing, clock=ctx.clock)


def _send(ctx: AwsVerifyContext, probe_queue: str, kind: str, delay: float) -> Probe:
    message_id = f"{PROBE_ID_PREFIX}{ctx.run_id}-{kind}"
    seconds = max(1, math.ceil(delay))
    now = ctx.clock.now()
    attributes = _probe_attributes(kind)
    typed = _comparable(normalize_attributes(attributes))
    probe = Probe(kind, message_id, _body(message_id), typed, now, now + timedelta(seconds=seconds))
    try:
        receipt = _sender(ctx, kind).send_delayed(
            probe_queue, probe.body, seconds, attributes=attributes, message_id=message_id
        )
        probe.route = receipt.route.value
    except DelayedDeliveryError as exc:
        probe.error = " ".join(str(exc).split())
    return probe


def _records(ctx: AwsVerifyContext) -> DynamoDbCancellationStore:
    assert ctx.target.cancellation_table
    return DynamoDbCancellationStore(ctx.clients.dynamodb, ctx.target.cancellation_table)


def _cancel_and_reschedule(ctx: AwsVerifyContext, probe_queue: str, probes: list[Probe]) -> None:
    """Write the cancel and reschedule records of those probes (deleted again at clean-up if still there)."""
    written = []
    cache = (
        float(ctx.target.probe.function.environment.get(CACHE_SECONDS_ENV, DEFAULT_CACHE_SECONDS))
        if (ctx.target.probe and not ctx.target.local)
        else 0.0
    )
    for probe in probes:
        if probe.error is not None or probe.kind not in ("cancel", "reschedule"):
            continue
        now = ctx.clock.now()
        try:
            if probe.kind == "cancel":
                record = cancel_request(
                    probe_queue,
                    probe.message_id,
                    now=now,
                    max_native_delay=ctx.target.sqs_settings.max_native_delay,
                    max_age=cache,
                    due=probe.due,
                )
                probe.expect = False
            else:
                probe.due += timedelta(seconds=max(1, math.ceil(ctx.settings.reschedule_shift)))
                record = reschedule_request(probe_queue, probe.message_id, probe.due, now=now)
            _records(ctx).put(record)
            written.append(record)
        except DelayedDeliveryError as exc:
            probe.error = f"the {probe.kind} record could not be written: {' '.join(str(exc).split())}"
    if written:
        ctx.cleanup.add("the probe's cancel / reschedule records", lambda: _records(ctx).delete(written))


def _arrival(message: dict[str, Any], probe_queue: str) -> tuple[str | None, Arrival]:
    delivered = delivered_from_boto3(message, destination=probe_queue)
    body = str(message.get("Body", ""))
    try:
        probe_id = json.loads(body).get("probe")
    except (ValueError, AttributeError):
        probe_id = None
    received = delivered.received_at
    assert received is not None
    arrival = Arrival(received, body, _comparable(delivered.headers), delivered.route)
    return (probe_id if isinstance(probe_id, str) else None), arrival


def _receive(ctx: AwsVerifyContext, url: str, probe_queue: str, wait: int, probes: dict[str, Probe]) -> list[str]:
    """One receive on the probe queue: our probes are recorded and deleted; an earlier run's probes deleted."""
    sqs = ctx.clients.sqs
    try:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait,
            VisibilityTimeout=30,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"receiving from the probe queue {probe_queue!r}") from exc
    notes = []
    for message in reply.get("Messages", []):
        probe_id, arrival = _arrival(message, probe_queue)
        if probe_id in probes:
            probes[probe_id].arrivals.append(arrival)
        elif probe_id and probe_id.startswith(PROBE_ID_PREFIX):
            notes.append(probe_id)
        else:
            continue  # not a probe: left alone, it reappears after its visibility timeout
        try:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"deleting a probe from {probe_queue!r}") from exc
    return notes


def _await(ctx: AwsVerifyContext, probe_queue: str, probes: list[Probe]) -> list[str]:
    """Receive until every probe is settled; progress every ``progress_every`` seconds."""
    facts = ctx.queue(probe_queue)
    assert facts is not None
    by_id = {p.message_id: p for p in probes}
    start = ctx.clock.now()
    next_progress = start + timedelta(seconds=ctx.settings.progress_every)
    notes: list[str] = []
    while True:
        now = ctx.clock.now()
        waiting = [p for p in probes if now < p.deadline(ctx.settings)]
        if not waiting:
            return notes
        if now >= next_progress:
            ctx.progress(probe_progress(waiting, now, start))
            next_progress = now + timedelta(seconds=ctx.settings.progress_every)
        left = min((p.deadline(ctx.settings) - now).total_seconds() for p in waiting)
        step = max(0.0, min(left, ctx.settings.poll, (next_progress - now).total_seconds()))
        if ctx.functions.local:
            ctx.functions.run_for(min(step, 1.0))
            wait = 0
        else:
            wait = int(min(20, step))
        notes += _receive(ctx, facts.url, probe_queue, wait, by_id)


def _depth(ctx: AwsVerifyContext, name: str) -> dict[str, int] | None:
    facts = ctx.queue(name, fresh=True)
    if facts is None:
        return None
    keys = (
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    )
    return {k.removeprefix("ApproximateNumberOfMessages") or "Visible": facts.number(k) for k in keys}


def _in_error_queue(ctx: AwsVerifyContext, probe: Probe, ep: EndpointTarget) -> str | None:
    """The failure reason when the probe reached the probe endpoint's own error queue (it is removed from there)."""
    facts = ctx.queue(ep.error_queue) if ep.error_queue else None
    if facts is None:
        return None
    sqs = ctx.clients.sqs
    try:
        reply = sqs.receive_message(QueueUrl=facts.url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
        for message in reply.get("Messages", []):
            if probe.message_id in str(message.get("Body", "")):
                sqs.delete_message(QueueUrl=facts.url, ReceiptHandle=message["ReceiptHandle"])
                reason = (message.get("MessageAttributes") or {}).get(FAILURE_REASON, {}).get("StringValue")
                return str(reason or "no reason given")
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"reading the probe's error queue {ep.error_queue!r}") from exc
    return None


def _function_failures(ctx: AwsVerifyContext) -> str:
    found = ctx.functions.failures()
    return f"; {len(found)} failed invocation(s), last: {found[-1][:300]}" if found else ""


def _where(ctx: AwsVerifyContext, probe: Probe, ep: EndpointTarget) -> tuple[str, str]:
    """Where a probe that did not arrive is (evidence) and what to do (fix)."""
    reason = _in_error_queue(ctx, probe, ep)
    if reason is not None:
        return f"it was moved to the error queue {ep.error_queue}: {reason}", "fix the cause named in the reason"
    failures = _function_failures(ctx)
    function = ep.function.name or "the requeue function"
    if probe.route == "fifo":
        depth = _depth(ctx, ep.delay_queue) or {}
        facts = ctx.queue(ep.delay_queue)
        hop, wanted = (facts.number("DelaySeconds") if facts else 0), ctx.target.sqs_settings.fifo_queue_delay
        if depth.get("Delayed") and hop != wanted:
            return (
                f"it waits out DelaySeconds {hop} s on {ep.delay_queue} at every hop{failures}",
                f"set DelaySeconds of {ep.delay_queue} to {wanted} (the requeue function's hop)",
            )
        if sum(depth.values()):
            return (
                f"it is still on {ep.delay_queue} ({depth}){failures}",
                f"the requeue function is not moving it: check that {function}'s event source on {ep.delay_queue} "
                "is enabled and read its log group for errors",
            )
    if probe.route == "buckets" and ctx.target.tier is not None:
        tier = ctx.target.tier
        ingest = _depth(ctx, tier.config.sqs_settings.bucket_ingest_queue) or {}
        dlq = _depth(ctx, tier.ingest_dlq) or {}
        if sum(dlq.values()):
            return f"the ingest DLQ {tier.ingest_dlq} holds {dlq}{failures}", (
                "the ingest function refuses records: read its log group, then redrive the DLQ"
            )
        if sum(ingest.values()):
            return f"it is still on the ingest queue ({ingest}){failures}", (
                "the ingest function is not reading its queue: check its event source and its log group"
            )
        return f"it is not on a queue: it waits in the bucket {tier.config.bucket_name}{failures}", (
            "the timer is not dispatching it: check the schedule rule, the timer's log group and the "
            "BucketOverdue alarm"
        )
    depth = _depth(ctx, ep.name) or {}
    if depth.get("NotVisible"):
        return (
            f"it is in flight on {ep.name} ({depth}): another consumer received it{failures}",
            f"stop every other consumer of {ep.name}: it belongs to aws verify",
        )
    return (
        f"it is on no queue of the probe endpoint ({depth}){failures}",
        f"something else consumes {ep.name} (or deleted it): remove that consumer; the probe queue belongs to "
        "aws verify",
    )


def _judge(ctx: AwsVerifyContext, probe: Probe, ep: EndpointTarget) -> CheckResult:
    """One probe's check."""
    route = {"native": "native DelaySeconds", "fifo": ep.delay_queue, "buckets": "the time-bucket tier"}.get(
        probe.route, probe.route or "?"
    )
    return judge_probe(
        probe,
        ctx.settings,
        subject=ep.name,
        route=route,
        missing=lambda: _where(ctx, probe, ep),
        send_fix="give the role running verify the permissions in infra/aws/verify-policy.json",
        cancel_fix=f"the requeue function does not read the cancellation table: check {CACHE_SECONDS_ENV} and "
        "DELAYED_DELIVERY_CANCELLATION_TABLE on it",
    )


def run_probes(ctx: AwsVerifyContext) -> tuple[list[CheckResult], list[tuple[str, float]]]:
    """Send every probe of the mode, wait for them, and judge each (skipped ones say why); the (kind, delay) sent."""
    ep = ctx.target.probe
    skipped_kinds = [k for k in ("delay-fifo", "tier", "cancel", "reschedule") if k not in dict(_plan(ctx))]
    if ep is None:
        return [skipped("probe-native", B, "-", "the stack has no probe endpoint: deploy with -c verifyProbe=true")], []
    if ctx.queue(ep.name) is None or ctx.queue(ep.delay_queue) is None:
        return [
            failed(
                "probe-native",
                B,
                ep.name,
                "the probe endpoint's queues do not exist",
                "deploy infra/aws with the probe endpoint (context verifyProbe, on by default)",
            )
        ], []
    plan = _plan(ctx)
    ctx.progress(f"sending {len(plan)} probe(s) to {ep.name}: " + ", ".join(f"{k} (due in {span(d)})" for k, d in plan))
    probes = [_send(ctx, ep.name, kind, delay) for kind, delay in plan]
    _cancel_and_reschedule(ctx, ep.name, probes)
    notes = _await(ctx, ep.name, probes)
    if notes:
        ctx.progress(f"removed {len(notes)} probe(s) of an earlier run from {ep.name}")
    results = [_judge(ctx, p, ep) for p in probes]
    why = "run with --full" if ctx.mode is Mode.QUICK else "not deployed (tier / cancellation table)"
    results += [skipped(f"probe-{k}", B, ep.name, why) for k in skipped_kinds]
    return results, [(p.kind, (p.due - p.sent_at).total_seconds()) for p in probes if p.error is None]
