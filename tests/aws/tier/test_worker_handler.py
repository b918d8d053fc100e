"""The dispatch function: tasks from its SQS event run a partition worker; a task that cannot be read reaches the
error queue with the reason; an unexpected failure is a partial batch failure; the entry point reads nothing at
import."""

from __future__ import annotations

import importlib
import json
import uuid
from typing import Any

import pytest

import functions.aws.bucket_dispatch as bucket_dispatch
from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.plan_store import SqsTaskQueue
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.aws.tier.worker import WorkerResult
from delayed_delivery.aws.tier.worker_handler import METRICS, build_dispatch_handler
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.testing.aws import LocalLambdaContext
from delayed_delivery.testing.aws.sqs import drain
from tests.aws.tier.test_fanout import BIG, _big
from tests.aws.tier.timer_support import SETTINGS, START, make_store, queue_url

pytestmark = pytest.mark.moto

BURST = TierSettings(bucket_inline_max_messages=10, bucket_piece_bytes=16 * 1024, bucket_partition_messages=30,
                      bucket_dispatch_concurrency=2, bucket_dispatch_queue="dispatch")  # fmt: skip


def _config(bucket: str, settings: TierSettings) -> BucketTierConfig:
    service = f"dispatch-{uuid.uuid4().hex[:8]}"
    tier = settings.with_(**{k: getattr(BURST, k) for k in BURST.__dataclass_fields__ if k.startswith("bucket_")
                             and "seconds" not in k and k != "bucket_send_phase_ms"})  # fmt: skip
    return BucketTierConfig(bucket, prefix="dd/buckets", settings=SETTINGS, tier_settings=tier, service=service,
                            metrics_namespace="T")  # fmt: skip


def _event(*bodies: Any) -> dict[str, Any]:
    return {"Records": [{"messageId": f"r{n}", "body": body} for n, body in enumerate(bodies)]}


def test_tasks_from_the_queue_send_the_plan_and_report_metrics(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("orders", "errors", "dispatch"):
        queue_url(sqs, name)
    config = _config(tier_bucket, tier_settings)
    store = make_store(s3, tier_bucket, tier_settings)
    for batch in _big(60):
        store.write(BIG, batch)
    clock = ManualClock(START)
    queue = SqsTaskQueue(sqs, "dispatch")
    assert BucketTimer(store, sqs, SETTINGS, clock, owner="t", tier=BURST, queue=queue).run().tasks_enqueued == 2
    bodies = [m["Body"] for m in drain(sqs, queue_url(sqs, "dispatch"))]
    seen: list[WorkerResult] = []
    handler = build_dispatch_handler(config, s3=s3, sqs=sqs, clock=clock, on_result=seen.append)
    capsys.readouterr()
    assert handler(_event(*bodies), LocalLambdaContext()) == {"batchItemFailures": []}
    assert sum(r.dispatched for r in seen) == 60 and all(r.finished for r in seen)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sum(line.get("dispatched", 0) for line in lines if line.get("event") == "bucket_dispatch_run") == 60
    emitted = [line for line in lines if "_aws" in line]
    assert {name for name, _ in METRICS.values()} <= {k for line in emitted for k in line}


@pytest.mark.parametrize("body", ["not json", '{"format":"delayed-delivery-dispatch/1"}', 7, "x" * 100_000])
def test_a_task_that_cannot_be_read_goes_to_the_error_queue(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, body: Any
) -> None:
    errors = queue_url(sqs, "errors")
    handler = build_dispatch_handler(_config(tier_bucket, tier_settings), s3=s3, sqs=sqs, clock=ManualClock(START))
    assert handler(_event(body), LocalLambdaContext()) == {"batchItemFailures": []}
    [notice] = drain(sqs, errors)
    document = json.loads(notice["Body"])
    assert document["format"] == "delayed-delivery-dispatch-poison/1" and len(notice["Body"]) < 20_000
    assert "cannot be read" in notice["MessageAttributes"]["DelayedDelivery.FailureReason"]["StringValue"]


def test_an_unexpected_failure_is_a_partial_batch_failure(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayed_delivery.aws.tier import worker
    from delayed_delivery.timebuckets.plans import DispatchTask, encode_task

    def boom(self: Any, task: Any, deadline: Any = None) -> WorkerResult:
        raise RuntimeError("surprise")

    monkeypatch.setattr(worker.PartitionWorker, "run", boom)
    handler = build_dispatch_handler(_config(tier_bucket, tier_settings), s3=s3, sqs=sqs, clock=ManualClock(START))
    task = encode_task(DispatchTask(BIG, 1, 0, 1))
    assert handler(_event(task), LocalLambdaContext()) == {"batchItemFailures": [{"itemIdentifier": "r0"}]}


def test_the_entry_point_reads_nothing_at_import_and_needs_its_queue(
    monkeypatch: pytest.MonkeyPatch, tier_settings: TierSettings
) -> None:
    module = importlib.reload(bucket_dispatch)
    assert not module.handler.built
    monkeypatch.setenv("DELAYED_DELIVERY_BUCKET_NAME", "some-tier-bucket")
    monkeypatch.delenv("DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE", raising=False)
    with pytest.raises(ConfigurationError, match="DISPATCH_QUEUE"):
        module.handler({"Records": []}, LocalLambdaContext())
