"""Behaviour probes of ``azure verify``: messages to the probe queue through each route, and what came back.

``--quick`` sends one through native initial visibility (30 s) and one through the delays table (due in 90 s,
dispatched by the timer); ``--full`` adds one kept in the table and cancelled before it falls due. One loop reads
the probe queue until each probe has arrived and its duplicate watch is over, or its deadline passed.

The table probes are skipped when the configuration checks found the table missing, and on an emulator when they
found anything of the dispatcher's storage missing: the dispatcher run here would create it, and verify changes
nothing it checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import timedelta

from azure.core.exceptions import AzureError

from ...errors import DelayedDeliveryError
from ...verification import Arrival, CheckResult, Group, Mode, Probe, judge_probe, probe_progress, skipped, span
from ..receive import delivered_from_queue_message
from ..sdk_errors import translate
from ..sender import AzureDelayedSender
from .context import AzureVerifyContext

__all__ = ["PROBE_ID_PREFIX", "run_probes"]

B = Group.BEHAVIOUR
PROBE_ID_PREFIX = "verify-"
_PROBE_TEXT = 'zażółć gęślą jaźń ✓ 😀 "quoted"\nsecond line'
_ROUTES = {"native": "native initial visibility", "table": "the delays table"}


def _plan(ctx: AzureVerifyContext) -> list[tuple[str, float]]:
    s = ctx.settings
    plan = [("native", s.native_delay), ("table", s.table_delay)]
    if ctx.mode is Mode.FULL:
        plan.append(("cancel", s.table_delay))
    return plan


def _table_blocked(ctx: AzureVerifyContext) -> str | None:
    """Why the table probes cannot run (what the configuration checks found missing), or None when they can."""
    if "table" in ctx.missing:
        return "the delays table does not exist (the table check)"
    if ctx.dispatcher.local and ctx.missing:
        return (
            f"the dispatcher is not run here while these are missing ({', '.join(sorted(ctx.missing))}): it would "
            "create what the checks above report"
        )
    return None


def _send(ctx: AzureVerifyContext, sender: AzureDelayedSender, kind: str, delay: float) -> Probe:
    message_id = f"{PROBE_ID_PREFIX}{ctx.run_id}-{kind}"
    body = json.dumps({"probe": message_id, "text": _PROBE_TEXT}, ensure_ascii=False)
    headers = {"probe-kind": kind, "probe-text": "ünïcødé ✓"}
    seconds = max(1, math.ceil(delay))
    now = ctx.clock.now()
    probe = Probe(kind, message_id, body, headers, now, now + timedelta(seconds=seconds))
    try:
        sent = sender.send(
            ctx.target.probe_queue,
            body.encode("utf-8"),
            delay=seconds,
            headers=headers,
            message_id=message_id,
            cancellable=kind != "native",
        )
        probe.route, probe.due = sent.route, sent.due_at
        if kind == "cancel":
            probe.expect = False
            if not sender.cancel(message_id):
                probe.error = "the row was gone before it could be cancelled"
    except DelayedDeliveryError as exc:
        probe.error = " ".join(str(exc).split())
    return probe


def _receive(ctx: AzureVerifyContext, probes: dict[str, Probe]) -> int:
    """Read the probe queue once: our probes recorded and deleted, an earlier run's probes deleted; the count."""
    queue = ctx.clients.queues.get_queue_client(ctx.target.probe_queue)
    earlier = 0
    try:
        for message in queue.receive_messages(messages_per_page=32, visibility_timeout=30, max_messages=32):
            delivered = delivered_from_queue_message(message, destination=ctx.target.probe_queue, clock=ctx.clock)
            body = delivered.body.decode("utf-8", errors="replace")
            probe = probes.get(delivered.message_id)
            if probe is not None:
                assert delivered.received_at is not None
                headers = {k: str(v) for k, v in delivered.headers.items()}
                probe.arrivals.append(Arrival(delivered.received_at, body, headers, delivered.route))
            elif delivered.message_id.startswith(PROBE_ID_PREFIX):
                earlier += 1
            else:
                continue  # not a probe: left alone
            queue.delete_message(message)
    except AzureError as exc:
        raise translate(exc, f"reading the probe queue {ctx.target.probe_queue}") from exc
    return earlier


