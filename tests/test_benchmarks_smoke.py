"""Every benchmark runs at smoke size, so the suite keeps working (figures come from the full runs)."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import discover
from benchmarks.common import Row

#: No emulator needed (``cold_import`` times imports in fresh interpreters; ``bucket_memory`` runs the tier's timer
#: and a worker in a fresh interpreter against S3 on disk and SQS in memory).
CORE = ["core_dispatch", "cold_import", "bucket_memory"]
#: Benchmarks that start their own emulator (Azurite, PostgreSQL). SQS and Spark have their own smoke tests.
SERVICES = ["azure_dispatch", "postgres_mover"]


@pytest.mark.parametrize("name", CORE + SERVICES)
def test_core_benchmarks_run_at_smoke_size(name: str) -> None:
    import importlib

    rows = importlib.import_module(f"benchmarks.{name}").run(smoke=True)
    assert rows and all(isinstance(r, Row) and r.samples for r in rows)
    assert all(v >= 0 for r in rows for v in r.samples)
    assert any(v > 0 for r in rows for v in r.samples)


def test_discovery_finds_the_core_benchmarks() -> None:
    assert set(CORE + SERVICES) <= set(discover())


@pytest.mark.moto
def test_aws_costs_counts_every_route_per_step_at_smoke_size(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import aws_costs

    monkeypatch.setenv("MOTO_ENDPOINT", moto_endpoint)
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "ERROR")  # run() sets these with setdefault; undone after the test
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    rows = {r.metric: r.median for r in aws_costs.run(smoke=True)}
    for lost in ("parked_lost", "buckets_near_lost", "buckets_far_lost"):
        assert rows[lost] == 0, lost
    # a park is its visibility change plus the receive that brings the envelope back: never free
    assert rows["parked_visibility_per_park"] > 0 and rows["parked_return_receive_per_park"] > 0
    assert rows["parked_billed_requests_per_message_per_park"] > 0 and rows["parked_parks_per_message"] >= 1
    # a far message is written twice (coarse, then fine), a near one once; each is dispatched once, in batches
    assert rows["buckets_far_s3_object_puts_per_message"] > rows["buckets_near_s3_object_puts_per_message"] > 0
    assert rows["buckets_near_dispatch_requests_per_message"] == pytest.approx(0.1)
    assert rows["buckets_idle_timer_lists_per_run"] >= 1
    # storage is what S3 lists: gzip takes a JSON order document below 1 KiB, random text stays near it
    stored, random_text = (
        rows["buckets_near_stored_bytes_per_message"],
        rows["buckets_near_random_stored_bytes_per_message"],
    )
    assert 0 < stored < random_text
    # Lambda time is CPU plus each counted request's assumed latency, never zero
    assert rows["buckets_near_lambda_gb_seconds_per_message"] > rows["buckets_near_lambda_cpu_seconds_per_message"] / 2
    # the tier's cost does not grow with the delay the way parking does
    assert rows["usd_per_million_1y_buckets"] < rows["usd_per_million_1y_parked_fifo"]
    assert 0 < rows["usd_per_million_1d_buckets"] <= rows["usd_per_million_1y_buckets"]


@pytest.mark.moto
def test_bucket_tier_lateness_throughput_and_memory_at_smoke_size(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import bucket_tier

    monkeypatch.setenv("MOTO_ENDPOINT", moto_endpoint)
    rows = {r.metric: r for r in bucket_tier.run(smoke=True)}
    assert rows["lateness_early_count"].median == 0 and rows["lateness_lost_count"].median == 0
    assert 0 <= rows["lateness_p50"].median <= rows["lateness_p99"].median < 5
    dispatch = rows["timer_dispatch_messages_per_s"]
    assert dispatch.median > 0 and dispatch.ratio_to_baseline is not None and dispatch.ratio_to_baseline > 0
    # the timer lists only what it needs: its peak memory and its listing stay put while pending grows 20×
    peaks = [r.median for name, r in rows.items() if name.startswith("timer_peak_mib_pending_")]
    assert len(peaks) == 2 and 0 < max(peaks) < 2 * min(peaks)
    assert {r.median for name, r in rows.items() if name.startswith("timer_list_calls_pending_")} == {2}


@pytest.mark.moto
def test_burst_moto_sends_a_planned_bucket_once_and_the_next_minute_on_time_at_smoke_size(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import burst_moto

    monkeypatch.setenv("MOTO_ENDPOINT", moto_endpoint)
    shape = burst_moto.SMOKE
    rows = {r.metric: r.median for r in burst_moto.run(smoke=True)}
    # every message of the burst accepted by SQS exactly once, and drained from its queue exactly once
    assert (rows["lost"], rows["duplicates"]) == (0, 0)
    assert (rows["drained_lost"], rows["drained_duplicates"]) == (0, 0)
    assert rows["early"] == 0 and rows["error_queue"] == 0 and rows["worker_lost_partition"] == 0
    # the workers sent it, in pieces (the bucket was planned, not sent inline by the timer)
    assert sum(rows[f"worker-{k}_dispatched"] for k in range(shape.workers)) == shape.messages
    assert rows["worker_pieces"] > shape.workers
    # the next minute's message: sent once, visible at SQS and received within one timer period of its due time
    assert rows["next_minute_copies"] == 1
    assert 0 <= rows["next_minute_lateness_s"] <= shape.timer_seconds
    assert rows["next_minute_arrival_lateness_s"] <= shape.timer_seconds + 1  # + the watcher's poll
    assert all(rows[f"worker-{k}_peak_rss_mib"] > 0 for k in range(shape.workers))


def test_held_backlog_costs_about_one_rewrite_per_message_not_one_per_run_at_smoke_size() -> None:
    from benchmarks import held_backlog
    from delayed_delivery.aws.tier.held import MIN_HELD_OBJECT

    n = held_backlog.SMOKE_MESSAGES
    rows = {r.metric: r.median for r in held_backlog.run(smoke=True)}
    held, before = rows[f"held_{n}_lines_rewritten_per_message"], rows[f"before_{n}_lines_rewritten_per_message"]
    # the held area: each held message written once, plus what is left of the object a run releases in part
    assert 0 < held <= 2
    # the old rule rewrote every held message every run (33 runs here): the square of the backlog
    assert before > 5 * held
    # a run reads what it releases plus at most one held object (100 messages at 1/s), whatever the backlog
    spare = rows[f"held_{n}_lines_read_beyond_sent_per_run"]
    assert 0 < spare <= MIN_HELD_OBJECT < rows[f"before_{n}_lines_read_beyond_sent_per_run"]
