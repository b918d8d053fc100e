"""A missing --logs or --source, or an --output that is a file, is one line before Spark starts (no 12 s JVM first).

The commands run in a fresh interpreter where ``pyspark.sql`` cannot be imported: had a command started Spark before
checking its paths, it would fail with the PySpark error instead of the path's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUN = """
import sys
sys.modules["pyspark.sql"] = None  # importing it (starting Spark) fails
entry, args = sys.argv[1], sys.argv[2:]
if entry == "delayed-delivery":
    from delayed_delivery.app.entry import main
    sys.argv = ["delayed-delivery", *args]
    main()
else:
    from delayed_delivery.pipelines.cli import main
    main(args)
"""


def _run(entry: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN, entry, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("entry", ["delayed-delivery", "pipelines"])
def test_missing_paths_are_refused_before_spark_starts(entry: str, tmp_path: Path) -> None:
    a_file = tmp_path / "report.txt"
    a_file.write_text("not a folder")
    cases = [
        (["report", "--logs", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out")], "does not exist"),
        (["report", "--logs", str(tmp_path), "--output", str(a_file)], "is a file"),
        (["migrate", "run", "--source", str(tmp_path / "no-export"), "--target", "sqlite:d.db"], "does not exist"),
        (["migrate", "preview", "--source", str(tmp_path / "no-export")], "does not exist"),
    ]
    for args, says in cases:
        done = _run(entry, *args)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], (args, done.stderr)
        assert "PySpark" not in done.stderr and "Traceback" not in done.stderr, done.stderr