def _await(ctx: AzureVerifyContext, probes: list[Probe], *, dispatch: bool) -> int:
    by_id = {p.message_id: p for p in probes}
    start = ctx.clock.now()
    next_progress = start + timedelta(seconds=ctx.settings.progress_every)
    earlier = 0
    while True:
        now = ctx.clock.now()
        waiting = [p for p in probes if now < p.deadline(ctx.settings)]
        if not waiting:
            return earlier
        if now >= next_progress:
            ctx.progress(probe_progress(waiting, now, start))
            next_progress = now + timedelta(seconds=ctx.settings.progress_every)
        left = min((p.deadline(ctx.settings) - now).total_seconds() for p in waiting)
        step = max(0.0, min(left, 1.0))  # one read a second: the arrival time is this machine's, to a second
        if dispatch:
            ctx.dispatcher.run_for(step)
        else:
            ctx.clock.sleep(step)
        earlier += _receive(ctx, by_id)


def _where(ctx: AzureVerifyContext, probe: Probe) -> tuple[str, str]:
    """Where a probe that did not arrive is, and what to do."""
    if probe.route == "table":
        store = AzureDelayedSender.from_config(ctx.target.config, ctx.clients).store
        try:
            still = store.remove(probe.message_id)  # it will not be dispatched after the run either
        except DelayedDeliveryError:
            still = False
        if still:
            return (
                "its row was still in the delays table: the timer did not dispatch it",
                "check that the function app runs (the timer check) and that its shards' leases are not held "
                "by a stopped instance",
            )
        return (
            "its row left the table but the message is not on the probe queue",
            "look in the error queue for it (DelayedDelivery.FailureReason) and for another consumer of "
            f"{ctx.target.probe_queue}",
        )
    return (
        f"it is not on {ctx.target.probe_queue}",
        f"something else reads {ctx.target.probe_queue}: it belongs to azure verify",
    )


def run_probes(ctx: AzureVerifyContext) -> list[CheckResult]:
    """Send the probes of the mode, wait for them, judge each (the table probes skipped when they cannot run)."""
    blocked = _table_blocked(ctx)
    plan = [(kind, delay) for kind, delay in _plan(ctx) if blocked is None or kind == "native"]
    ctx.progress(
        f"sending {len(plan)} probe(s) to {ctx.target.probe_queue}: "
        + ", ".join(f"{k} (due in {span(d)})" for k, d in plan)
    )
    sender = AzureDelayedSender.from_config(ctx.target.config, ctx.clients)
    probes = [_send(ctx, sender, kind, delay) for kind, delay in plan]
    for probe in probes:
        if probe.route == "table" and probe.expect and probe.error is None:
            ctx.cleanup.add(f"the probe row {probe.message_id}", _remover(sender, probe.message_id))
    earlier = _await(ctx, probes, dispatch=ctx.dispatcher.local and blocked is None)
    if earlier:
        ctx.progress(f"removed {earlier} probe(s) of an earlier run from {ctx.target.probe_queue}")
    results = [
        judge_probe(
            p,
            ctx.settings,
            subject=ctx.target.probe_queue,
            route=_ROUTES.get(p.route, p.route or "?"),
            missing=_where_of(ctx, p),
            send_fix="give the identity running verify the data roles in infra/azure/verify-role.json",
            cancel_fix="the dispatcher sent a removed row: report it with the run's logs",
        )
        for p in probes
    ]
    if blocked is not None:
        results += [skipped(f"probe-{kind}", B, ctx.target.probe_queue, blocked) for kind in ("table", "cancel")]
    elif ctx.mode is Mode.QUICK:
        results.append(skipped("probe-cancel", B, ctx.target.probe_queue, "run with --full"))
    return results


def _where_of(ctx: AzureVerifyContext, probe: Probe) -> Callable[[], tuple[str, str]]:
    return lambda: _where(ctx, probe)


def _remover(sender: AzureDelayedSender, message_id: str) -> Callable[[], None]:
    def remove() -> None:
        sender.cancel(message_id)  # gone already when it was dispatched: nothing to do

    return remove
