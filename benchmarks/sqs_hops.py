"""SQS requests per message per hop, counted at moto server (never estimated, never timed).

N messages (default 500, 5 runs) are sent unpacked (sender and handler ``pack_bytes`` 0; packing is
measured by ``benchmarks.sqs_packing``) with one delay that plans 10 FIFO hops under compressed time (native
cap and FIFO hop 1 s), spread over several endpoints so that no queue holds more than ~50 messages
(moto answers in O(queue depth)). One local event source per ``-delay.fifo`` queue invokes the real Lambda
handler (batch 10, partial batch responses) until every message has reached its destination. A botocore
``before-send`` hook counts every request the pollers and the handler make; the hops are counted from the
handler's records (each record handled once = one hop).

* ``fifo_requests_per_message_per_hop``: every request on the hop path (receive, send, delete, look-ups),
  empty receives included. The NServiceBus formula assumes 2 (one requeue + one delete per message per cycle).
* ``..._without_empty_receives``: the same, minus empty polls (a real event source long-polls 20 s, so it
  makes few; the local one polls every 1 s).
* the per-operation split, and ``send_requests_per_message`` for the sender's first send (SendMessageBatch).

Run: ``python -m benchmarks.sqs_hops [--smoke] [--runs 5] [--messages 500] [--endpoints 10]``. Starts its own moto
server unless ``MOTO_ENDPOINT`` is set. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from benchmarks.common import Row, print_table, write_json
from delayed_delivery.aws.packing import ENVELOPE_ATTRIBUTE, PACK_BYTES_ENV
from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.requeue import RecordResult
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller, RequestCounter

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

NAME = "sqs_hops"


@contextmanager
def _moto() -> Iterator[str]:
    if os.environ.get("MOTO_ENDPOINT"):
        yield os.environ["MOTO_ENDPOINT"]
        return
    from delayed_delivery.app.emulators import LocalEmulators

    with LocalEmulators(azurite=False) as emulators:
        yield emulators.sqs_endpoint


def _client(endpoint: str) -> SQSClient:
    import boto3

    return boto3.client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def message_hops(pollers: list[LocalEventSourcePoller]) -> int:
    """Hops made, counted per message: a plain record is one, an envelope record one per inner message."""
    total = 0
    for p in pollers:
        for event in list(p.events):
            for r in event["Records"]:
                packed = ENVELOPE_ATTRIBUTE in (r.get("messageAttributes") or {})
                total += len(json.loads(r["body"])["m"]) if packed else 1
    return total - sum(p.stats.failed for p in pollers)


class _Tally:
    """What the handlers did (per message: an envelope counts each message inside it) and their in-flight reads."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.in_flight_reads = 0
        self._lock = threading.Lock()

    def attach(self, client: SQSClient) -> _Tally:
        client.meta.events.register("provide-client-params.sqs.GetQueueAttributes", self._read)
        return self

    def _read(self, params: dict[str, Any], **_: Any) -> None:
        if "ApproximateNumberOfMessagesNotVisible" in params.get("AttributeNames", []):
            with self._lock:
                self.in_flight_reads += 1

    def count(self, results: list[RecordResult]) -> None:
        with self._lock:
            self.outcomes.update(str(each.outcome) for r in results for each in r.per_message())


def _read_arrivals(
    reader: SQSClient, urls: list[str], due: dict[str, float], arrived: dict[str, int], lateness: list[float]
) -> int:
    """One pass over the destinations: receive (≤ 10 each), note arrival and lateness, delete; returns how many."""
    count = 0
    for url in urls:
        got = reader.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not got:
            continue
        now = time.time()
        for m in got:
            key = m["Body"].split(" ", 2)[1]  # "message <i> …"
            arrived[key] = arrived.get(key, 0) + 1
            lateness.append(now - due[key])
        reader.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
        )
        count += len(got)
    return count


