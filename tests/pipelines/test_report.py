"""The report job against a small, hand-computable log."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.pipelines.report import TABLE_COLUMNS, ReportResult, build_report
from delayed_delivery.pipelines.synthetic import write_logs

pytestmark = pytest.mark.spark

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Trimmed stderr of ``delayed-delivery demo --quick --cloud aws|azure -v`` (the documented way to get logs).
DATA = Path(__file__).parent / "data"


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def line(mid: str, event: str, t: float, endpoint: str = "A", **kw: object) -> str:
    return json.dumps({"timestamp": at(t), "level": "INFO", "logger": "x", "message": event, "event": event,
                       "message_id": mid, "destination": "q-" + endpoint, "endpoint": endpoint, **kw})  # fmt: skip


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hand-computable log folder; read-only (a test that adds lines copies it)."""
    rows = [
        # m1: 600 s delay (band ≤15 min), 1 s late.
        line("m1", "stored", 0, due_at=at(600)),
        line("m1", "dispatched", 601, lateness_s=1.0),
        # m2: 600 s delay, 2 s late, then delivered again by a second dispatcher (one duplicate).
        line("m2", "stored", 0, due_at=at(600)),
        line("m2", "dispatched", 602, lateness_s=2.0),
        line("m2", "already_removed", 603),
        # m3: SQS, 3000 s delay (band 15 min–1 h): 3 FIFO hops, then 4 s late.
        line("m3", "stored", 0, due_at=at(3000), cloud="aws"),
        line("m3", "requeued", 900, hop=1, remaining_delay_s=2100, cloud="aws"),
        line("m3", "requeued", 1800, hop=2, remaining_delay_s=1200, cloud="aws"),
        line("m3", "forwarded", 2700, hop=3, remaining_delay_s=300, cloud="aws"),
        line("m3", "dispatched", 3004, lateness_s=4.0, cloud="aws"),
        # m4: endpoint B, poison: error queue with a reason, never dispatched.
        line("m4", "stored", 0, "B", due_at=at(600)),
        line("m4", "dispatch_failed", 600, "B", reason="TransientError()"),
        line("m4", "moved_to_error_queue", 601, "B", reason="PermanentError('bad')"),
        # m5: endpoint B, delay logged explicitly (100000 s: band 1 d–30 d), 3 s late.
        line("m5", "dispatched", 100_003, "B", lateness_s=3.0, delay_s=100_000),
        # m6: Powertools-style and epoch-millisecond timestamps (as CloudWatch exports them) parse too.
        json.dumps(
            {
                "timestamp": "2026-01-01 00:20:00,500+0000",
                "event": "stored",
                "message_id": "m6",
                "destination": "q-C",
                "endpoint": "C",
                "due_at": at(1800),
            }
        ),
        json.dumps(
            {
                "timestamp": int((T0.timestamp() + 1800.5) * 1000),
                "event": "dispatched",
                "message_id": "m6",
                "destination": "q-C",
                "endpoint": "C",
                "lateness_s": 0.5,
            }
        ),
        "this line is not JSON",
    ]
    path = tmp_path_factory.mktemp("hand") / "logs" / "a.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(rows) + "\n")
    return path.parent


