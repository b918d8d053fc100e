"""The tzdata wheel ships in every deploy bundle at the version uv.lock pins, so both clouds use one IANA release."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from delayed_delivery.schedules.zones import tz_database
from infra.aws.packaging import REPO_ROOT, prepare_function_asset

LOCKED = re.search(r'name = "tzdata"\nversion = "([^"]+)"', (REPO_ROOT / "uv.lock").read_text()).group(1)  # type: ignore[union-attr]
AZURE_REQUIREMENTS = REPO_ROOT / "shared" / "delayed_delivery" / "azure" / "app_files" / "requirements.txt"


def test_tzdata_is_a_runtime_dependency_pinned_for_the_function_app() -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    dependencies = pyproject.split("[project.optional-dependencies]")[0]
    assert '"tzdata>=' in dependencies
    assert re.search(rf"^tzdata=={re.escape(LOCKED)}$", AZURE_REQUIREMENTS.read_text(), re.MULTILINE)


def test_a_lambda_asset_with_schedules_carries_tzdata_and_reads_zones_from_it(tmp_path: Path) -> None:
    asset = prepare_function_asset(["delayed_delivery.schedules.recurrence.Recurrence"], tmp_path / "asset")
    assert (asset / "tzdata" / "zoneinfo" / "Europe" / "Berlin").is_file()
    script = (
        "import json\n"
        "from delayed_delivery.schedules.recurrence import Recurrence\n"
        "from delayed_delivery.schedules.zones import tz_database\n"
        "import datetime as d\n"
        "r = Recurrence('30 2 * * *', 'Europe/Berlin')\n"
        "f = next(r.fires(d.datetime(2027, 3, 28, tzinfo=d.UTC)))\n"
        "print(json.dumps([tz_database().source, tz_database().version, f.nominal.isoformat()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = [{str(asset)!r}]\n{script}"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
    )  # fmt: skip
    source, version, first = json.loads(done.stdout)
    assert (source, version) == ("tzdata wheel", tz_database().version)
    assert first == "2027-03-28T01:30:00+00:00"  # 02:30 does not exist: shifted to 03:30 CEST
