"""SQS requeue throughput against a raw receive/send/delete loop, on moto server at the same batch size (10).

Each sample drains ``N`` records (1 KiB body, one attribute, the control attribute asking for a long delay, so
every record is requeued) from a fresh ``-delay.fifo`` queue. The queue's delay is 0 while it is filled and
900 s afterwards, so requeued messages do not come back during the sample. Three sides alternate round by
round (so a busy machine slows them alike):

* ``raw``, the baseline, no logic at all: ``receive_message`` (10, all attributes), ``send_message_batch`` of
  the same bodies and attributes back to the queue, ``delete_message_batch``.
* ``requeue``: the real Lambda handler (``delayed_delivery.aws.requeue.handler.build_handler``: Powertools logger,
  metrics, tracer, ``SqsFifoPartialProcessor``, ``FifoRequeuer``) behind the local event source (``poll_once``), with
  envelope packing on (the default, 64 KiB).
* ``requeue_unpacked``: the same with ``DELAYED_DELIVERY_PACK_BYTES=0`` (one FIFO message per record).

Powertools logs (one INFO line per message, as in Lambda) and EMF output are written to ``/dev/null``.
Figures are records per second; the ratio is to the raw loop in the same rounds. Target: requeue ≥ 0.8× raw.

Run: ``python -m benchmarks.sqs_throughput [--smoke] [--runs 5] [--records 200]``. Starts its own moto server
unless ``MOTO_ENDPOINT`` is set. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from benchmarks.common import Row, print_table, write_json
from benchmarks.sqs_hops import _client, _moto
from delayed_delivery.aws.packing import DEFAULT_PACK_BYTES, PACK_BYTES_ENV
from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import SendMessageBatchRequestEntryTypeDef

NAME = "sqs_throughput"
BODY_BYTES = 1024
SIDES = ("raw", "requeue", "requeue_unpacked")


def _fill(client: SQSClient, url: str, records: int, run: str) -> None:
    """``records`` plain first-hop records, visible at once; then the queue delay goes back to 900 s."""
    client.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0"})
    for first in range(0, records, 10):
        entries: list[SendMessageBatchRequestEntryTypeDef] = [
            {
                "Id": str(i),
                "MessageBody": f"message {i} ".ljust(BODY_BYTES, "x"),
                "MessageAttributes": {
                    "n": {"DataType": "Number", "StringValue": str(i)},
                    DELAY_SECONDS_ATTRIBUTE: {"DataType": "Number", "StringValue": "10000000"},
                },
                "MessageGroupId": f"{run}-{i}",
                "MessageDeduplicationId": f"{run}-{i}:0",
            }
            for i in range(first, min(records, first + 10))
        ]
        client.send_message_batch(QueueUrl=url, Entries=entries)
    client.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "900"})


def raw_loop(client: SQSClient, url: str, records: int) -> int:
    """The baseline: receive 10, send them back with send_message_batch, delete_message_batch; no logic."""
    done = empty = 0
    while done < records and empty < 50:
        reply = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = reply.get("Messages", [])
        if not messages:
            empty += 1
            continue
        client.send_message_batch(
            QueueUrl=url,
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": m["Body"],
                    "MessageAttributes": m.get("MessageAttributes", {}),
                    "MessageGroupId": m["Attributes"]["MessageGroupId"],
                    "MessageDeduplicationId": m["MessageId"],
                }
                for i, m in enumerate(messages)
            ],
        )
        client.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        )
        done += len(messages)
    return done


def handler_loop(poller: LocalEventSourcePoller, records: int) -> int:
    """The local event source, polled in this thread until ``records`` more records were handled."""
    target = poller.stats.records + records
    empty = 0
    while poller.stats.records < target and empty < 50:
        if poller.poll_once(0) == 0:
            empty += 1
    if poller.stats.failed or poller.stats.handler_errors:
        raise RuntimeError(f"the handler failed records during the benchmark: {poller.stats}")
    return records - max(0, target - poller.stats.records)


@functools.cache
def _devnull() -> TextIO:
    """Where Powertools' log lines and EMF output go during a sample (opened once, kept open)."""
    return Path(os.devnull).open("w")


#: Records handled untimed first: a new handler instance's queue look-ups and start-up check, the HTTP pool.
WARM_UP = 10