def measure(
    messages: int,
    endpoints: int,
    hops: int,
    hop_seconds: int,
    endpoint: str,
    *,
    deliver: bool,
    pack_bytes: int = 0,
    body_bytes: int = 0,
    sender_pack_bytes: int = 0,
    max_park_seconds: int = 0,
    visibility_timeout: int = 60,
) -> dict[str, Any]:
    """Run one measurement and return the raw counts.

    ``deliver=False``: the delay is far longer than the run, so every hop is a requeue; the pollers stop once
    ``messages × hops`` records were handled (the hop count does not depend on how fast moto is).
    ``deliver=True``: the delay plans exactly ``hops`` FIFO cycles and the run waits for every delivery
    (loss, duplicates and lateness; under load hops take longer than planned, so fewer happen).
    ``pack_bytes``: the handler's envelope size (0 = packing off); ``body_bytes``: pad each body to this size.
    ``sender_pack_bytes``: the sender's envelope size for the first hop (0 = one FIFO message per message).
    ``max_park_seconds``: the handler's ``DELAYED_DELIVERY_MAX_PARK_SECONDS`` (0, the default here: every long
    delay hops; parking is measured by ``benchmarks.sqs_packing``); ``visibility_timeout``: the FIFO queues'.
    ``outcomes`` counts what the handler did, per message (an envelope counts each message inside it).
    """
    settings = DelayedDeliverySettings(error_queue=f"bench-errors-{time.time_ns()}")
    sqs_settings = SqsSettings(
        max_native_delay=hop_seconds,
        fifo_queue_delay=hop_seconds,
        max_park_seconds=max_park_seconds,
        long_delay_route="fifo",  # this benchmark measures the -delay.fifo route
    )
    delay = hop_seconds * hops + 1 if deliver else 10**7  # `hops` FIFO cycles then 1 s native, or "never"
    send_client, hop_client, reader = _client(endpoint), _client(endpoint), _client(endpoint)
    send_counter, hop_counter = RequestCounter().attach(send_client), RequestCounter().attach(hop_client)
    run = time.time_ns()
    names = [f"bench-{run}-{i}" for i in range(endpoints)]
    queues = [
        ensure_endpoint(reader, name, settings, sqs_settings=sqs_settings, visibility_timeout=visibility_timeout)
        for name in names
    ]
    env = {
        "DELAYED_DELIVERY_MAX_NATIVE_DELAY": str(hop_seconds),
        "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": str(hop_seconds),
        "DELAYED_DELIVERY_ERROR_QUEUE": settings.error_queue,
        "DELAYED_DELIVERY_MAX_PARK_SECONDS": str(max_park_seconds),
        PACK_BYTES_ENV: str(pack_bytes),
    }
    tally = _Tally().attach(hop_client)
    # One handler per queue, as each event source mapping gets its own Lambda instances.
    pollers = [
        LocalEventSourcePoller(
            hop_client, q.delay_url, q.delay_arn, build_handler(env, sqs_client=hop_client, on_results=tally.count)
        )
        for q in queues
    ]
    sender = SqsDelayedSender(send_client, settings, sqs_settings=sqs_settings.with_(pack_bytes=sender_pack_bytes))
    batch = [
        DelayedSend(
            names[i % endpoints], f"message {i} ".ljust(body_bytes, "x"), delay, message_id=f"m{i}", attributes={"n": i}
        )
        for i in range(messages)
    ]
    for name in names:  # warm the sender's queue cache so the send count is the sends alone
        sender.directory.get(name)
        sender.directory.get(f"{name}-delay.fifo")
    send_counter.reset()
    for p in pollers:
        p.start()
    start = time.monotonic()
    # Each message is due ``delay`` after the request that carried it: send one SendMessageBatch at a time (10
    # messages of one endpoint, or one envelope of up to 50 when the sender packs) and note when it started, so
    # "early" is exact and lateness never understated.
    due: dict[str, float] = {}
    per_request = 50 if sender_pack_bytes and (body_bytes + 64) * 50 < sender_pack_bytes else 10
    for name in names:
        mine = [m for m in batch if m.destination == name]
        for first in range(0, len(mine), per_request):
            chunk = mine[first : first + per_request]
            sent_at = time.time()
            result = sender.send_delayed_batch(chunk)
            assert result.ok, result.failures
            due.update({m.body.split(" ", 2)[1]: sent_at + delay for m in chunk})
    arrived: dict[str, int] = {}
    lateness: list[float] = []
    deadline = start + (delay if deliver else 0) + 60 + messages * hops / 20
    while time.monotonic() < deadline:
        if not deliver:
            if message_hops(pollers) >= messages * hops:
                break
            time.sleep(0.5)
            continue
        if sum(arrived.values()) >= messages:
            break
        if not _read_arrivals(reader, [q.input_url for q in queues], due, arrived, lateness):
            time.sleep(0.2)  # nothing arrived: poll again shortly (while messages arrive, read on at once)
    elapsed = time.monotonic() - start
    for p in pollers:
        p.signal_stop()  # all at once, so no poller keeps polling while another is joined
    for p in pollers:
        p.stop()
    records = [r for p in pollers for e in p.events for r in e["Records"]]
    return {
        "mode": "deliver" if deliver else "steady_requeue",
        "messages": messages,
        "endpoints": endpoints,
        "planned_hops": hops,
        "hop_seconds": hop_seconds,
        "hops": message_hops(pollers),
        "pack_bytes": pack_bytes,
        "sender_pack_bytes": sender_pack_bytes,
        "body_bytes": body_bytes,
        "send_billed_requests": send_counter.billed,
        "hop_billed_requests": hop_counter.billed,
        "redelivered_records": sum(1 for r in records if int(r["attributes"]["ApproximateReceiveCount"]) > 1),
        "delivered": len(arrived) if deliver else None,
        "duplicates": sum(n - 1 for n in arrived.values()) if deliver else None,
        "lateness_s_sorted": sorted(lateness) if deliver else None,
        "seconds": elapsed,
        "send_requests": send_counter.snapshot(),
        "hop_requests": hop_counter.snapshot(),
        "empty_receives": hop_counter.empty_receives,
        "invocations": sum(p.stats.invocations for p in pollers),
        "handler_errors": sum(p.stats.handler_errors for p in pollers),
        "failed_records": sum(p.stats.failed for p in pollers),
        "outcomes": dict(tally.outcomes),
        "in_flight_reads": tally.in_flight_reads,
        "max_park_seconds": max_park_seconds,
        "visibility_timeout": visibility_timeout,
    }


