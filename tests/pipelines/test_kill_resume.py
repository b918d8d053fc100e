"""A migration killed with SIGKILL (driver, JVM and workers) resumes without re-sending completed batches."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.pipelines.ledger import BatchState, Ledger, RunManifest
from delayed_delivery.pipelines.migrate import MigrationOptions, run_migration
from delayed_delivery.pipelines.schema import LegacyShape
from delayed_delivery.pipelines.synthetic import write_legacy_export
from tests.fixtures.processes import kill_tree

pytestmark = pytest.mark.spark


def test_sigkilled_run_resumes_and_finishes_without_resending_completed_batches(spark: Any, tmp_path: Path) -> None:
    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 12_000, seed=11)
    db, out = tmp_path / "s.db", tmp_path / "out"
    opts = MigrationOptions(source=export.path, target=f"sqlite:{db}", batches=8)
    run_id = opts.default_run_id()
    argv = [sys.executable, "-m", "delayed_delivery.pipelines.migrate", "run", "--source", export.path,
            "--target", f"sqlite:{db}", "--output", str(out), "--batches", "8", "--batch-size", "10",
            "--master", "local[1]"]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ledger = Ledger(RunManifest.folder(out, run_id))
    deadline = time.monotonic() + 180
    try:
        while not ledger.in_state(BatchState.COMPLETED):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the child never completed a batch"
            time.sleep(0.05)
    finally:
        kill_tree(proc.pid)  # driver, JVM and the PySpark daemon's own process group
        proc.wait(30)
    before = ledger.entries()
    done = {b for b, e in before.items() if e["state"] == "completed"}
    assert 0 < len(done) < 8, "the run must be killed part-way"
    with sqlite3.connect(db) as conn:
        written_before = conn.execute("SELECT COUNT(*) FROM delayed_messages").fetchone()[0]

    summary = run_migration(spark, opts, str(out), run_id=run_id)

    assert summary.state == "completed"
    assert summary.batches_skipped == len(done)
    after = ledger.entries()
    assert all(after[b]["at"] == before[b]["at"] for b in done)  # completed batches were not touched again
    assert summary.rows_written + sum(int(before[b]["rows"]) for b in done) == 12_000
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM delayed_messages").fetchone()[0] == 12_000 >= written_before
    assert json.loads((RunManifest.folder(out, run_id) / "run.json").read_text())["state"] == "completed"