def sample(endpoint: str, side: str, records: int) -> tuple[float, float]:
    """Records per second and client CPU ms per record for ``side`` on a fresh queue (after ``WARM_UP``)."""
    from delayed_delivery.aws.requeue.handler import build_handler

    client = _client(endpoint)
    run = f"tp{time.time_ns()}"
    settings = DelayedDeliverySettings(error_queue=f"{run}-errors")
    queues = ensure_endpoint(client, run, settings, visibility_timeout=60)
    _fill(client, queues.delay_url, records + WARM_UP, run)
    work: Callable[[int], int]
    with contextlib.redirect_stdout(_devnull()):
        if side == "raw":

            def work(n: int) -> int:
                return raw_loop(client, queues.delay_url, n)

        else:
            env = {
                "DELAYED_DELIVERY_ERROR_QUEUE": settings.error_queue,
                PACK_BYTES_ENV: str(DEFAULT_PACK_BYTES if side == "requeue" else 0),
                "DELAYED_DELIVERY_MAX_PARK_SECONDS": "0",  # the hop path (parking: benchmarks.sqs_packing)
                "POWERTOOLS_SERVICE_NAME": f"throughput-{run}",  # a logger bound to this sample's stdout
            }
            poller = LocalEventSourcePoller(
                client, queues.delay_url, queues.delay_arn, build_handler(env, sqs_client=client), wait_seconds=0
            )

            def work(n: int) -> int:
                return handler_loop(poller, n)

        work(WARM_UP)
        start, cpu = time.perf_counter(), time.process_time()
        done = work(records)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    for url in (queues.delay_url, queues.input_url, queues.error_url):  # moto slows down as it holds more
        client.delete_queue(QueueUrl=url)
    if done < records:
        raise RuntimeError(f"{side}: only {done} of {records} records came back from moto")
    return done / elapsed, cpu * 1000 / done


def measure(endpoint: str, records: int, runs: int) -> dict[str, list[tuple[float, float]]]:
    """``runs`` rounds, each side once per round in turn; (records per second, CPU ms per record) per side."""
    samples: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for _ in range(runs):
        for side in SIDES:
            samples[side].append(sample(endpoint, side, records))
    return samples


def rows_from(samples: dict[str, list[tuple[float, float]]], records: int) -> list[Row]:
    """Throughput and client CPU per record for each side; the handler rows carry their ratio to the raw loop."""
    raw = statistics.median(r for r, _ in samples["raw"])
    raw_cpu = statistics.median(c for _, c in samples["raw"])
    note = f"{records} records of {BODY_BYTES} B per sample, batch 10, moto server"
    rows = [
        Row(
            NAME, "raw_receive_send_delete_records_per_s", "records/s", tuple(r for r, _ in samples["raw"]), notes=note
        ),
        Row(
            NAME,
            "raw_receive_send_delete_cpu_ms_per_record",
            "ms",
            tuple(c for _, c in samples["raw"]),
            notes="CPU time of this process (boto3 and, for the handler, everything it does) per record",
        ),
    ]
    for side in SIDES[1:]:
        rate = tuple(r for r, _ in samples[side])
        cpu = tuple(c for _, c in samples[side])
        rows += [
            Row(
                NAME,
                f"{side}_records_per_s",
                "records/s",
                rate,
                "raw loop, same rounds",
                statistics.median(rate) / raw,
            ),
            Row(NAME, f"{side}_cpu_ms_per_record", "ms", cpu, "raw loop", statistics.median(cpu) / raw_cpu),
        ]
    return rows


def run(smoke: bool = False, *, runs: int = 5, records: int = 200) -> list[Row]:
    """The benchmark-runner entry point."""
    if smoke:
        runs, records = 2, 30
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "DelayedDeliveryBenchmark")
    with _moto() as endpoint:
        samples = measure(endpoint, records, runs)
    run.last_samples = samples  # type: ignore[attr-defined]
    return rows_from(samples, records)


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/sqs_throughput.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--records", type=int, default=200)
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs, records=a.records)
    print_table(rows, "SQS requeue throughput vs a raw receive/send/delete loop (moto server)")
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, {"samples": run.last_samples}))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
