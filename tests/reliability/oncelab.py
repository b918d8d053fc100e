"""Duplicate injection: a consumer fed the SQS crash soak's deliveries, duplicates included, performs each effect once.

The SQS crash soak (``sqssoak.py``) drains every input queue as the handler forwards to it; here each message it
receives there also goes to a consumer guarded by ``aws.idempotency.DynamoDBEffectivelyOnce`` on a DynamoDB table
of the same moto server, before the soak deletes it (as a real consumer does). The consumer counts deliveries and
effects per message id: every id must be delivered, and no effect may happen twice.

    .venv/bin/python -m tests.reliability.oncelab --crashes 300 --endpoints 4 --messages 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from delayed_delivery.aws.idempotency import DynamoDBEffectivelyOnce, ensure_idempotency_table
from tests.reliability.sqslab import REGION, SqsSoakResult
from tests.reliability.sqssoak import CrashSoak, Progress

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


class _CountingConsumer:
    """The consumer under test: one effect per message id, through the DynamoDB idempotency record."""

    def __init__(self, once: DynamoDBEffectivelyOnce) -> None:
        self.once = once
        self.deliveries: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()

    def consume(self, message: Mapping[str, Any]) -> None:
        """Process one received SQS message (the soak sends each message's id as its body)."""
        message_id = message["Body"]
        self.deliveries[message_id] += 1
        self.once.run(message_id, lambda: self.effects.update([message_id]))


class _ConsumingSqs:
    """The soak's SQS client; what it receives from the input queues also goes to the consumer."""

    def __init__(self, client: SQSClient, input_urls: set[str], consumer: _CountingConsumer) -> None:
        self._client = client
        self._input_urls = input_urls
        self._consumer = consumer

    def receive_message(self, **kwargs: Any) -> Any:
        """Receive as asked; hand every message from an input queue to the consumer."""
        reply = self._client.receive_message(**kwargs)
        if kwargs.get("QueueUrl") in self._input_urls:
            for message in reply.get("Messages", []):
                self._consumer.consume(message)
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@dataclass(frozen=True, slots=True)
class OnceResult:
    """The soak's own counts and what the consumer saw and did."""

    soak: SqsSoakResult
    deliveries: int
    distinct: int
    duplicates_absorbed: int
    effects: int
    repeated_effects: int
    missing_effects: int


def once_soak(
    endpoint_url: str,
    messages: int,
    crashes: int,
    seed: int = 1,
    *,
    endpoints: int = 4,
    probability: float = 0.5,
    timeout: float = 3600,
    progress: TextIO | None = None,
) -> OnceResult:
    """Run the SQS crash soak with the effectively-once consumer on its deliveries; return both counts."""
    import boto3

    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    table = f"processed-{uuid.uuid4().hex[:8]}"
    ensure_idempotency_table(dynamodb, table)
    consumer = _CountingConsumer(DynamoDBEffectivelyOnce(table, name="soak-consumer", client=dynamodb))
    soak = CrashSoak(
        endpoint_url, endpoints=endpoints, messages=messages, crashes=crashes, seed=seed, probability=probability
    )
    inputs = {ep.queues.input_url for ep in soak.endpoints}
    soak.client = _ConsumingSqs(soak.client, inputs, consumer)  # type: ignore[assignment]
    result = soak.run(timeout, Progress(crashes, progress))
    expected = {f"e{ep.index}-{n:07d}" for ep in soak.endpoints for n in range(ep.sent)}
    return OnceResult(
        soak=result,
        deliveries=sum(consumer.deliveries.values()),
        distinct=len(consumer.deliveries),
        duplicates_absorbed=sum(consumer.deliveries.values()) - len(consumer.deliveries),
        effects=sum(consumer.effects.values()),
        repeated_effects=sum(n - 1 for n in consumer.effects.values() if n > 1),
        missing_effects=len(expected - set(consumer.effects)),
    )


def main() -> None:
    """Command line: starts a moto server, runs the soak with the consumer, prints the counts as JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--crashes", type=int, default=300, help="in-process crashes of the requeue handler")
    p.add_argument("--endpoints", type=int, default=4, help="endpoints the soak spreads its messages over")
    p.add_argument("--messages", type=int, default=20, help="messages on their way per endpoint")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = p.parse_args()
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from tests.fixtures.services import ServiceProcess, free_port

    port = free_port()
    exe = str(Path(sys.executable).parent / "moto_server")
    service = ServiceProcess("moto", [exe, "-H", "127.0.0.1", "-p", str(port)], [port]).start()
    try:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # the handler's log lines
            result = once_soak(
                f"http://127.0.0.1:{port}",
                a.messages,
                a.crashes,
                a.seed,
                endpoints=a.endpoints,
                progress=None if a.quiet else sys.stderr,
            )
    finally:
        service.stop()
    print(json.dumps(asdict(result), indent=2))
    if result.repeated_effects or result.missing_effects or result.soak.lost:
        sys.exit(1)


if __name__ == "__main__":
    main()
