"""A migration into SQS killed mid-run (SIGKILL of driver, JVM and workers) and resumed: duplicates are bounded.

Standard queues do not deduplicate, so the job checkpoints every acknowledged send of 10 in the ledger; the
resumed run starts after the last checkpoint and resends at most the 10 messages in flight when the run died
(one task here: ``local[1]``). The ``-delay.fifo`` route deduplicates on ids that depend only on the messages
sent, so after the resume it holds exactly what a clean run of the same rows leaves there.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.pipelines.ledger import BatchState, Ledger, RunManifest
from delayed_delivery.pipelines.migrate import MigrationOptions, run_migration
from tests.fixtures.moto import queue_depth
from tests.fixtures.processes import kill_tree

pytestmark = [pytest.mark.spark, pytest.mark.moto]

ROWS = 1_000


def _export(path: Path, destination: str, now: dt.datetime) -> Path:
    path.mkdir(parents=True)
    with (path / "x.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["Id", "Destination", "SagaId", "State", "Time", "Headers", "Endpoint"])
        w.writeheader()
        for i in range(ROWS):  # even rows: native DelaySeconds (≤ 900 s); odd rows: the -delay.fifo route
            due = now + (timedelta(minutes=10) if i % 2 == 0 else timedelta(days=3))
            w.writerow({"Id": f"m-{i:05d}", "Destination": destination, "SagaId": "",
                        "State": base64.b64encode(b"b%d" % i).decode(), "Time": due.isoformat(),
                        "Headers": json.dumps({"n": str(i)}), "Endpoint": "Sales"})  # fmt: skip
    return path


def _count(sqs: Any, name: str) -> int:
    return queue_depth(sqs, sqs.get_queue_url(QueueName=name)["QueueUrl"])


def test_sqs_run_killed_mid_batch_resends_at_most_one_send_of_ten(
    spark: Any, sqs: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    from delayed_delivery.aws.queues import ensure_endpoint

    ensure_endpoint(sqs, "orders")
    ensure_endpoint(sqs, "clean")
    now = dt.datetime.now(dt.UTC)
    source = _export(tmp_path / "src", "orders", now)
    out = tmp_path / "out"
    target = f"sqs:us-east-1?endpoint_url={moto_endpoint}"
    opts = MigrationOptions(source=str(source), target=target, batches=1)
    run_id = opts.default_run_id()
    argv = [sys.executable, "-m", "delayed_delivery.pipelines.migrate", "run", "--source", str(source),
            "--target", target, "--output", str(out), "--batches", "1", "--master", "local[1]"]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ledger = Ledger(RunManifest.folder(out, run_id))
    deadline = time.monotonic() + 180
    try:
        while int(str((ledger.entry(0) or {}).get("sent_rows", 0))) < 200:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the child never sent 200 rows"
            time.sleep(0.01)
    finally:
        kill_tree(proc.pid)  # driver, JVM and the PySpark daemon's own process group
        proc.wait(30)
    killed = ledger.entry(0) or {}
    assert killed["state"] == BatchState.STARTED.value, "the run must be killed part-way"
    checkpointed = int(str(killed["sent_rows"]))
    assert checkpointed % 10 == 0 and checkpointed < ROWS
    native_before = _count(sqs, "orders")
    assert checkpointed // 2 <= native_before <= checkpointed // 2 + 5  # at most one unrecorded send of 10

    summary = run_migration(spark, opts, str(out), run_id=run_id, now=now)

    assert summary.state == "completed" and summary.rows_written == ROWS and summary.refused == 0
    resent = _count(sqs, "orders") - ROWS // 2  # native messages delivered twice
    assert 0 <= resent <= 5, f"{resent} native duplicates: more than the one send of 10 in flight"
    assert resent == native_before - checkpointed // 2
    # The FIFO route: a clean run of the same rows (another destination) leaves the same number of messages.
    clean = _export(tmp_path / "clean", "clean", now)
    run_migration(spark, MigrationOptions(source=str(clean), target=target, batches=1), str(tmp_path / "o2"), now=now)
    assert _count(sqs, "orders-delay.fifo") == _count(sqs, "clean-delay.fifo") > 0
    assert _count(sqs, "clean") == ROWS // 2
