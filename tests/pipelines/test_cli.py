"""The ``migrate`` and ``report`` commands of the main CLI."""

from __future__ import annotations

import json
import os
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


# -- the pipelines' own command line (argparse; no typer, no rich) ---------------------------------------


def test_the_pipelines_command_line_runs_without_typer_or_rich(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("id,due\n", encoding="utf-8")  # the source exists: the --cutoff check speaks
    code = (
        "import runpy, sys\n"
        "sys.modules.update(typer=None, rich=None)  # as if neither were installed\n"
        "sys.argv = ['x', 'migrate', 'run', '-s', 'in.csv', '-t', 'sqlite:x.db', '--cutoff', 'soon']\n"
        "runpy.run_module('delayed_delivery.pipelines', run_name='__main__')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr == "error: --cutoff 'soon' is not an ISO-8601 time (e.g. 2026-03-01T00:00:00Z)\n"
    check = "import sys, delayed_delivery.pipelines.cli; print(sorted({'typer', 'rich', 'pyspark'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True).stdout == "[]\n"


@pytest.mark.spark
def test_preview_run_abort_and_report_through_the_pipelines_command_line(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayed_delivery.pipelines.cli import main

    export = write_legacy_export(tmp_path / "src", LegacyShape.DELAYED_STORE, 60, fmt="json", malformed_every=20)
    out, db = str(tmp_path / "out"), tmp_path / "s.db"
    main(["migrate", "preview", "-s", export.path, "-o", out, "--source-endpoint", "Legacy"])
    printed = capsys.readouterr().out
    assert "to migrate: 57" in printed and "rejected: 3" in printed
    main(["migrate", "run", "-s", export.path, "-t", f"sqlite:{db}", "-o", out, "--run-id", "r1", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows_written"], summary["rejected"], summary["state"]) == (57, 3, "completed")
    main(["migrate", "abort", "--run-id", "r1", "-o", out])
    assert "removed 57 message(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["migrate", "abort", "--run-id", "zz", "-o", out])
    assert exc.value.code == 2 and "error: no run 'zz'" in capsys.readouterr().err
    write_logs(tmp_path / "logs" / "x.jsonl", 12, seed=3)
    main(["report", "-l", str(tmp_path / "logs"), "-o", str(tmp_path / "rep")])
    assert "# Delayed delivery report" in capsys.readouterr().out
    assert (tmp_path / "rep" / "summary.md").exists()


@pytest.mark.spark
def test_spark_submit_runs_the_pipelines_entry_file(tmp_path: Path) -> None:
    import delayed_delivery.pipelines as pipelines

    spark_submit = Path(sys.executable).parent / "spark-submit"
    if not spark_submit.exists():  # pragma: no cover - depends on the install
        pytest.fail(f"PySpark's spark-submit is not next to {sys.executable}")
    export = write_legacy_export(tmp_path / "src", LegacyShape.TIMEOUT_MANAGER, 40)
    entry = Path(pipelines.__file__).parent / "__main__.py"
    argv = [str(spark_submit), "--master", "local[1]", str(entry), "migrate", "run", "-s", export.path,
            "-t", f"sqlite:{tmp_path / 's.db'}", "-o", str(tmp_path / "out"), "--batches", "2", "--json"]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout[res.stdout.index("{") :])
    assert (summary["rows_written"], summary["state"]) == (40, "completed")
