"""The cloud demo's S3 time-bucket tier: a tiny AWS-only run end to end, and the pieces around it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from delayed_delivery.app.demo.cloud_buckets import demo_tier, tier_summary_rows
from delayed_delivery.app.demo.cloud_model import CloudDemoResult, CloudSummary
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.wheel import COARSE, FINE, bucket_of


@pytest.mark.moto
def test_tiny_aws_demo_runs_the_tier_and_reports_its_figures() -> None:
    result = CliRunner().invoke(
        app, ["demo", "--cloud", "aws", "--quick", "--json", "--messages", "9", "--year-seconds", "8"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["lost"] == 0
    (aws,) = data["clouds"]
    assert aws["delivered"] == aws["expected_deliveries"] == 10  # the FIFO route's figures are its own
    tier = aws["buckets"]
    assert tier["delivered"] == tier["expected_deliveries"] == 10 and tier["lost"] == 0
    assert tier["early"] == tier["bucketed_early"] == 0 and tier["error_queue"] == 0
    assert tier["routes"]["buckets"] >= 4 and tier["bucketed"] >= 4  # 90 days, 1 year, cancelled, rescheduled
    assert tier["by_delay"]["1 year"] == {**tier["by_delay"]["1 year"], "messages": 1, "delivered": 1}
    # "1 year" is written coarse, split into fine buckets, then dispatched
    assert tier["objects_written"]["coarse"] >= 1 and tier["objects_written"]["fine"] >= 1
    assert tier["cascades"] >= 1 and tier["dispatched"] >= 3
    assert tier["records_applied"] == {"cancelled": 1, "rescheduled": 1}
    assert tier["cancelled"] == 1 and tier["cancelled_but_delivered"] == 0
    [late] = tier["rescheduled_lateness"]
    assert late is not None and late >= -0.25
    assert 0 <= tier["bucketed_lateness_p50"] <= tier["bucketed_lateness_p99"] < 5
    assert tier["timer_runs"] >= 5 and tier["ingest_invocations"] >= 1 and tier["timer_failures"] == {}
    assert data["native_caps"]["bucket_fine_seconds"] == 1


def test_compressed_levels_put_a_year_in_a_coarse_bucket() -> None:
    tier = demo_tier(DelayedDeliverySettings(error_queue="error"), SqsSettings(max_native_delay=1, fifo_queue_delay=1))
    assert tier.sqs_settings.long_delay_route == "buckets" and tier.sqs_settings.max_native_delay == 1
    assert tier.settings.error_queue == "error"
    levels = tier.levels
    now = datetime(2031, 2, 3, 4, 5, 6, 500_000, tzinfo=UTC)
    assert bucket_of(now + timedelta(seconds=8), now, levels).level == COARSE  # "1 year" at the tiny 8 s
    assert bucket_of(now + timedelta(seconds=2), now, levels).level == FINE


def _tier(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "delivered": 3, "expected_deliveries": 3, "lost": 0, "duplicates": 0, "bucketed_early": 0, "bucketed": 2,
        "routes": {"native": 1, "buckets": 2}, "objects_written": {"coarse": 1, "fine": 2}, "cascades": 1,
        "cascaded_messages": 1, "dispatched": 2, "duplicates_skipped": 0, "cancelled": 0,
        "cancelled_but_delivered": 0, "rescheduled": 1, "rescheduled_lateness": [0.5], "bucketed_lateness_p50": 0.4,
        "bucketed_lateness_p99": 0.9, "timer_runs": 9, "ingest_invocations": 2, "error_queue": 0,
    }  # fmt: skip
    base.update(changes)
    return base


def _result(tier: dict[str, object]) -> CloudDemoResult:
    requests = {"requests_per_hop": 1.0, "hops": 4, "hops_per_long_message": 4, "requests_per_message": 3.0,
                "empty_receives": 2}  # fmt: skip
    summary = CloudSummary("aws", 3, 2, 2, 0, 0, 0, 1, 1, 0, 0, 0, 0.5, 0.9, 0.9, requests=requests, buckets=tier)
    return CloudDemoResult([summary], 1e6, 30.0, {}, 1.0)


@pytest.mark.parametrize(
    ("changes", "ok", "lost"),
    [
        ({}, True, 0),
        ({"lost": 2}, False, 2),
        ({"cancelled_but_delivered": 1}, False, 0),
        ({"error_queue": 1}, False, 0),
    ],
)
def test_the_tier_counts_in_ok_and_lost(changes: dict[str, object], ok: bool, lost: int) -> None:
    result = _result(_tier(**changes))
    assert (result.ok, result.lost) == (ok, lost)
    assert result.as_dict()["clouds"][0]["buckets"]["lost"] == lost


def test_summary_rows_name_the_tier_figures() -> None:
    rows = dict(tier_summary_rows(_tier()))
    assert rows["S3 tier: objects written coarse / fine"] == "1 / 2"
    assert rows["S3 tier: lost, duplicates, early (bucketed)"] == "0, 0, 0"
    assert rows["S3 tier: bucketed lateness p50 / p99 (s)"] == "0.40 / 0.90"
    assert rows["S3 tier: rescheduled (after the new due)"] == "1 (+0.5 s)"


def test_exit_code_is_1_when_the_tier_lost_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import delayed_delivery.app.demo.cloud as cloud_demo

    monkeypatch.setattr(cloud_demo, "run_cloud_demo", lambda config, **kwargs: _result(_tier(lost=1)))
    table = CliRunner().invoke(app, ["demo"])
    assert table.exit_code == 1 and "S3 tier: delivered / expected" in table.stdout