def rows_from(steady: list[dict[str, Any]], delivery: list[dict[str, Any]]) -> list[Row]:
    """Turn raw counts into benchmark rows (one sample per run)."""

    def per_hop(c: dict[str, Any], ops: tuple[str, ...] | None = None, minus_empty: bool = False) -> float:
        total = sum(n for op, n in c["hop_requests"].items() if ops is None or op in ops)
        if minus_empty:
            total -= c["empty_receives"]
        return float(total) / float(c["hops"])

    first = steady[0]
    note = f"{first['messages']:,} messages × {first['planned_hops']} hops, {first['endpoints']} endpoints, batch 10"
    seed = 2.0
    all_in = tuple(per_hop(c) for c in steady)
    busy = tuple(per_hop(c, minus_empty=True) for c in steady)
    rows = [
        Row(
            NAME,
            "fifo_requests_per_message_per_hop",
            "requests",
            all_in,
            "NServiceBus formula (2)",
            statistics_ratio(all_in, seed),
            note,
        ),
        Row(
            NAME,
            "fifo_requests_per_message_per_hop_without_empty_receives",
            "requests",
            busy,
            "NServiceBus formula (2)",
            statistics_ratio(busy, seed),
        ),
        Row(
            NAME,
            "receive_requests_per_message_per_hop",
            "requests",
            tuple(per_hop(c, ("ReceiveMessage",)) for c in steady),
        ),
        Row(
            NAME,
            "send_batch_requests_per_message_per_hop",
            "requests",
            tuple(per_hop(c, ("SendMessageBatch", "SendMessage")) for c in steady),
        ),
        Row(
            NAME,
            "delete_requests_per_message_per_hop",
            "requests",
            tuple(per_hop(c, ("DeleteMessageBatch", "DeleteMessage")) for c in steady),
        ),
        Row(NAME, "hops_per_message", "hops", tuple(c["hops"] / c["messages"] for c in steady)),
        Row(
            NAME,
            "send_requests_per_message",
            "requests",
            tuple(sum(c["send_requests"].values()) / c["messages"] for c in steady),
        ),
    ]
    for c in delivery:
        late = c["lateness_s_sorted"] or [0.0]
        note = f"{c['messages']} messages, {c['planned_hops']} planned hops of {c['hop_seconds']} s, end to end"
        rows += [
            Row(NAME, "delivery_lost", "messages", (float(c["messages"] - c["delivered"]),), notes=note),
            Row(NAME, "delivery_duplicates", "messages", (float(c["duplicates"]),)),
            Row(NAME, "delivery_early", "messages", (float(sum(1 for x in late if x < -0.25)),)),
            Row(NAME, "delivery_lateness_p50", "s", (late[len(late) // 2],)),
            Row(NAME, "delivery_lateness_p99", "s", (late[min(len(late) - 1, int(len(late) * 0.99))],)),
        ]
    return rows


def statistics_ratio(samples: tuple[float, ...], baseline: float) -> float:
    """Median of ``samples`` divided by ``baseline``."""
    import statistics

    return float(statistics.median(samples)) / baseline


def run(smoke: bool = False, *, runs: int = 5, messages: int = 500, endpoints: int = 10) -> list[Row]:
    """The benchmark-runner entry point: the steady-state hop cost, then one end-to-end delivery run."""
    quiet_handler_output()
    if smoke:
        runs, messages, endpoints, hops, deliver_messages, deliver_endpoints = 1, 20, 2, 2, 20, 2
    else:
        hops, deliver_messages, deliver_endpoints = 10, 200, 10
    with _moto() as endpoint:
        steady = [measure(messages, endpoints, hops, 1, endpoint, deliver=False) for _ in range(runs)]
        delivery = [measure(deliver_messages, deliver_endpoints, 3, 2, endpoint, deliver=True)]
    run.last_counts = {"steady": steady, "delivery": delivery}  # type: ignore[attr-defined]
    return rows_from(steady, delivery)


def quiet_handler_output() -> None:
    """Turn the handler's Powertools logs and EMF output down unless the caller set them (they count nothing)."""
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")


def main() -> None:
    """Command line: print the table, write JSON (Powertools logs and EMF output are turned down)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--endpoints", type=int, default=10)
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs, messages=a.messages, endpoints=a.endpoints)
    print_table(rows, "SQS requests per message per hop (moto server, counted)")
    counts = run.last_counts  # type: ignore[attr-defined]
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, {"counts": counts}))


if __name__ == "__main__":
    main()