@pytest.fixture(scope="module")
def report(spark: Any, logs: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[ReportResult, Path]:
    """The report of ``logs`` and its folder, built once for the tests that only read it (each build is ~25 Spark
    jobs)."""
    out = tmp_path_factory.mktemp("hand-report") / "report"
    return build_report(spark, str(logs), str(out)), out


def test_report_numbers_match_the_hand_computed_values(spark: Any, report: tuple[ReportResult, Path]) -> None:
    r, out = report
    assert (r.lines, r.events, r.messages) == (17, 16, 6)

    by_ep = {row["endpoint"]: row for row in r.tables["lateness_by_endpoint"]}
    assert (by_ep["A"]["messages"], by_ep["A"]["p50_s"], by_ep["A"]["p95_s"], by_ep["A"]["max_s"]) == (3, 2.0, 4.0, 4.0)
    assert (by_ep["B"]["messages"], by_ep["B"]["p50_s"], by_ep["B"]["p99_s"]) == (1, 3.0, 3.0)

    by_band = {row["band"]: row for row in r.tables["lateness_by_band"]}
    assert list(by_band) == ["≤15 min", "15 min–1 h", "1 d–30 d"]
    # ≤15 min holds m1 (1 s), m2 (2 s) and m6 (0.5 s): nearest-rank p50 = 1, p95 = 2.
    assert (by_band["≤15 min"]["messages"], by_band["≤15 min"]["p50_s"], by_band["≤15 min"]["p95_s"]) == (3, 1.0, 2.0)

    dups = {row["endpoint"]: row for row in r.tables["duplicates"]}
    assert (dups["A"]["duplicate_deliveries"], dups["A"]["messages_with_duplicates"]) == (1, 1)
    assert dups["B"]["duplicate_deliveries"] == 0

    assert {row["hops"]: row["messages"] for row in r.tables["hops"]} == {0: 5, 3: 1}
    assert r.tables["error_queue"] == [{"endpoint": "B", "reason": "PermanentError('bad')", "forwards": 1}]
    assert [(row["minute"].minute, row["dispatched"]) for row in r.tables["throughput"]] == [
        (10, 2),
        (30, 1),  # m6, from its epoch-ms timestamp
        (45, 1),  # m3's forward to its destination queue: the SQS route's hand-over
        (50, 1),
        (46, 1),
    ]
    assert by_ep["C"]["p50_s"] == 0.5
    m6 = spark.read.parquet(str(out / "messages.parquet")).filter("message_id = 'm6'").first()
    assert (m6["delay_s"], m6["band"]) == (599.5, "≤15 min")  # due 00:30:00 − stored 00:20:00.5 (Powertools format)

    (cost,) = r.tables["cost_by_band"]  # only m3 went through SQS
    assert (cost["band"], cost["messages"], cost["measured_requests_per_message"]) == ("15 min–1 h", 1, 7.0)
    assert cost["measured_usd_per_message"] == pytest.approx(6 * 0.5e-6 + 0.4e-6)
    assert cost["nservicebus_formula_requests_per_message"] == pytest.approx(3000 / 900 * 2)
    assert cost["nservicebus_formula_usd_per_message"] == pytest.approx(3000 / 900 * 2 * 0.5e-6)

    for name in ("lateness_by_endpoint", "lateness_by_band", "duplicates", "error_queue", "cost_by_band"):
        assert (out / f"{name}.csv").read_text().count("\n") == len(r.tables[name]) + 1
        assert list((out / f"{name}.parquet").glob("*.parquet"))
    assert spark.read.parquet(str(out / "messages.parquet")).count() == 6
    for png in ("lateness_by_band", "throughput", "hops", "cost_by_band"):
        assert (out / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    summary = (out / "summary.md").read_text()
    assert "1 duplicate deliveries; 1 error-queue forwards" in summary
    assert "| B | PermanentError('bad') | 1 |" in summary


def test_synthetic_logs_are_deterministic_and_reportable(spark: Any, tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert write_logs(a, 40, seed=7) == write_logs(b, 40, seed=7)
    assert a.read_bytes() == b.read_bytes()
    r = build_report(spark, str(a), str(tmp_path / "rep"))
    assert r.messages == 40
    assert sum(row["forwards"] for row in r.tables["error_queue"]) == 1  # every 40th message
    assert sum(row["duplicate_deliveries"] for row in r.tables["duplicates"]) == 0


def _assert_every_table_is_written_with_its_columns(spark: Any, out: Path) -> None:
    for name, columns in TABLE_COLUMNS.items():
        assert (out / f"{name}.csv").read_text().splitlines()[0] == ",".join(c for c, _ in columns)
        frame = spark.read.parquet(str(out / f"{name}.parquet"))
        assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == list(columns)
    assert (out / "summary.md").exists()


def test_an_empty_log_folder_gives_empty_tables_and_a_summary_that_says_so(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    out = tmp_path / "report"
    r = build_report(spark, str(tmp_path / "logs"), str(out))
    assert (r.lines, r.events, r.messages) == (0, 0, 0)
    assert all(rows == [] for rows in r.tables.values()) and r.charts == ()
    _assert_every_table_is_written_with_its_columns(spark, out)
    assert r.notes == (f"No log lines in {tmp_path / 'logs'}: every table is empty.",)
    assert r.notes[0] in (out / "summary.md").read_text()


def test_log_lines_without_events_say_so(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "x.jsonl"
    logs.parent.mkdir()
    logs.write_text('starting …\n{"level": "INFO", "message": "lease acquired", "event": "lease_acquired"}\n')
    r = build_report(spark, str(logs.parent), str(tmp_path / "report"))
    assert (r.lines, r.events, r.messages) == (2, 0, 0)
    assert "None of the 2 log lines is a delayed-delivery event" in r.notes[0]


def test_aws_only_demo_logs_report_hops_and_cost_without_lateness(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "demo.jsonl").write_bytes((DATA / "demo-aws.jsonl").read_bytes())
    out = tmp_path / "report"
    r = build_report(spark, str(logs), str(out))  # the SQS function logs no lateness and no stored events
    assert r.events > 0 and r.messages > 0
    assert r.tables["lateness_by_endpoint"] == [] and r.tables["lateness_by_band"] == []
    forwards = (DATA / "demo-aws.jsonl").read_text().count('"event":"forwarded"')
    assert sum(row["dispatched"] for row in r.tables["throughput"]) == forwards > 0  # the hand-overs to destinations
    assert sum(row["messages"] for row in r.tables["hops"]) == r.messages
    assert max(row["hops"] for row in r.tables["hops"]) >= 2
    assert sum(row["forwards"] for row in r.tables["error_queue"]) == 2  # the demo's two poison messages
    (cost,) = r.tables["cost_by_band"]  # no delay known (no stored event): band unknown, no formula figure
    assert (cost["band"], cost["messages"], cost["mean_delay_s"]) == ("unknown", r.messages, None)
    assert cost["measured_requests_per_message"] > 1
    _assert_every_table_is_written_with_its_columns(spark, out)
    assert r.notes[0] == "Clouds named in these logs: aws."
    assert any(f"{r.messages} message(s) have no delay in these logs" in note for note in r.notes)
    assert any("No message has a logged lateness" in note for note in r.notes)
    summary = (out / "summary.md").read_text()
    assert "No message has a logged lateness" in summary and "lateness_by_band.png" not in summary
    assert "seed" not in summary.lower()


def test_azure_only_demo_logs_report_lateness_without_cost(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "report"
    r = build_report(spark, str(DATA / "demo-azure.jsonl"), str(out))
    delivered = sum(row["messages"] for row in r.tables["lateness_by_endpoint"])
    assert delivered == sum(row["dispatched"] for row in r.tables["throughput"]) > 0
    assert all(row["max_s"] >= row["p50_s"] >= 0 for row in r.tables["lateness_by_endpoint"])
    assert sum(row["forwards"] for row in r.tables["error_queue"]) == 2
    assert r.tables["cost_by_band"] == []
    _assert_every_table_is_written_with_its_columns(spark, out)
    assert "No SQS messages (`cloud` `aws`, or logged `requests`), so the cost table is empty." in r.notes
    assert (out / "lateness_by_band.png").exists() and not (out / "cost_by_band.png").exists()


def test_synthesised_one_cloud_logs_without_lateness_or_delay(spark: Any, tmp_path: Path) -> None:
    # What made the report fail: a table whose rows exist but one column is null in every row.
    logs = tmp_path / "logs" / "a.jsonl"
    logs.parent.mkdir()
    logs.write_text(
        "\n".join(
            [
                line("s1", "requeued", 900, cloud="aws", hop=1, remaining_delay_s=100),
                line("s1", "forwarded", 1000, cloud="aws", hop=2, remaining_delay_s=1),
                line("s2", "forwarded", 10, cloud="aws", hop=1, remaining_delay_s=1),
            ]
        )
        + "\n"
    )
    r = build_report(spark, str(logs.parent), str(tmp_path / "report"))
    assert r.messages == 2 and r.tables["lateness_by_band"] == []
    (cost,) = r.tables["cost_by_band"]
    assert (cost["messages"], cost["mean_hops"], cost["measured_requests_per_message"]) == (2, 1.5, 4.0)
    assert cost["nservicebus_formula_requests_per_message"] is None


def consumed(
    mid: str,
    t: float,
    destination: str,
    lateness: float | None,
    delay: float | None,
    cloud: str | None = "aws",
    **occurrence: str,
) -> str:
    """A consumer's ``consumed`` line, as ``observe_lateness`` writes it (docs/receiving.md); an occurrence's names
    its ``schedule_id`` and ``occurrence`` (lines logged before #35 had neither key)."""
    return json.dumps({"timestamp": at(t), "level": "INFO", "message": "consumed", "event": "consumed",
                       "cloud": cloud, "destination": destination, "message_id": mid, "due_at": at(t - (lateness or 0)),
                       "hop": 1, "route": "fifo", "consumer_lateness_s": lateness, "delay_s": delay,
                       **occurrence})  # fmt: skip


def test_consumer_lines_give_end_to_end_lateness_and_leave_the_other_tables_alone(
    spark: Any, logs: Path, report: tuple[ReportResult, Path], tmp_path: Path
) -> None:
    before = report[0]  # the same logs without consumer lines
    logs = shutil.copytree(logs, tmp_path / "logs")
    assert before.tables["consumer_lateness_by_endpoint"] == [] == before.tables["consumer_lateness_by_band"]
    assert any("No `consumed` line" in note for note in before.notes)
    (logs / "consumer.jsonl").write_text(
        "\n".join(
            [
                consumed("m1", 603, "q-A", 3.0, 600, None),  # 2 s after its dispatch (a store route: no cloud)
                consumed("m1", 700, "q-A", 100.0, 600, None),  # consumed again: the first one counts
                consumed("m3", 3009, "q-A", 9.0, 3000),
                consumed("m5", 100_010, "q-B", 10.0, 100_000, None),
                consumed("x9", 50, "q-B", 0.5, None),  # no send time: the unknown band
                consumed("x10", 60, "q-B", None, None),  # no due time: no lateness, left out
            ]
        )
        + "\n"
    )
    out = tmp_path / "after"
    after = build_report(spark, str(logs), str(out))
    assert after.tables["consumer_lateness_by_endpoint"] == [
        {"endpoint": "q-A", "messages": 2, "p50_s": 3.0, "p95_s": 9.0, "p99_s": 9.0, "max_s": 9.0},
        {"endpoint": "q-B", "messages": 2, "p50_s": 0.5, "p95_s": 10.0, "p99_s": 10.0, "max_s": 10.0},
    ]
    assert after.tables["consumer_lateness_by_band"] == [
        {"band": "≤15 min", "messages": 1, "p50_s": 3.0, "p95_s": 3.0, "p99_s": 3.0, "max_s": 3.0},
        {"band": "15 min–1 h", "messages": 1, "p50_s": 9.0, "p95_s": 9.0, "p99_s": 9.0, "max_s": 9.0},
        {"band": "1 d–30 d", "messages": 1, "p50_s": 10.0, "p95_s": 10.0, "p99_s": 10.0, "max_s": 10.0},
        {"band": "unknown", "messages": 1, "p50_s": 0.5, "p95_s": 0.5, "p99_s": 0.5, "max_s": 0.5},
    ]
    others = [name for name in TABLE_COLUMNS if not name.startswith("consumer_")]
    assert {n: after.tables[n] for n in others} == {n: before.tables[n] for n in others}  # dispatch side unchanged
    assert after.messages == before.messages and after.events == before.events + 6
    assert not any("No `consumed` line" in note for note in after.notes)
    summary = (out / "summary.md").read_text()
    assert "## End-to-end lateness at the consumer by endpoint" in summary and "| q-B | 2 |" in summary
    _assert_every_table_is_written_with_its_columns(spark, out)


def test_a_consumed_line_gives_a_dispatched_message_its_delay_and_cloud(spark: Any, tmp_path: Path) -> None:
    """Dispatcher lines without a send time (a store dispatcher's) get their band and cloud from the consumer; an
    occurrence of a recurring schedule has the band ``recurring``, whatever its delay (the timer's lead)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    azure_occurrence = {"schedule_id": "s1", "occurrence": "2026-01-01T00:10:00Z"}
    aws_occurrence = {"schedule_id": "s2", "occurrence": "2026-01-01T00:20:00Z"}
    (logs / "a.jsonl").write_text(
        "\n".join(
            [
                line("d1", "dispatched", 90_000, lateness_s=0.2),  # no stored line, no delay_s: band unknown alone
                line("d2", "dispatched", 500, lateness_s=0.1),
                consumed("d1", 90_001, "q-A", 1.0, 90_000, "azure"),
                # An Azure occurrence: dispatched from the table (no delay known), then consumed 0.7 s after it fired.
                line("s1@2026-01-01T00:10:00Z", "dispatched", 600.4, lateness_s=0.4, cloud="azure"),
                consumed("s1@2026-01-01T00:10:00Z", 600.7, "q-A", 0.7, None, "azure", **azure_occurrence),
                # An AWS occurrence: sent straight to its queue 240 s ahead (no dispatch-side line), 1.5 s late.
                consumed("s2@2026-01-01T00:20:00Z", 1201.5, "q-B", 1.5, 240, **aws_occurrence),
            ]
        )
        + "\n"
    )
    r = build_report(spark, str(logs), str(tmp_path / "report"))
    bands = {row["band"]: row["messages"] for row in r.tables["lateness_by_band"]}
    assert bands == {"1 d–30 d": 1, "recurring": 1, "unknown": 1}
    assert r.tables["consumer_lateness_by_band"] == [
        {"band": "1 d–30 d", "messages": 1, "p50_s": 1.0, "p95_s": 1.0, "p99_s": 1.0, "max_s": 1.0},
        {"band": "recurring", "messages": 2, "p50_s": 0.7, "p95_s": 1.5, "p99_s": 1.5, "max_s": 1.5},
    ]
    assert "Clouds named in these logs: aws, azure." in r.notes  # aws: the AWS occurrence's consumed line
    assert any("1 message(s) have no delay in these logs" in note for note in r.notes)  # d2; not the occurrence
