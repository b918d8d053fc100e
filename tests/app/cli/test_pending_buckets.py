"""``pending`` / ``cancel`` / ``reschedule --cloud aws --bucket-name`` on moto: the tier's exact table from the listing,
the records, the warning near the due time and the one-line refusals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayed_delivery.aws.cancellations import TABLE_ENV, ensure_cancellation_table
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import BucketLevel
from tests.app.cli.conftest import ok_json, one_line_error, run
from tests.aws.test_cancel_dynamodb import dynamodb_client
from tests.aws.tier.conftest import s3 as s3  # the S3 client fixture on moto

pytestmark = pytest.mark.moto

BUCKET = "cli-tier-bucket"
TABLE = "cli-tier-records"


@pytest.fixture
def aws(moto_endpoint: str, s3: Any, sqs: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A bucket with 4 fine and 6 coarse messages, a table, an ``orders`` queue; the route's options."""
    monkeypatch.setenv(TABLE_ENV, TABLE)
    for name in ("DELAYED_DELIVERY_BUCKET_NAME", "DELAYED_DELIVERY_BUCKET_PREFIX", "DELAYED_DELIVERY_LONG_DELAY_ROUTE"):
        monkeypatch.delenv(name, raising=False)
    s3.create_bucket(Bucket=BUCKET)
    ensure_cancellation_table(dynamodb_client(moto_endpoint), TABLE)
    sqs.create_queue(QueueName="orders")
    now = datetime.now(UTC)
    store = S3BucketStore(s3, BUCKET, levels=BucketLevel())
    due = [now + timedelta(hours=2)] * 4 + [now + timedelta(days=5)] * 6
    store.write_due([BucketMessage(f"m{i}", "orders", b"x", int(d.timestamp() * 1000)) for i, d in enumerate(due)], now)
    return ["--cloud", "aws", "--endpoint-url", moto_endpoint, "--region", "us-east-1"]


def test_pending_json_has_the_exact_census(aws: list[str]) -> None:
    data = ok_json("pending", *aws, "--bucket-name", BUCKET, "--by", "hour")
    tier = data["buckets"]
    assert (tier["messages"], tier["fine_messages"], tier["coarse_messages"], tier["exact"]) == (10, 4, 6, True)
    assert tier["by"] == "hour" and tier["next_due_bucket"]["level"] == "fine" and tier["oldest_overdue_seconds"] == 0
    assert tier["per_destination"].startswith("not available") and tier["records"] == []
    assert data["pending"] == 10 and data["route"] == "sqs-queue-attributes+s3-buckets"
    assert sum(row["count"] for row in data["backlog"]) == 10


