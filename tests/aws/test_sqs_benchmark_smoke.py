"""The request-counting benchmark runs at smoke size against the test moto server, and batching shows in the count."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.moto


def test_hops_are_batched_so_requests_per_hop_stay_far_below_the_seed_formula(moto_endpoint: str) -> None:
    from benchmarks.sqs_hops import measure

    counts = measure(20, 2, 2, 1, moto_endpoint, deliver=False)
    assert counts["hops"] >= 40 and counts["handler_errors"] == 0 and counts["failed_records"] == 0
    sends = counts["hop_requests"].get("SendMessageBatch", 0) + counts["hop_requests"].get("SendMessage", 0)
    deletes = counts["hop_requests"].get("DeleteMessageBatch", 0)
    assert sends / counts["hops"] <= 0.25  # records arrive ~10 at a time, one SendMessageBatch each
    assert deletes / counts["hops"] <= 0.25
    assert sum(counts["send_requests"].values()) == 2  # 20 messages, 10 per SendMessageBatch


def test_packed_hops_spend_fewer_requests_per_message_than_unpacked_ones(moto_endpoint: str) -> None:
    from benchmarks.sqs_hops import measure

    counts = measure(40, 2, 3, 1, moto_endpoint, deliver=False, pack_bytes=65536, body_bytes=1024)
    assert counts["hops"] >= 120 and counts["handler_errors"] == 0 and counts["failed_records"] == 0
    sends = counts["hop_requests"].get("SendMessageBatch", 0) + counts["hop_requests"].get("SendMessage", 0)
    # Unpacked, a send carries at most 10 messages (≥ 0.1 per message per hop); packed, one envelope many more.
    assert sends / counts["hops"] < 0.1
    assert counts["hop_billed_requests"] >= sum(counts["hop_requests"].values())


def test_packing_the_first_hop_too_halves_the_senders_requests_and_keeps_hops_packed(moto_endpoint: str) -> None:
    from benchmarks.sqs_hops import measure

    counts = measure(
        40, 2, 2, 1, moto_endpoint, deliver=False, pack_bytes=65536, body_bytes=1024, sender_pack_bytes=65536
    )
    assert counts["hops"] >= 80 and counts["handler_errors"] == 0 and counts["failed_records"] == 0
    assert sum(counts["send_requests"].values()) == 2  # one envelope of 20 messages per endpoint (unpacked: 4)
    sends = counts["hop_requests"].get("SendMessageBatch", 0) + counts["hop_requests"].get("SendMessage", 0)
    assert sends / counts["hops"] < 0.1


def test_throughput_benchmark_runs_at_smoke_size(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import sqs_throughput

    monkeypatch.setenv("MOTO_ENDPOINT", moto_endpoint)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "DelayedDeliveryBenchmark")  # run() sets it otherwise, for good
    rows = {r.metric: r for r in sqs_throughput.run(smoke=True)}
    assert set(rows) == {
        "raw_receive_send_delete_records_per_s",
        "raw_receive_send_delete_cpu_ms_per_record",
        "requeue_records_per_s",
        "requeue_cpu_ms_per_record",
        "requeue_unpacked_records_per_s",
        "requeue_unpacked_cpu_ms_per_record",
    }
    assert all(v > 0 for r in rows.values() for v in r.samples)
    assert rows["requeue_records_per_s"].ratio_to_baseline is not None


def test_packing_benchmark_runs_at_smoke_size(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import sqs_packing

    monkeypatch.setenv("MOTO_ENDPOINT", moto_endpoint)
    # run() turns Powertools down with os.environ.setdefault; set them here so they are undone after the test
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "ERROR")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    rows = {r.metric: r for r in sqs_packing.run(smoke=True)}
    for lost in ("packed_delivery_lost", "parked_delivery_lost"):
        assert rows[lost].samples == (0.0,), lost
    assert rows["parked_delivery_early"].samples == (0.0,)
    assert rows["parked_delivery_parks_per_message"].samples[0] >= 1  # the parked runs did park
    # packing beats unpacked on the same messages, and a park costs less than a hop
    assert (
        rows["packed_billed_requests_per_message_per_hop"].samples[0]
        < (rows["unpacked_billed_requests_per_message_per_hop"].samples[0])
    )
    assert (
        rows["parked_billed_requests_per_message_per_park"].samples[0]
        < (rows["parked_billed_requests_per_message_per_hop"].samples[0])
    )
