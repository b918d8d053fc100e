"""Migration into the S3 time-bucket tier (moto S3, a real local SparkSession): one object per bucket, idempotent."""

from __future__ import annotations

import base64
import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.model import DelayedMessage, Headers
from delayed_delivery.pipelines.bucket_target import BucketTarget, bucket_target_url, to_bucket_message
from delayed_delivery.pipelines.cli import build_parser, target_url
from delayed_delivery.pipelines.migrate import MigrationOptions, abort_migration, run_migration
from delayed_delivery.pipelines.targets import TargetSpec
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, BucketLevel, bucket_of
from tests.fixtures.moto import REGION

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
BUCKET = "migrated-tier"
PREFIX = "mig/buckets"


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    client.create_bucket(Bucket=BUCKET)
    return client


def _row(i: int, due: datetime, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {
        "Id": f"t-{i:04d}",
        "Destination": ("orders", "invoices", "shipments")[i % 3],
        "SagaId": "",
        "State": base64.b64encode(f'{{"n":{i}}}'.encode()).decode(),
        "Time": due.strftime("%Y-%m-%d %H:%M:%S.%f"),
        "Headers": json.dumps({"NServiceBus.MessageId": f"m-{i}", "n": str(i)}),
        "Endpoint": "Sales",
    }
    row.update(kw)
    return row


def _export(tmp_path: Path) -> tuple[Path, list[dict[str, object]]]:
    """300 good rows (due from 10 minutes ago to 60 days ahead), a repeated id, three rows SQS cannot take, rejects."""
    good = [_row(i, NOW + timedelta(minutes=-10 + i * 290)) for i in range(300)]
    rows = [
        *good,
        _row(1, NOW + timedelta(days=90)),  # id t-0001 again, due later: this copy is kept
        _row(900, NOW + timedelta(days=2), State=base64.b64encode(b"\xff\xfe").decode()),  # not UTF-8: refused
        _row(901, NOW + timedelta(days=2), Destination="orders.fifo"),  # FIFO destination: refused
        _row(902, NOW + timedelta(days=2), Headers=json.dumps({f"h{k}": "x" for k in range(11)})),  # 11 headers
        _row(903, NOW, Destination=""),  # reject: missing destination
        _row(904, NOW, Time="not-a-time"),  # reject: unparsable time
    ]
    src = tmp_path / "src" / "timeouts.csv"
    src.parent.mkdir(parents=True)
    with src.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    expected = [r for r in good if r["Id"] != "t-0001"] + [rows[300]]
    return src, expected


def _expected_message(row: dict[str, object]) -> BucketMessage:
    due = datetime.strptime(str(row["Time"]), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
    headers = Headers(json.loads(str(row["Headers"])))
    body = base64.b64decode(str(row["State"]))
    return to_bucket_message(DelayedMessage(str(row["Id"]), str(row["Destination"]), body, due, headers))


def _stored(s3: Any) -> tuple[dict[str, list[BucketMessage]], dict[BucketKey, int]]:
    """Every object's messages by key, and the objects per bucket."""
    store = S3BucketStore(s3, BUCKET, PREFIX)
    by_key: dict[str, list[BucketMessage]] = {}
    per_bucket: dict[BucketKey, int] = {}
    for level in (FINE, COARSE):
        for item in store.objects(level):
            contents = store.read(item.key)
            assert contents.complete and contents.bucket == item.bucket and item.count == len(contents.messages)
            by_key[item.key] = list(contents.messages)
            per_bucket[item.bucket] = per_bucket.get(item.bucket, 0) + 1
    return by_key, per_bucket


def _refused(out: Path, run_id: str) -> dict[str, str]:
    lines = [ln for p in (out / "runs" / run_id / "refused").glob("*.jsonl") for ln in p.read_text().splitlines()]
    return {json.loads(ln)["message_id"]: json.loads(ln)["reason"] for ln in lines}


@pytest.mark.spark
@pytest.mark.moto
def test_migrate_into_the_bucket_tier_one_object_per_bucket_idempotent_rerun(
    spark: Any, s3: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    src, expected_rows = _export(tmp_path)
    target = bucket_target_url(BUCKET, PREFIX, moto_endpoint, REGION)
    out = tmp_path / "out"
    summary = run_migration(spark, MigrationOptions(source=str(src), target=target, batches=4), str(out), now=NOW)

    assert (summary.rejected, summary.refused, summary.state) == (2, 3, "completed")
    assert summary.rows_written == len(expected_rows) == 300
    assert summary.already_due == 1  # t-0000, due 10 minutes ago
    refused = _refused(out, summary.run_id)
    assert set(refused) == {"t-0900", "t-0901", "t-0902"}
    assert "not UTF-8" in refused["t-0900"] and "FIFO" in refused["t-0901"] and "11 headers" in refused["t-0902"]

    by_key, per_bucket = _stored(s3)
    got = sorted((m for ms in by_key.values() for m in ms), key=lambda m: m.message_id)
    want = sorted((_expected_message(r) for r in expected_rows), key=lambda m: m.message_id)
    assert got == want  # ids, destinations, bodies, due times and attributes, each exactly once
    assert dict(got[1].attributes) == {
        "NServiceBus.MessageId": {"DataType": "String", "StringValue": "m-1"},
        "n": {"DataType": "String", "StringValue": "1"},
    }
    assert got[1].due_at == NOW + timedelta(days=90)  # the repeated id's later copy
    # One object per bucket (one Spark task writes a bucket), and the counts per bucket are the wheel's.
    levels = BucketLevel()
    want_counts: dict[BucketKey, int] = {}
    for m in want:
        bucket = bucket_of(m.due_at, NOW, levels)
        want_counts[bucket] = want_counts.get(bucket, 0) + 1
    got_counts = {bucket: 0 for bucket in per_bucket}
    for messages in by_key.values():
        bucket = bucket_of(messages[0].due_at, NOW, levels)
        assert all(bucket_of(m.due_at, NOW, levels) == bucket for m in messages)
        got_counts[bucket] += len(messages)
    assert got_counts == want_counts and set(per_bucket.values()) == {1}
    overdue = bucket_of(NOW - timedelta(minutes=10), NOW, levels)
    assert overdue.level == FINE and want_counts[overdue] == 1  # already due: a fine bucket, sent at once
    assert {b.level for b in per_bucket} == {FINE, COARSE}

    # A re-run of the whole job (a new run id, the same start time) writes the same keys: nothing doubles.
    again = run_migration(
        spark, MigrationOptions(source=str(src), target=target, batches=4), str(out), run_id="again", now=NOW
    )
    assert (again.rows_written, again.refused) == (300, 3)
    assert _stored(s3) == (by_key, per_bucket)

    result = abort_migration(spark, str(out), summary.run_id)
    assert not result.undone and "cannot take back" in result.note


@pytest.mark.moto
def test_bucket_target_holds_a_bucket_until_the_next_one_and_refuses_repeats(s3: Any, moto_endpoint: str) -> None:
    store = S3BucketStore(s3, BUCKET, PREFIX)
    target = BucketTarget(store, NOW)
    target.prepare()

    def msg(i: int, due: datetime) -> DelayedMessage:
        return DelayedMessage(f"u-{i}", "orders", f"b{i}".encode(), due, Headers({"k": "v"}))

    day = NOW + timedelta(days=5)
    assert target.write([msg(1, day), msg(2, day + timedelta(hours=1))]) == []
    assert target.objects == {}  # the bucket is held until it is complete
    refused = target.write([msg(1, day - timedelta(hours=1)), msg(3, NOW + timedelta(minutes=3))])
    assert [m for m, _ in refused] == ["u-1"] and "repeated" in refused[0][1]
    coarse = bucket_of(day, NOW)
    assert list(target.objects) == [coarse]  # written when a message of another bucket arrived
    target.flush()
    assert len(target.objects) == 2 and target.messages_written == 3
    assert [m.message_id for m in store.read(target.objects[coarse][0]).messages] == ["u-1", "u-2"]
    with pytest.raises(ConfigurationError, match="cannot take back"):
        target.undo(["u-1"])
    missing = BucketTarget(S3BucketStore(s3, "no-such-bucket", PREFIX), NOW)
    with pytest.raises(ConfigurationError, match="does not exist"):
        missing.prepare()


def test_the_command_line_builds_the_tier_url(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["migrate", "run", "-s", "x.csv", "--target", "s3buckets", "--bucket-name", "b1", "--prefix", "p/q",
            "--endpoint-url", "http://127.0.0.1:5000"]  # fmt: skip
    parsed = build_parser().parse_args(args)
    url = target_url(parsed.target, parsed.bucket_name, parsed.prefix, parsed.endpoint_url)
    assert url == "s3buckets:b1?endpoint_url=http://127.0.0.1:5000&prefix=p/q"
    spec = TargetSpec.parse(url)
    assert (spec.location, spec.option("prefix"), spec.option("endpoint_url")) == ("b1", "p/q", "http://127.0.0.1:5000")
    monkeypatch.setenv("DELAYED_DELIVERY_BUCKET_NAME", "from-env")
    assert target_url("s3buckets") == "s3buckets:from-env"
    monkeypatch.delenv("DELAYED_DELIVERY_BUCKET_NAME")
    with pytest.raises(ConfigurationError, match="--bucket-name"):
        target_url("s3buckets")
    with pytest.raises(ConfigurationError, match="go with --target s3buckets"):
        target_url("sqlite:x.db", bucket_name="b1")


@pytest.mark.spark
@pytest.mark.moto
def test_the_main_cli_migrates_into_the_tier_and_names_a_missing_bucket(
    spark: Any, s3: Any, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from delayed_delivery.app import cli
    from delayed_delivery.pipelines.schema import LegacyShape
    from delayed_delivery.pipelines.synthetic import write_legacy_export

    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 40, now=datetime.now(UTC))
    args = ["migrate", "run", "-s", export.path, "-o", str(tmp_path / "out"), "--json", "--target", "s3buckets",
            "--bucket-name", BUCKET, "--prefix", PREFIX, "--endpoint-url", moto_endpoint]  # fmt: skip
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert (summary["rows_written"], summary["state"]) == (40, "completed")
    assert summary["target"] == f"s3buckets:{BUCKET}?endpoint_url={moto_endpoint}&prefix={PREFIX}"
    assert sum(len(ms) for ms in _stored(s3)[0].values()) == 40

    monkeypatch.delenv("DELAYED_DELIVERY_BUCKET_NAME", raising=False)
    missing = CliRunner().invoke(cli.app, ["migrate", "run", "-s", export.path, "--target", "s3buckets"])
    assert missing.exit_code != 0 and "--bucket-name" in str(missing.exception or missing.output)
    absent = [*args[:-6], "--bucket-name", "no-such-bucket", "--endpoint-url", moto_endpoint, "--run-id", "r2"]
    res = CliRunner().invoke(cli.app, absent)
    assert res.exit_code != 0 and "does not exist" in str(res.exception or res.output)


@pytest.mark.spark
@pytest.mark.moto
def test_the_benchmark_migrates_into_the_tier_on_its_own_moto_at_smoke_size(spark: Any) -> None:
    from benchmarks.spark_migrate import measure

    results, _ = measure(1_000, store="s3buckets")
    assert [r["rows"] for r in results] == [1_000, 1_000]
    loop, job = (r["tier"] for r in results)
    assert loop == job and loop["messages"] == 1_000 and loop["objects"] == loop["buckets"] > 1  # type: ignore[index]
    assert loop["fine_objects"] + loop["coarse_objects"] == loop["objects"]  # type: ignore[index]


@pytest.mark.moto
def test_the_timer_sends_migrated_messages_an_already_due_one_at_its_first_run(s3: Any, sqs: Any) -> None:
    from delayed_delivery.aws.tier.timer import BucketTimer
    from delayed_delivery.clock import ManualClock
    from delayed_delivery.settings import DelayedDeliverySettings

    url = sqs.create_queue(QueueName="orders")["QueueUrl"]
    store = S3BucketStore(s3, BUCKET, PREFIX)
    target = BucketTarget(store, NOW)
    headers = Headers({"NServiceBus.MessageId": "m-1", "DelayedDelivery.Migrated.SagaId": "s"})
    overdue = DelayedMessage("late", "orders", b"late body", NOW - timedelta(hours=2), headers)
    later = DelayedMessage("later", "orders", b"later body", NOW + timedelta(days=3), headers)
    assert target.write([overdue, later]) == []
    target.flush()

    clock = ManualClock(NOW)
    timer = BucketTimer(store, sqs, DelayedDeliverySettings(), clock, owner="migration-test")
    assert timer.run().dispatched == 1
    (got,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"]
    assert got["Body"] == "late body"
    assert got["MessageAttributes"]["NServiceBus.MessageId"]["StringValue"] == "m-1"
    assert "DelayedDelivery.Migrated.SagaId" not in got["MessageAttributes"]
    clock.set(NOW + timedelta(days=3) - timedelta(minutes=5))
    assert timer.run().dispatched == 1  # cascaded from its day into its minute, then sent with DelaySeconds
