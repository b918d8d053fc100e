from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from delayed_delivery import ConfigurationError, DelayedDeliverySettings
from delayed_delivery.app.cli import app
from delayed_delivery.app.entry import CLI_HINT
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig

runner = CliRunner()


def test_defaults_follow_nservicebus() -> None:
    s = DelayedDeliverySettings()
    assert s.number_of_retries == 0
    assert s.time_to_trigger_store_circuit_breaker == 30
    assert s.time_to_trigger_fetch_circuit_breaker == 30
    assert s.time_to_trigger_dispatch_circuit_breaker == 30
    assert s.maximum_recovery_failures_per_second == 1
    assert SqsSettings().max_native_delay == 900


def test_from_env_parses_types() -> None:
    env = {
        "DELAYED_DELIVERY_NUMBER_OF_RETRIES": "3",
        "DELAYED_DELIVERY_ENABLED": "false",
        "DELAYED_DELIVERY_MAX_NATIVE_DELAY": "2",
        "DELAYED_DELIVERY_ERROR_QUEUE": "poison",
        "DELAYED_DELIVERY_MAX_IDLE_SLEEP": " 0.5 ",
        "UNRELATED": "x",
    }
    s = DelayedDeliverySettings.from_env(env)
    assert (s.number_of_retries, s.enabled, s.error_queue, s.max_idle_sleep) == (3, False, "poison", 0.5)
    assert SqsSettings.from_env(env).max_native_delay == 2


def test_a_blank_variable_counts_as_unset() -> None:
    env = {"DELAYED_DELIVERY_BATCH_SIZE": " ", "DELAYED_DELIVERY_ERROR_QUEUE": "", "DELAYED_DELIVERY_PACK_BYTES": ""}
    assert DelayedDeliverySettings.from_env(env) == DelayedDeliverySettings()
    assert SqsSettings.from_env(env) == SqsSettings()


def test_each_owner_reads_only_its_own_settings() -> None:
    core = {f.name for f in fields(DelayedDeliverySettings)}
    sqs = {f.name for f in fields(SqsSettings)}
    tier = {f.name for f in fields(TierSettings)}
    assert not (core & sqs) and not (core & tier) and not (sqs & tier)
    assert {"max_native_delay", "fifo_queue_delay", "max_park_seconds", "long_delay_route", "pack_bytes"} <= sqs
    azure = {f.name for f in fields(AzureDelayedDeliveryConfig)}
    assert not azure & (sqs | tier), "Azure carries no SQS or tier settings"


@pytest.mark.parametrize(
    ("settings", "name", "value"),
    [
        (DelayedDeliverySettings, "BATCH_SIZE", "0"),
        (DelayedDeliverySettings, "RETRY_BACKOFF", "-1"),
        (DelayedDeliverySettings, "NUMBER_OF_RETRIES", "1.5"),
        (SqsSettings, "MAX_PARK_SECONDS", "43200"),
        (SqsSettings, "LONG_DELAY_ROUTE", "s3"),
        (SqsSettings, "BUCKET_INGEST_QUEUE", "no/such"),
        (SqsSettings, "PACK_BYTES", "64k"),
        (TierSettings, "BUCKET_FINE_SECONDS", "7"),
        (TierSettings, "BUCKET_SEND_PHASE_MS", "2000"),
    ],
)
def test_an_error_names_the_variable_and_the_value(settings: Any, name: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        settings.from_env({f"DELAYED_DELIVERY_{name}": value})
    message = str(raised.value)
    assert f"DELAYED_DELIVERY_{name}" in message, message
    assert value in message, message


@pytest.mark.parametrize(
    ("name", "value"),
    [("NUMBER_OF_RETRIES", "three"), ("ENABLED", "maybe"), ("BATCH_SIZE", "0"), ("MAX_IDLE_SLEEP", "nan")],
)
def test_bad_env_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=name if name in ("NUMBER_OF_RETRIES", "ENABLED") else name.lower()):
        DelayedDeliverySettings.from_env({f"DELAYED_DELIVERY_{name}": value})


def test_negative_nan_bool_and_fractional_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="retry_backoff"):
        DelayedDeliverySettings(retry_backoff=-1)
    with pytest.raises(ConfigurationError, match="failure_delay"):
        DelayedDeliverySettings(failure_delay=math.nan)
    with pytest.raises(ConfigurationError, match="batch_size"):
        DelayedDeliverySettings(batch_size=True)
    with pytest.raises(ConfigurationError, match="number_of_retries"):
        DelayedDeliverySettings(number_of_retries=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="park_max_in_flight"):
        SqsSettings(park_max_in_flight=-1)


