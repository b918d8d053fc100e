"""The report on the tiny cloud demo's own ``-v`` logs: its drains (the tier's too) log a ``consumed`` line each."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.pipelines.report import build_report

pytestmark = [pytest.mark.spark, pytest.mark.moto, pytest.mark.azurite]

ROOT = Path(__file__).resolve().parents[2]
#: The demo's destinations: the mix (orders, billing), Azure's capped burst (invoices), the schedules (digest).
ENDPOINTS = ("orders", "billing", "invoices", "digest")


def test_the_report_turns_the_demo_logs_into_end_to_end_lateness(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    command = [sys.executable, "-c", "from delayed_delivery.app.entry import main; main()"]
    args = ["demo", "--quick", "--json", "--messages", "9", "--year-seconds", "8", "-v"]
    with (logs / "demo.jsonl").open("w", encoding="utf-8") as stderr:
        run = subprocess.run(command + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + (logs / "demo.jsonl").read_text(encoding="utf-8")[-4000:]
    clouds = json.loads(run.stdout)["clouds"]
    # AWS delivers the mix twice: through the FIFO route and through the S3 time-bucket tier (its own figures).
    delivered = {c["cloud"]: c["delivered"] + c["buckets"].get("delivered", 0) for c in clouds}
    assert delivered == {"aws": 20, "azure": 10}
    # Azure's capped burst to `invoices` has its own figures (release control): its messages are consumed too.
    for cloud in clouds:
        if cloud.get("release"):
            delivered[cloud["cloud"]] += cloud["release"]["delivered"]
    # Each cloud's recurring schedule (to `digest`) has its own figures: its consumer logs each occurrence too,
    # naming its schedule and nominal instant.
    fired = {c["cloud"]: c["recurring"]["fired"] for c in clouds}
    occurrences = {c["cloud"]: set(c["recurring"]["occurrences"]) for c in clouds}

    consumed: dict[str, set[str]] = defaultdict(set)
    lateness: list[float] = []
    for text in (logs / "demo.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(text) if text.startswith("{") else {}
        if record.get("event") == "consumed":
            assert record["destination"] in ENDPOINTS and record["due_at"]
            kind = "recurring" if record["destination"] == "digest" else "mix"
            consumed[f"{record['cloud']}-{kind}"].add(record["message_id"])
            lateness.append(record["consumer_lateness_s"])
            named = f"{record['schedule_id']}@{record['occurrence']}" if record["occurrence"] else None
            assert named == (record["message_id"] if kind == "recurring" else None), record
    assert {cloud: len(consumed[f"{cloud}-mix"]) for cloud in delivered} == delivered
    assert {cloud: consumed[f"{cloud}-recurring"] for cloud in fired} == occurrences
    assert {cloud: len(ids) for cloud, ids in occurrences.items()} == fired and min(fired.values()) > 0, fired
    assert lateness and min(lateness) >= 0

    report = build_report(spark, str(logs), str(tmp_path / "report"))
    rows = report.tables["consumer_lateness_by_endpoint"]
    assert {r["endpoint"] for r in rows} == set(ENDPOINTS)
    assert sum(r["messages"] for r in rows) == sum(len(ids) for ids in consumed.values())
    assert all(0 <= r["p50_s"] <= r["max_s"] for r in rows)
    assert not any("No `consumed` line" in note for note in report.notes)

    # Worth reading: every delivered message has its band (the logs carry the delays; only poison and cancelled
    # messages, never delivered, may lack one; the schedules' occurrences are "recurring", both clouds'), both clouds
    # named, bars per minute, one page.
    bands = [r["band"] for name in ("lateness_by_band", "consumer_lateness_by_band") for r in report.tables[name]]
    assert "recurring" in bands and "unknown" not in bands, bands
    by_band = {r["band"]: r["messages"] for r in report.tables["consumer_lateness_by_band"]}
    assert by_band["recurring"] == sum(fired.values())
    assert "Clouds named in these logs: aws, azure." in report.notes
    assert sum(r["dispatched"] for r in report.tables["throughput"]) > 0
    out = tmp_path / "report"
    assert {Path(c).name for c in report.charts} >= {"lateness_by_band.png", "throughput.png", "hops.png"}
    page = (out / "summary.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == len(report.charts) and "aws, azure" in page
