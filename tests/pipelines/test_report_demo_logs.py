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
    # Each cloud's recurring schedule (to `digest`) has its own figures; only Azure's consumer logs its occurrences
    # (the AWS side counts them from the queue), so they are checked apart.
    fired = {c["cloud"]: c["recurring"]["fired"] for c in clouds if c.get("recurring")}

    consumed: dict[str, set[str]] = defaultdict(set)
    lateness: list[float] = []
    for text in (logs / "demo.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(text) if text.startswith("{") else {}
        if record.get("event") == "consumed":
            assert record["destination"] in ENDPOINTS and record["due_at"]
            kind = "recurring" if record["destination"] == "digest" else "mix"
            consumed[f"{record['cloud']}-{kind}"].add(record["message_id"])
            lateness.append(record["consumer_lateness_s"])
    assert {cloud: len(consumed[f"{cloud}-mix"]) for cloud in delivered} == delivered
    assert len(consumed["azure-recurring"]) == fired["azure"] > 0
    assert len(consumed["aws-recurring"]) in (0, fired["aws"])
    assert lateness and min(lateness) >= 0

    report = build_report(spark, str(logs), str(tmp_path / "report"))
    rows = report.tables["consumer_lateness_by_endpoint"]
    assert {r["endpoint"] for r in rows} == set(ENDPOINTS)
    assert sum(r["messages"] for r in rows) == sum(len(ids) for ids in consumed.values())
    assert all(0 <= r["p50_s"] <= r["max_s"] for r in rows)
    assert not any("No `consumed` line" in note for note in report.notes)

    # Worth reading: every delivered message of the mix has its band (the logs carry the delays; only poison and
    # cancelled messages, never delivered, may lack one), both clouds named, bars per minute, one page. A schedule's
    # occurrences carry no delay, so they are the one "unknown" band (a gap of the report: #35).
    bands = [r["band"] for name in ("lateness_by_band", "consumer_lateness_by_band") for r in report.tables[name]]
    assert [b for b in bands if b != "unknown"] and (fired or "unknown" not in bands), bands
    assert "Clouds named in these logs: aws, azure." in report.notes
    assert sum(r["dispatched"] for r in report.tables["throughput"]) > 0
    out = tmp_path / "report"
    assert {Path(c).name for c in report.charts} >= {"lateness_by_band.png", "throughput.png", "hops.png"}
    page = (out / "summary.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == len(report.charts) and "aws, azure" in page