@pytest.mark.parametrize("settings", [DelayedDeliverySettings, SqsSettings, TierSettings])
def test_reference_documents_every_setting(settings: Any) -> None:
    rows = list(settings.reference())
    assert {r[0] for r in rows} == {f.name for f in dataclasses.fields(settings)}
    assert all(r[3] for r in rows)


def test_cli_version_and_help() -> None:
    assert runner.invoke(app, ["--version"]).output.startswith("delayed-delivery 0.1.0")
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "cost" in result.output and "demo" in result.output


def _entry(prelude: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the console-script entry point in a fresh interpreter after ``prelude``."""
    code = f"import sys; {prelude}; sys.argv = ['delayed-delivery', *{list(args)!r}]; "
    code += "from delayed_delivery.app.entry import main; main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("library", ["typer", "rich"])
def test_entry_point_without_the_cli_extra_prints_the_install_hint(library: str) -> None:
    done = _entry(f"sys.modules[{library!r}] = None", "--help")  # what an install without the cli extra looks like
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["error: " + CLI_HINT]
    assert 'pip install "delayed-delivery[cli]"' in done.stderr and "Traceback" not in done.stderr


def test_entry_point_runs_the_cli_and_the_script_points_at_it() -> None:
    done = _entry("pass", "--version")
    assert done.returncode == 0 and done.stdout.startswith("delayed-delivery 0.1.0"), done.stderr
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["delayed-delivery"] == "delayed_delivery.app.entry:main"
    extras = pyproject["project"]["optional-dependencies"]
    assert not any(d.startswith(("typer", "rich")) for d in pyproject["project"]["dependencies"])
    assert {d.split(">")[0] for d in extras["cli"]} == {"typer", "rich"}
    assert any("cli" in d for d in extras["dev"] if d.startswith("delayed-delivery["))


def test_command_groups_follow_their_extras_and_a_broken_one_fails_loudly() -> None:
    done = _entry("sys.modules['boto3'] = None", "aws", "--help")  # the aws extra is not installed: listed, says so
    assert done.returncode == 2 and 'needs the aws extra: pip install "delayed-delivery[cli,aws]"' in done.stderr
    assert _entry("sys.modules['boto3'] = None", "azure", "--help").returncode == 0
    broken = _entry("sys.modules['delayed_delivery.aws.queues'] = None", "--help")  # installed, but broken
    assert broken.returncode == 1 and "ModuleNotFoundError" in broken.stderr, broken.stderr


def test_cli_cost_json_matches_the_nservicebus_formula() -> None:
    result = runner.invoke(app, ["cost", "--delay", "365d", "--messages", "1", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["seed_formula_usd_per_message"] == pytest.approx(0.03504)
    assert data["our_plan_fifo_cycles"] == 35_039


def test_cli_bad_duration_is_one_line_and_exit_2() -> None:
    result = runner.invoke(app, ["cost", "--delay", "soon"])
    assert result.exit_code == 2
    assert "cannot read duration" in result.output
    assert "Traceback" not in result.output


def test_cli_demo_loses_nothing() -> None:
    result = runner.invoke(app, ["demo", "--core", "--messages", "40", "--span", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["lost"] == 0 and data["duplicates"] == 0
    assert data["delivered"] == 40 and data["error_queue"] == 4


@pytest.mark.parametrize(
    ("marker", "settings", "module"),
    [
        ("settings", DelayedDeliverySettings, "delayed_delivery.settings"),
        ("sqs-settings", SqsSettings, "delayed_delivery.aws.settings"),
        ("tier-settings", TierSettings, "delayed_delivery.aws.tier.config"),
    ],
)
def test_readme_configuration_tables_match_the_settings(marker: str, settings: Any, module: str) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index(f"<!-- {marker}:start")
    assert f"`python -m {module}`" in readme[start : readme.index("\n", start)]
    start = readme.index("\n", start) + 1
    end = readme.index(f"<!-- {marker}:end -->")
    assert readme[start:end].strip() == settings.markdown_reference(), (
        f"README configuration table is stale: regenerate it with `python -m {module}`"
    )
    printed = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=60, check=True)
    assert printed.stdout.strip() == settings.markdown_reference()