def test_pending_text_from_the_environment(aws: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_BUCKET_NAME", BUCKET)
    result = run("pending", *aws)
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert f"time-bucket tier s3://{BUCKET}/delayed-delivery/buckets: 10 message(s)" in out
    assert "4 in fine buckets, 6 in coarse" in out and "oldest overdue: -" in out
    assert "per destination: not available" in out and "cancel / reschedule records waiting: 0" in out


def test_without_the_tier_pending_stays_approximate(aws: list[str]) -> None:
    data = ok_json("pending", *aws)
    assert "buckets" not in data and data["route"] == "sqs-queue-attributes"


def test_cancel_and_reschedule_show_in_pending(aws: list[str]) -> None:
    tier = [*aws, "--bucket-name", BUCKET]
    cancelled = ok_json("cancel", "m1", *tier, "--to", "orders")
    assert cancelled["requested"] == "cancel" and cancelled["warning"] is None and cancelled["table"] == TABLE
    assert cancelled["record_expires_at"] > "2100"
    moved = ok_json("reschedule", "m2", *tier, "--to", "orders", "--delay", "3d")
    assert moved["requested"] == "reschedule" and moved["found"] and "moved now into the coarse bucket" in moved["note"]
    records = ok_json("pending", *tier)["buckets"]["records"]
    assert sorted((r["message_id"], r["kind"]) for r in records) == [("m1", "cancel"), ("m2", "reschedule")]


def test_cancel_at_a_near_due_time_warns(aws: list[str]) -> None:
    soon = (datetime.now(UTC) + timedelta(minutes=3)).isoformat()
    result = run("cancel", "m3", *aws, "--bucket-name", BUCKET, "--to", "orders", "--at", soon)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning:") and "may already be on its way" in result.stderr
    assert "cancel of m3 accepted" in result.stdout


def test_reschedule_into_the_past_is_one_line(aws: list[str]) -> None:
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    result = run("reschedule", "m4", *aws, "--bucket-name", BUCKET, "--to", "orders", "--at", past)
    one_line_error(result, "is in the past")
    far = (datetime.now(UTC) + timedelta(days=365 * 101)).isoformat()
    one_line_error(run("reschedule", "m4", *aws, "--bucket-name", BUCKET, "--to", "orders", "--at", far), "100-year")


def test_a_missing_bucket_is_one_line(aws: list[str]) -> None:
    one_line_error(run("pending", *aws, "--bucket-name", "no-such-tier-bucket"), "no-such-tier-bucket")


def test_reschedule_moves_the_message_now(aws: list[str], s3: Any) -> None:
    tier = [*aws, "--bucket-name", BUCKET, "--to", "orders"]
    moved = ok_json("reschedule", "m5", *tier, "--delay", "1h", "--scan-limit", "10")
    assert (
        moved["found"] and not moved["sent_now"] and moved["bucket"].startswith("fine ") and moved["objects_read"] >= 1
    )
    store = S3BucketStore(s3, BUCKET, levels=BucketLevel())
    data = ok_json("pending", *aws, "--bucket-name", BUCKET)["buckets"]
    assert data["messages"] == 10 and data["fine_messages"] == 5  # moved, not copied
    now = ok_json("reschedule", "m0", *tier, "--delay", "5m", "--due", _due_of(store, "m0"))
    assert now["sent_now"] and now["bucket"] is None


def _due_of(store: S3BucketStore, message_id: str) -> str:
    for level in ("fine", "coarse"):
        for stored in store.objects(level):
            for m in store.read(stored.key).messages:
                if m.message_id == message_id:
                    return m.due_at.isoformat()
    raise AssertionError(message_id)


def test_reschedule_of_a_message_not_in_the_tier_exits_1(aws: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_LONG_DELAY_ROUTE", "buckets")
    result = run("reschedule", "nope", *aws, "--bucket-name", BUCKET, "--to", "orders", "--delay", "1h")
    assert result.exit_code == 1, result.output
    assert "no message 'nope' is waiting in the tier" in result.stderr and "ingest queue" in result.stdout
    limited = run(
        "reschedule", "m1", *aws, "--bucket-name", BUCKET, "--to", "orders", "--delay", "1h", "--scan-limit", "1"
    )
    one_line_error(limited, "--scan-limit")
    one_line_error(
        run("reschedule", "m1", *aws, "--to", "orders", "--delay", "1h", "--due", "2031-01-01T00:00:00Z"),
        "--bucket-name",
    )


def test_pending_shows_the_work_in_flight_in_the_dispatch_workers(aws: list[str], s3: Any) -> None:
    from dataclasses import replace

    from delayed_delivery.aws.tier.plan_store import PlanStore
    from delayed_delivery.timebuckets.plans import DispatchPlan, PartitionProgress, PieceCounts

    store = S3BucketStore(s3, BUCKET, levels=BucketLevel())
    [fine] = [o for o in store.objects("fine")]
    plans = PlanStore(store)
    plan = DispatchPlan(fine.bucket, int(datetime.now(UTC).timestamp() * 1000), 2, (fine.key.rsplit("/", 1)[1],))
    assert plans.create_plan(plan)
    working = PartitionProgress(fine.bucket, plan.created_ms, 0, 2, owner="w0", lease_until_ms=plan.created_ms + 10**6,
                                counts=PieceCounts(sent=2, cancelled=1))  # fmt: skip
    assert plans.write_progress(working, None)
    done = replace(working, partition=1, owner="", lease_until_ms=0, done=True, counts=PieceCounts(sent=1))
    assert plans.write_progress(done, None)
    data = ok_json("pending", *aws, "--bucket-name", BUCKET)
    [flight] = data["buckets"]["in_flight"]
    assert (flight["partitions"], flight["partitions_done"], flight["partitions_working"]) == (2, 1, 1)
    assert (flight["sent"], flight["handled"]) == (3, 4)
    assert data["pending"] == 10 - 4 and data["buckets"]["messages"] == 10  # listed until the plan is done
    result = run("pending", *aws, "--bucket-name", BUCKET)
    assert "1/2 partitions done, 1 worker(s) on it, 3 message(s) sent so far" in " ".join(result.stdout.split())
