"""The ``migrate`` and ``report`` commands of the main CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from delayed_delivery.app import cli
from delayed_delivery.pipelines.schema import LegacyShape
from delayed_delivery.pipelines.synthetic import write_legacy_export, write_logs

runner = CliRunner()


def test_importing_the_cli_does_not_start_or_import_spark() -> None:
    code = "import sys, delayed_delivery.app.cli as c; assert 'pyspark' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "ok\n"


@pytest.mark.spark
def test_preview_run_and_abort_through_the_cli(spark: Any, tmp_path: Path) -> None:
    export = write_legacy_export(tmp_path / "src", LegacyShape.DELAYED_STORE, 60, fmt="json", malformed_every=20)
    out, db = str(tmp_path / "out"), tmp_path / "s.db"
    res = runner.invoke(cli.app, ["migrate", "preview", "-s", export.path, "-o", out, "--source-endpoint", "Legacy"])
    assert res.exit_code == 0, res.output
    assert "to migrate: 57" in res.output and "rejected: 3" in res.output
    assert (Path(out) / "preview" / "due_histogram.png").exists()

    args = ["migrate", "run", "-s", export.path, "-t", f"sqlite:{db}", "-o", out, "--run-id", "r1", "--json"]
    res = runner.invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert (summary["rows_written"], summary["rejected"], summary["state"]) == (57, 3, "completed")

    res = runner.invoke(cli.app, ["migrate", "abort", "--run-id", "r1", "-o", out])
    assert res.exit_code == 0, res.output
    assert "removed 57 message(s)" in res.output


@pytest.mark.spark
def test_user_mistakes_exit_2_with_one_line(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 5)
    for argv, message in (
        (["migrate", "run", "-s", export.path, "-t", "ftp:x"], "unknown target 'ftp:x'"),
        (["migrate", "run", "-s", export.path, "-t", "sqlite:x.db", "--cutoff", "soon"], "is not an ISO-8601 time"),
        (["migrate", "abort", "--run-id", "zz", "-o", str(tmp_path)], "no run 'zz'"),
    ):
        monkeypatch.setattr(sys, "argv", ["delayed-delivery", *argv])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.spark
def test_report_command_writes_the_summary(spark: Any, tmp_path: Path) -> None:
    write_logs(tmp_path / "logs" / "x.jsonl", 12, seed=3)
    res = runner.invoke(cli.app, ["report", "-l", str(tmp_path / "logs"), "-o", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert "# Delayed delivery report" in res.output
    assert (tmp_path / "rep" / "summary.md").exists()
